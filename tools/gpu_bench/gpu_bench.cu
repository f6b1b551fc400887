// masskv_gpu_bench: checks every CUDA decode kernel against the CPU f64 reference on a grid of
// shapes, then benchmarks dense and sparse decode against a read-only bandwidth kernel.
// Plain printf only: the GPU machine has none of the Debian C++ libraries.
//   masskv_gpu_bench check            grid check: decode, select-selftest, select (exit 1 on any
//                                     failure)
//   masskv_gpu_bench decode-check     the decode part of check alone (softmax and entmax)
//   masskv_gpu_bench profile          a few decode launches of one shape, for ncu
//   masskv_gpu_bench profile-select   Quest scoring, top-k and hierarchical selection alone at
//                                     128K and 1M (plain and graph times)
//   masskv_gpu_bench profile-hier [N] N hierarchical selections per profile-select shape, for ncu
//   masskv_gpu_bench profile-gauss    hierarchical selection with and without Gaussian-tau, for ncu
//   masskv_gpu_bench profile-phases   a sparse step's kernels phase by phase (timer stamps)
//   masskv_gpu_bench select-selftest  GPU Quest selection: ties, edges, errors, graphs, end to end
//   masskv_gpu_bench select-check     GPU Quest selection vs the CPU selector on ~90 shapes
//   masskv_gpu_bench select-compact-check  8-bit and hierarchical GPU selection vs their CPU
//                                     references, bit for bit (also part of check)
//   masskv_gpu_bench bench OUT.json   benchmark (B=1, Hq=32, Hkv=8, d=128, bf16, page 16)
//   masskv_gpu_bench prefill-check    CUDA prefill (dense, block lists, GPU indexer) vs the f64
//                                     reference (also part of check)
//   masskv_gpu_bench prefill-bench OUT.json  prefill at 8K/32K/128K (B=1, Hq=32, Hkv=8, d=128)
//   masskv_gpu_bench append-check     cuda::append vs the CPU cache + bound store, bit for bit
//                                     (also part of check), and its time per step
//   masskv_gpu_bench decode-token-check  decode over token selections vs attn::decode (f64 ref)
//   masskv_gpu_bench two-stage-check  two-stage GPU selection vs select::run_selector, identical
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "append_check.hpp"
#include "extend_check.hpp"
#include "bench_util.cuh"
#include "hier_case.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "phases.hpp"
#include "prefill_bench.hpp"
#include "select/kept.hpp"
#include "two_stage_check.hpp"

using namespace masskv;

namespace {

// ---- check ---------------------------------------------------------------------------------
struct Case {
  int len, group, d, batch, page;
  DType dtype;
  kv::Layout layout;
  int num_kv_heads = 2;
};

// Host copy of one case's inputs, its selection and the f64 references.
struct CaseData {
  Case c;
  int pool_pages = 0;
  std::vector<std::uint16_t> k, v;
  std::vector<float> q;
  std::vector<std::int32_t> indptr, indices, last;
  SelectionStorage sel;
  std::vector<double> ref_dense, lse_dense, ref_sparse, lse_sparse;
  // Entmax with alpha and score scale (0: 1/sqrt(d)); tau on z = (alpha-1) s.
  double alpha = 1.5;
  float ent_scale = 0;
  std::vector<double> ent_dense, tau_dense, ent_sparse, tau_sparse;
  kv::PagedKVView view;  // host pointers
};

kv::PagedKVView make_view(const Case& c, int pool_pages, const void* k, const void* v) {
  kv::PagedKVView view;
  view.k = k;
  view.v = v;
  view.dtype = c.dtype;
  view.num_pages = pool_pages;
  view.num_kv_heads = c.num_kv_heads;
  view.page_size = c.page;
  view.head_dim = c.d;
  view.set_layout(c.layout);
  return view;
}

void build_case(CaseData& cd, std::uint64_t seed) {
  const Case& c = cd.c;
  Rng rng(seed);
  std::vector<int> lens(c.batch);
  for (int b = 0; b < c.batch; ++b) lens[b] = b == 0 ? c.len : 1 + rng.below(c.len);
  cd.indptr.assign(1, 0);
  int total = 0;
  for (int b = 0; b < c.batch; ++b) {
    const int np = (lens[b] + c.page - 1) / c.page;
    total += np;
    cd.indptr.push_back(total);
    cd.last.push_back(lens[b] - (np - 1) * c.page);
  }
  cd.pool_pages = total + total / 4 + 3;  // spare pages: ids are a random injection
  std::vector<std::int32_t> perm(cd.pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = cd.pool_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  cd.indices.assign(perm.begin(), perm.begin() + total);

  const std::size_t elems = static_cast<std::size_t>(cd.pool_pages) * c.num_kv_heads * c.page * c.d;
  cd.k.resize(elems);
  cd.v.resize(elems);
  for (std::size_t i = 0; i < elems; ++i) {
    // Keys in [-2, 2], values in [-1, 1]: scores spread over several units (peaky softmax).
    const float kf = rng.sym(2.f), vf = rng.sym(1.f);
    if (c.dtype == DType::bf16) {
      cd.k[i] = f32_to_bf16(kf).bits;
      cd.v[i] = f32_to_bf16(vf).bits;
    } else {
      cd.k[i] = f32_to_f16(kf).bits;
      cd.v[i] = f32_to_f16(vf).bits;
    }
  }
  const int hq = c.num_kv_heads * c.group;
  cd.q.resize(static_cast<std::size_t>(c.batch) * hq * c.d);
  for (float& x : cd.q) x = rng.sym(3.f);
  // Entmax: alpha 1.5 / 2 (exact powers), 1.25 and 1.7 (general power); a small scale in a
  // fifth of the cases puts every z near 0, so tau <= 0 and the support is wide. In some cases
  // q head 0 of sequence 0 is zero: all its z are equal (tau = -n^(1-alpha), every token in
  // the support; long sequences overflow the tau kernel's shared memory).
  const double alphas[] = {1.5, 2.0, 1.25, 1.7};
  cd.alpha = alphas[(seed / 3 + seed) % 4];
  cd.ent_scale = seed % 5 == 2 ? 0.01f : 0.f;
  if (seed % 7 == 3) std::fill_n(cd.q.begin(), c.d, 0.f);

  // Selection: each page with probability 0.3, the last page always; in some cases one
  // (sequence, kv head) gets an empty selection (output 0, lse -inf).
  int max_sel = 0;
  std::vector<std::vector<std::int32_t>> lists(static_cast<std::size_t>(c.batch) * c.num_kv_heads);
  for (int b = 0; b < c.batch; ++b) {
    const int np = cd.indptr[b + 1] - cd.indptr[b];
    for (int h = 0; h < c.num_kv_heads; ++h) {
      auto& l = lists[static_cast<std::size_t>(b) * c.num_kv_heads + h];
      const bool empty = (seed % 4 == 1) && b == 0 && h == 0;
      if (!empty) {
        for (int j = 0; j < np; ++j)
          if (j == np - 1 || rng.uniform() < 0.3) l.push_back(j);
      }
      max_sel = std::max(max_sel, static_cast<int>(l.size()));
    }
  }
  cd.sel.reset(SelectionView::Unit::page, c.batch, c.num_kv_heads, max_sel + 1);
  for (int b = 0; b < c.batch; ++b)
    for (int h = 0; h < c.num_kv_heads; ++h) {
      const auto& l = lists[static_cast<std::size_t>(b) * c.num_kv_heads + h];
      std::copy(l.begin(), l.end(), cd.sel.slots(b, h).begin());
      cd.sel.count[static_cast<std::size_t>(b) * c.num_kv_heads + h] = static_cast<int>(l.size());
    }

  cd.view = make_view(c, cd.pool_pages, cd.k.data(), cd.v.data());
  cd.view.table = {cd.indptr, cd.indices, cd.last};
  cd.view.validate();  // the host validates the table where it is built

  std::vector<float> dummy_out(cd.q.size());
  attn::DecodeArgs a;
  a.q = View3<const float>::contiguous(cd.q.data(), c.batch, hq, c.d);
  a.cache = cd.view;
  a.out = View3<float>::contiguous(dummy_out.data(), c.batch, hq, c.d);
  const std::size_t heads = static_cast<std::size_t>(c.batch) * hq;
  cd.ref_dense.resize(heads * c.d);
  cd.lse_dense.resize(heads);
  attn::decode_reference(a, cd.ref_dense, cd.lse_dense);
  const SelectionView sv = cd.sel.view();
  a.selection = &sv;
  cd.ref_sparse.resize(heads * c.d);
  cd.lse_sparse.resize(heads);
  attn::decode_reference(a, cd.ref_sparse, cd.lse_sparse);

  a.mapping = Mapping::entmax(cd.alpha);
  a.scale = cd.ent_scale;
  cd.ent_sparse.resize(heads * c.d);
  cd.tau_sparse.resize(heads);
  attn::decode_reference(a, cd.ent_sparse, cd.tau_sparse);
  a.selection = nullptr;
  cd.ent_dense.resize(heads * c.d);
  cd.tau_dense.resize(heads);
  attn::decode_reference(a, cd.ent_dense, cd.tau_dense);
}

struct Errors {
  double o = 0, lse = 0;
  bool ok = true;
  std::string why;
};

Errors compare(const std::vector<float>& o, const std::vector<float>& lse,
               const std::vector<double>& ro, const std::vector<double>& rl) {
  Errors e;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < ro.size(); ++i) {
    if (!std::isfinite(o[i])) {
      e.ok = false;
      e.why = "non-finite output (unwritten or NaN)";
      return e;
    }
    num = std::max(num, std::fabs(o[i] - ro[i]));
    den = std::max(den, std::fabs(ro[i]));
  }
  e.o = den > 0 ? num / den : num;
  for (std::size_t i = 0; i < rl.size(); ++i) {
    if (std::isnan(rl[i])) {  // entmax over nothing: tau NaN
      if (!std::isnan(lse[i])) {
        e.ok = false;
        e.why = "empty selection must give tau = NaN";
        return e;
      }
      continue;
    }
    if (std::isinf(rl[i]) && rl[i] < 0) {
      if (!(std::isinf(lse[i]) && lse[i] < 0)) {
        e.ok = false;
        e.why = "empty selection must give lse = -inf";
        return e;
      }
      continue;
    }
    if (!std::isfinite(lse[i])) {
      e.ok = false;
      e.why = "non-finite lse";
      return e;
    }
    e.lse = std::max(e.lse, std::fabs(lse[i] - rl[i]) / std::max(1.0, std::fabs(rl[i])));
  }
  return e;
}

constexpr double kTolO = 1e-3;    // ||o - ref||_inf / ||ref||_inf (bf16/f16 KV, f32 accumulation)
constexpr double kTolLse = 1e-4;  // |lse - ref| / max(1, |ref|); entmax: the same for tau

struct GpuCase {
  DevBuf<std::uint16_t> k, v;
  DevBuf<float> q, out, lse;
  DevBuf<std::int32_t> indptr, indices, last, sel_ids, sel_count;
  kv::PagedKVView view;
  SelectionView sel;
  attn::DecodeArgs args;
};

void setup_gpu(const CaseData& cd, GpuCase& g) {
  const Case& c = cd.c;
  g.k = to_device(cd.k);
  g.v = to_device(cd.v);
  g.q = to_device(cd.q);
  g.out = DevBuf<float>(cd.q.size());
  g.lse = DevBuf<float>(cd.lse_dense.size());
  g.indptr = to_device(cd.indptr);
  g.indices = to_device(cd.indices);
  g.last = to_device(cd.last);
  g.sel_ids = to_device(cd.sel.ids);
  g.sel_count = to_device(cd.sel.count);
  g.view = make_view(c, cd.pool_pages, g.k.p, g.v.p);
  g.view.table = {{g.indptr.p, g.indptr.n}, {g.indices.p, g.indices.n}, {g.last.p, g.last.n}};
  g.sel = {SelectionView::Unit::page,
           c.batch,
           c.num_kv_heads,
           cd.sel.max_per_head,
           {g.sel_ids.p, g.sel_ids.n},
           {g.sel_count.p, g.sel_count.n}};
  const int hq = c.num_kv_heads * c.group;
  g.args.q = View3<const float>::contiguous(g.q.p, c.batch, hq, c.d);
  g.args.cache = g.view;
  g.args.out = View3<float>::contiguous(g.out.p, c.batch, hq, c.d);
  g.args.lse_or_tau = {g.lse.p, g.lse.n};
}

int max_pages(const CaseData& cd) {
  int m = 0;
  for (std::size_t b = 0; b + 1 < cd.indptr.size(); ++b)
    m = std::max(m, cd.indptr[b + 1] - cd.indptr[b]);
  return m;
}

Errors run_and_compare(GpuCase& g, const attn::DecodeArgs& args, cuda::DecodeLaunch launch,
                       const std::vector<double>& ro, const std::vector<double>& rl) {
  CK(cudaMemset(g.out.p, 0xff, g.out.n * sizeof(float)));  // poison: NaN everywhere
  CK(cudaMemset(g.lse.p, 0xff, g.lse.n * sizeof(float)));
  Errors e;
  try {
    cuda::decode(args, launch);
  } catch (const Error& err) {
    e.ok = false;
    e.why = std::string("threw: ") + err.what();
    return e;
  }
  CK(cudaDeviceSynchronize());
  return compare(g.out.download(), g.lse.download(), ro, rl);
}

// Expects decode to throw masskv::Error naming `argument`; then a clean run must pass again.
bool expect_throw(const char* name, const char* argument, const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    const bool ok = e.argument() == argument;
    std::printf("  error case %-34s -> Error(%s) \"%s\" %s\n", name, e.argument().c_str(), e.what(),
                ok ? "ok" : "WRONG ARGUMENT");
    return ok;
  }
  std::printf("  error case %-34s -> no exception: FAIL\n", name);
  return false;
}

// Whether the entmax cluster kernel serves a case's sparse decode at cluster size cs
// (mirrors launch_entmax_cluster: head_dim 64/128, at most 1024 selected tokens per CTA).
bool cluster_serves(const CaseData& cd, int cs) {
  const int per_rank = (std::max(cd.sel.max_per_head, 1) + cs - 1) / cs;
  return (cd.c.d == 64 || cd.c.d == 128) && per_rank * cd.c.page <= 1024;
}

int run_check() {
  std::vector<Case> cases;
  const int lens[] = {1, 17, 1000, 4097, 65537};
  int idx = 0;
  for (int len : lens)
    for (int group : {1, 4, 8})
      for (int d : {64, 128, 256})
        for (int batch : {1, 16}) {
          if (batch == 16 && len == 65537) continue;  // keep the f64 reference affordable
          for (DType dt : {DType::bf16, DType::f16})
            for (int page : {16, 64}) {
              const kv::Layout lay = (idx++ % 3 == 2) ? kv::Layout::NHD : kv::Layout::HND;
              cases.push_back({len, group, d, batch, page, dt, lay});
            }
        }
  // A few wider groups: 3 (padded to 4) and 16 (two head groups re-reading the pages).
  cases.push_back({1000, 3, 128, 16, 16, DType::bf16, kv::Layout::HND});
  cases.push_back({4097, 16, 128, 1, 16, DType::bf16, kv::Layout::HND});
  cases.push_back({1000, 16, 64, 16, 64, DType::f16, kv::Layout::NHD});
  // Pages shorter than a 16-token tile (the copies' per-row page lookup; pages >= 16 tokens
  // look the tile's page up once).
  cases.push_back({1000, 4, 128, 2, 8, DType::bf16, kv::Layout::HND});
  cases.push_back({4097, 8, 64, 1, 4, DType::f16, kv::Layout::NHD});
  cases.push_back({300, 4, 128, 3, 1, DType::bf16, kv::Layout::HND});

  std::printf(
      "check: %zu cases x {softmax (automatic kernel), softmax (SIMT kernel), entmax} x "
      "{dense auto-split, dense chunk_pages=3, sparse}\n",
      cases.size());
  std::printf(
      "tolerances: ||o-ref||inf/||ref||inf <= %.0e, |lse-ref|/max(1,|ref|) <= %.0e "
      "(reference: f64 on the same bf16/f16 KV values)\n",
      kTolO, kTolLse);
  int failures = 0;
  double worst_o[2] = {0, 0}, worst_lse[2] = {0, 0};  // [bf16, f16]
  double simt_o[2] = {0, 0}, simt_lse[2] = {0, 0};    // the SIMT softmax kernel
  struct {
    double worst_o[2] = {0, 0}, worst_tau[2] = {0, 0};
    long empty_heads = 0, nonpositive_tau = 0;
    long cluster_cases = 0;  // sparse entmax runs served by the cluster kernel
    double cluster_o = 0, cluster_tau = 0;
  } ent_stats;
  cuda::DecodeWorkspace ws;
  const std::size_t batch_n = 24;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t start = 0; start < cases.size(); start += batch_n) {
    const std::size_t end = std::min(cases.size(), start + batch_n);
    std::vector<CaseData> data(end - start);
#pragma omp parallel for schedule(dynamic, 1)
    for (std::size_t i = start; i < end; ++i) {
      data[i - start].c = cases[i];
      build_case(data[i - start], 1000 + i);
    }
    for (std::size_t i = start; i < end; ++i) {
      CaseData& cd = data[i - start];
      const Case& c = cd.c;
      GpuCase g;
      setup_gpu(cd, g);
      cuda::DecodeLaunch launch;
      launch.workspace = &ws;
      launch.max_pages_per_seq = max_pages(cd);
      // Softmax runs the automatic kernel (tensor cores for d 64/128) and the SIMT one.
      // Sparse entmax runs automatic (the cluster kernel where it serves the case in one wave),
      // the split-K path forced, and the cluster kernel forced (clusters of 8) where it serves.
      const char* names[11] = {
          "dense",         "dense/cp3",        "sparse",       "ent-dense",
          "ent-dense/cp3", "ent-sparse",       "simt-dense",   "simt-dense/cp3",
          "simt-sparse",   "ent-sparse/split", "ent-sparse/c8"};
      for (int variant = 0; variant < 11; ++variant) {
        attn::DecodeArgs args = g.args;
        cuda::DecodeLaunch l = launch;
        if (variant < 9 && variant % 3 == 1) l.chunk_pages = 3;
        const bool sparse = variant >= 9 || variant % 3 == 2;
        const bool ent = (variant >= 3 && variant < 6) || variant >= 9;
        if (variant >= 6 && variant < 9) l.kernel = cuda::DecodeLaunch::Kernel::simt;
        if (variant == 9) l.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::split;
        if (variant == 10) {  // the cluster kernel forced (clusters of 8), where it serves
          if (!cuda::hopper_paths() || !cluster_serves(cd, 8)) continue;
          l.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::cluster;
          l.cluster_size = 8;
          ++ent_stats.cluster_cases;
        }
        if (sparse) args.selection = &g.sel;
        if (ent) {
          args.mapping = Mapping::entmax(cd.alpha);
          args.scale = cd.ent_scale;
        }
        const std::vector<double>& ro =
            ent ? (sparse ? cd.ent_sparse : cd.ent_dense) : (sparse ? cd.ref_sparse : cd.ref_dense);
        const std::vector<double>& rl =
            ent ? (sparse ? cd.tau_sparse : cd.tau_dense) : (sparse ? cd.lse_sparse : cd.lse_dense);
        Errors e = run_and_compare(g, args, l, ro, rl);
        if (ent && e.ok) {
          // Deterministic: a rerun gives the same bits (output and tau).
          const std::vector<float> o1 = g.out.download(), t1 = g.lse.download();
          cuda::decode(args, l);
          CK(cudaDeviceSynchronize());
          const std::vector<float> o2 = g.out.download(), t2 = g.lse.download();
          if (std::memcmp(o1.data(), o2.data(), o1.size() * 4) != 0 ||
              std::memcmp(t1.data(), t2.data(), t1.size() * 4) != 0) {
            e.ok = false;
            e.why = "rerun differs";
          }
          for (std::size_t i = 0; i < rl.size(); ++i) {
            if (std::isnan(rl[i]))
              ++ent_stats.empty_heads;
            else if (rl[i] <= 0)
              ++ent_stats.nonpositive_tau;
          }
        }
        const int t = c.dtype == DType::bf16 ? 0 : 1;
        double* wo = ent ? ent_stats.worst_o : variant >= 6 ? simt_o : worst_o;
        double* wl = ent ? ent_stats.worst_tau : variant >= 6 ? simt_lse : worst_lse;
        if (ent && sparse && variant != 9) {
          ent_stats.cluster_o = std::max(ent_stats.cluster_o, e.o);
          ent_stats.cluster_tau = std::max(ent_stats.cluster_tau, e.lse);
        }
        wo[t] = std::max(wo[t], e.o);
        wl[t] = std::max(wl[t], e.lse);
        const bool pass = e.ok && e.o <= kTolO && e.lse <= kTolLse;
        if (!pass) {
          ++failures;
          std::printf(
              "FAIL %-13s len=%d G=%d d=%d B=%d page=%d %s %s alpha=%g scale=%g: o_err=%.3e "
              "lse/tau_err=%.3e %s\n",
              names[variant], c.len, c.group, c.d, c.batch, c.page,
              std::string(to_string(c.dtype)).c_str(), c.layout == kv::Layout::HND ? "HND" : "NHD",
              ent ? cd.alpha : 1.0, ent ? cd.ent_scale : 0.f, e.o, e.lse, e.why.c_str());
        }
      }
    }
    std::printf("  cases %zu..%zu done (%d failures so far)\n", start, end - 1, failures);
    std::fflush(stdout);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("worst errors: bf16 o %.3e lse %.3e | f16 o %.3e lse %.3e (%.1f s)\n", worst_o[0],
              worst_lse[0], worst_o[1], worst_lse[1], secs);
  std::printf("SIMT softmax kernel worst errors: bf16 o %.3e lse %.3e | f16 o %.3e lse %.3e\n",
              simt_o[0], simt_lse[0], simt_o[1], simt_lse[1]);
  std::printf(
      "entmax worst errors: bf16 o %.3e tau %.3e | f16 o %.3e tau %.3e; heads checked with "
      "tau <= 0: %ld, empty (tau NaN): %ld; every rerun bit-identical\n",
      ent_stats.worst_o[0], ent_stats.worst_tau[0], ent_stats.worst_o[1], ent_stats.worst_tau[1],
      ent_stats.nonpositive_tau, ent_stats.empty_heads);
  std::printf(
      "entmax sparse, automatic and the cluster kernel forced (%ld runs; none on the sm_80 "
      "paths): worst o %.3e tau %.3e\n",
      ent_stats.cluster_cases, ent_stats.cluster_o, ent_stats.cluster_tau);
  if (cuda::hopper_paths() && ent_stats.cluster_cases == 0) {
    std::printf("FAIL no case ran the entmax cluster kernel\n");
    ++failures;
  }
  if (ent_stats.nonpositive_tau == 0 || ent_stats.empty_heads == 0) {
    std::printf("FAIL entmax grid covers no tau <= 0 or no empty head\n");
    ++failures;
  }

  // Bad ids are reported through the device flag, never read; bad shapes on the host.
  {
    CaseData cd;
    cd.c = {1000, 4, 128, 2, 16, DType::bf16, kv::Layout::HND};
    build_case(cd, 7);
    GpuCase g;
    setup_gpu(cd, g);
    cuda::DecodeLaunch launch;
    launch.workspace = &ws;
    launch.max_pages_per_seq = max_pages(cd);
    bool ok = true;
    std::vector<std::int32_t> bad = cd.indices;
    bad[5] = cd.pool_pages;  // one past the pool
    g.indices.upload(bad);
    ok &= expect_throw("physical page id == num_pages", "indices",
                       [&] { cuda::decode(g.args, launch); });
    g.indices.upload(cd.indices);
    SelectionStorage s2 = cd.sel;
    s2.ids[0] = cd.indptr[1] - cd.indptr[0];  // logical page past the sequence
    g.sel_ids.upload(s2.ids);
    ok &= expect_throw("selected page >= num_pages(b)", "selection", [&] {
      attn::DecodeArgs a = g.args;
      a.selection = &g.sel;
      cuda::decode(a, launch);
    });
    g.sel_ids.upload(cd.sel.ids);
    ok &= expect_throw("max_pages_per_seq too small", "indptr", [&] {
      cuda::DecodeLaunch l = launch;
      l.max_pages_per_seq = max_pages(cd) - 1;
      cuda::decode(g.args, l);
    });
    ok &= expect_throw("q heads not a multiple of kv heads", "q", [&] {
      attn::DecodeArgs a = g.args;
      a.q.n1 = 3;
      cuda::decode(a, launch);
    });
    ok &= expect_throw("entmax alpha = 2.5", "alpha", [&] {
      attn::DecodeArgs a = g.args;
      a.mapping = Mapping::entmax(2.5);
      cuda::decode(a, launch);
    });
    g.indices.upload(bad);
    ok &= expect_throw("entmax: physical page id == num_pages", "indices", [&] {
      attn::DecodeArgs a = g.args;
      a.mapping = Mapping::entmax(1.5);
      cuda::decode(a, launch);
    });
    g.sel_ids.upload(s2.ids);  // the cluster kernel checks the ids it is given too
    if (cuda::hopper_paths())
      ok &= expect_throw("entmax cluster: selected page >= num_pages(b)", "selection", [&] {
        attn::DecodeArgs a = g.args;
        a.selection = &g.sel;
        a.mapping = Mapping::entmax(1.5);
        cuda::DecodeLaunch l = launch;
        l.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::cluster;
        cuda::decode(a, l);
      });
    g.sel_ids.upload(cd.sel.ids);
    // (Before sm_90 the forced cluster kernel fails on "entmax_kernel" for any case.)
    ok &= expect_throw("entmax cluster kernel forced on dense", "entmax_kernel", [&] {
      attn::DecodeArgs a = g.args;
      a.mapping = Mapping::entmax(1.5);
      cuda::DecodeLaunch l = launch;
      l.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::cluster;
      cuda::decode(a, l);
    });
    ok &= expect_throw("cluster_size = 4", "cluster_size", [&] {
      attn::DecodeArgs a = g.args;
      a.selection = &g.sel;
      a.mapping = Mapping::entmax(1.5);
      cuda::DecodeLaunch l = launch;
      l.cluster_size = 4;
      cuda::decode(a, l);
    });
    g.indices.upload(cd.indices);
    // After the errors the flag is clear and a good run passes.
    const Errors e = run_and_compare(g, g.args, launch, cd.ref_dense, cd.lse_dense);
    const bool clean = e.ok && e.o <= kTolO && e.lse <= kTolLse;
    std::printf("  clean run after errors: o_err=%.3e %s\n", e.o, clean ? "ok" : "FAIL");
    if (!ok || !clean) ++failures;
  }
  std::printf("CHECK %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures ? 1 : 0;
}

// ---- GPU Quest selection: check against the CPU selector, self-test -------------------------
// The CPU reference is select::quest_select on the same outward-rounded bf16 bound store
// (select::BoundStore). The GPU kernel evaluates the bound in the order of the CPU's AVX2
// kernel, so on an AVX2 host the bounds are expected to have the same bits and the lists to be
// identical. Tolerance, only where bounds differ in bits (a non-AVX2 host, MASSKV_ISA=scalar,
// or a compiler contracting differently): two f32 evaluations of the same bound in different
// summation orders differ by at most eps = scale * (2(2d+4) 2^-24 * max_i ||q_i||_1 * W +
// 8 * 2^-24 * |bound|) (the forward-error bound the CPU already adds as slack, page_bound.cpp);
// pages whose bounds lie within eps of the k-th (threshold) bound may then rank either way.
// So a list may differ from the CPU's only in candidate pages whose CPU bound is within eps of
// the threshold; counts, kept pages (sinks, window, last page) and everything else must match.

struct SelCase {
  int batch, hq, hkv, d, page, len;
  select::TopkPolicy pol;
  float scale = 0;
  int tie_mode = 0;  // 0 random, 1 four distinct page patterns (exact ties), 2 all pages equal
};

struct SelData {
  SelCase c;
  int pool_pages = 0;
  std::vector<std::int32_t> indptr, indices, last;
  std::vector<float> smin, smax, q;
  select::BoundStore store;
  int max_pages = 0;
};

void build_sel_case(SelData& sd, std::uint64_t seed) {
  const SelCase& c = sd.c;
  Rng rng(seed);
  sd.indptr.assign(1, 0);
  int total = 0;
  for (int b = 0; b < c.batch; ++b) {
    const int len = b == 0 ? c.len : 1 + rng.below(c.len);
    const int np = (len + c.page - 1) / c.page;
    total += np;
    sd.indptr.push_back(total);
    sd.last.push_back(len - (np - 1) * c.page);
    sd.max_pages = std::max(sd.max_pages, np);
  }
  sd.pool_pages = total + total / 4 + 3;
  std::vector<std::int32_t> perm(sd.pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = sd.pool_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  sd.indices.assign(perm.begin(), perm.begin() + total);
  const std::size_t per_page = static_cast<std::size_t>(c.hkv) * c.d;
  sd.smin.resize(static_cast<std::size_t>(sd.pool_pages) * per_page);
  sd.smax.resize(sd.smin.size());
  const int patterns = c.tie_mode == 1 ? 4 : 1;
  std::vector<float> pat_lo(patterns * per_page), pat_hi(pat_lo.size());
  for (std::size_t i = 0; i < pat_lo.size(); ++i) {
    const float ctr = rng.sym(1.5f), r = static_cast<float>(rng.uniform());
    pat_lo[i] = ctr - r;
    pat_hi[i] = ctr + r;
  }
  for (int pg = 0; pg < sd.pool_pages; ++pg) {
    const int pat = c.tie_mode ? rng.below(patterns) : 0;
    for (std::size_t i = 0; i < per_page; ++i) {
      const std::size_t o = static_cast<std::size_t>(pg) * per_page + i;
      if (c.tie_mode) {
        sd.smin[o] = pat_lo[pat * per_page + i];
        sd.smax[o] = pat_hi[pat * per_page + i];
      } else {
        // Keys in [-2, 2] with a per-page spread: min <= max, values not bf16-exact (the store
        // rounds them outward).
        const float ctr = rng.sym(1.5f), r = static_cast<float>(rng.uniform() * 0.8);
        sd.smin[o] = ctr - r;
        sd.smax[o] = ctr + r;
      }
    }
  }
  kv::SummariesView sv;
  sv.min = sd.smin.data();
  sv.max = sd.smax.data();
  sv.num_pages = sd.pool_pages;
  sv.num_kv_heads = c.hkv;
  sv.head_dim = c.d;
  sd.store = select::BoundStore(sv);
  sd.q.resize(static_cast<std::size_t>(c.batch) * c.hq * c.d);
  for (float& x : sd.q) x = rng.sym(3.f);
}

// Device copies of a case's store, table and q, and the GPU selection's outputs.
struct SelGpu {
  DevBuf<std::uint16_t> mn, mx;
  DevBuf<std::int32_t> indptr, indices, last, ids, count;
  DevBuf<float> q;
  cuda::QuestSelectArgs args;
  int max_per_head = 0;
};

void setup_sel_gpu(const SelData& sd, SelGpu& g) {
  const SelCase& c = sd.c;
  const select::BoundStoreView hv = sd.store.view();
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mn = DevBuf<std::uint16_t>(n);
  g.mx = DevBuf<std::uint16_t>(n);
  g.mn.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
  g.mx.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
  g.indptr = to_device(sd.indptr);
  g.indices = to_device(sd.indices);
  g.last = to_device(sd.last);
  g.q = to_device(sd.q);
  g.max_per_head = cuda::select_capacity(sd.max_pages, c.page, c.pol);
  g.ids = DevBuf<std::int32_t>(static_cast<std::size_t>(c.batch) * c.hkv * g.max_per_head);
  g.count = DevBuf<std::int32_t>(static_cast<std::size_t>(c.batch) * c.hkv);
  cuda::QuestSelectArgs& a = g.args;
  a.q = View3<const float>::contiguous(g.q.p, c.batch, c.hq, c.d);
  a.table = {{g.indptr.p, g.indptr.n}, {g.indices.p, g.indices.n}, {g.last.p, g.last.n}};
  a.page_size = c.page;
  a.bounds = hv;
  a.bounds.min = reinterpret_cast<const bf16*>(g.mn.p);
  a.bounds.max = reinterpret_cast<const bf16*>(g.mx.p);
  a.bounds.wmax = nullptr;
  a.scale = c.scale;
  a.policy = c.pol;
  a.max_per_head = g.max_per_head;
  a.ids = {g.ids.p, g.ids.n};
  a.count = {g.count.p, g.count.n};
}

select::QuestArgs cpu_args(const SelData& sd, const select::BoundStoreView& hv) {
  select::QuestArgs qa;
  qa.q = View3<const float>::contiguous(sd.q.data(), sd.c.batch, sd.c.hq, sd.c.d);
  qa.table = {sd.indptr, sd.indices, sd.last};
  qa.page_size = sd.c.page;
  qa.bounds_bf16 = &hv;
  qa.scale = sd.c.scale;
  qa.policy = sd.c.pol;
  return qa;
}

struct SelStats {
  long lists = 0, identical = 0, near_tie = 0, pages = 0, bit_equal = 0;
  double worst_bound = 0;  // max |gpu - cpu| / eps over pages
};

// Compares one case; returns the failures (printed).
int compare_selection(const SelData& sd, const SelectionStorage& cpu,
                      const std::vector<std::int32_t>& gids, const std::vector<std::int32_t>& gcnt,
                      int gmax, const std::vector<std::uint32_t>& keys, int kstride, SelStats& st,
                      const char* tag) {
  const SelCase& c = sd.c;
  const select::BoundStoreView hv = sd.store.view();
  const int g = c.hq / c.hkv;
  const float scale = c.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(c.d)) : c.scale;
  const double f = 2.0 * (2 * c.d + 4) * 0x1p-24;
  int failures = 0;
  auto fail_msg = [&](int b, int h, const std::string& why) {
    if (failures++ < 5)
      std::printf(
          "FAIL select %s B=%d Hq=%d Hkv=%d d=%d page=%d len=%d budget=%d sinks=%d "
          "window=%d tie=%d: b=%d h=%d: %s\n",
          tag, c.batch, c.hq, c.hkv, c.d, c.page, c.len, c.pol.budget_pages, c.pol.sink_pages,
          c.pol.window_tokens, c.tie_mode, b, h, why.c_str());
  };
  std::vector<float> U;
  for (int b = 0; b < c.batch; ++b) {
    const int n = sd.indptr[b + 1] - sd.indptr[b];
    const std::span<const std::int32_t> phys(sd.indices.data() + sd.indptr[b],
                                             static_cast<std::size_t>(n));
    for (int h = 0; h < c.hkv; ++h) {
      ++st.lists;
      // CPU bounds of the group, aggregated by max over its q heads as topk_one does.
      U.resize(static_cast<std::size_t>(g) * n);
      const float* q0 = sd.q.data() + (static_cast<std::size_t>(b) * c.hq + h * g) * c.d;
      select::page_upper_bounds(hv, phys, h, q0, g, c.d, scale, U);
      std::vector<float> agg(static_cast<std::size_t>(n));
      double l1max = 0, wmax = 0;
      for (int i = 0; i < g; ++i) {
        double l1 = 0;
        for (int x = 0; x < c.d; ++x) l1 += std::fabs(q0[i * c.d + x]);
        l1max = std::max(l1max, l1);
      }
      for (int j = 0; j < n; ++j) {
        float m = U[j];
        for (int i = 1; i < g; ++i) m = U[i * n + j] > m ? U[i * n + j] : m;
        agg[j] = m;
        wmax = std::max(
            wmax, static_cast<double>(hv.wmax[static_cast<std::size_t>(phys[j]) * c.hkv + h]));
      }
      double maxabs = 0;
      for (float x : agg) maxabs = std::max(maxabs, std::fabs(static_cast<double>(x)));
      const double eps = scale * (f * l1max * wmax + 8 * 0x1p-24 * maxabs);
      bool bits_equal = true;
      for (int j = 0; j < n; ++j) {
        const std::uint32_t k = keys[(static_cast<std::size_t>(b) * c.hkv + h) * kstride + j];
        const float gb = cuda::key_to_bound(k);
        ++st.pages;
        if (k == cuda::bound_to_key(agg[j])) {
          ++st.bit_equal;
        } else {
          bits_equal = false;
          const double e = std::fabs(static_cast<double>(gb) - agg[j]) / eps;
          st.worst_bound = std::max(st.worst_bound, e);
          if (!(e <= 1.0)) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "page %d bound gpu %.9g cpu %.9g (|diff| = %.2f eps)", j,
                          gb, agg[j], e);
            fail_msg(b, h, buf);
            break;
          }
        }
      }
      // Lists.
      const int cc = cpu.count[b * c.hkv + h], gc = gcnt[b * c.hkv + h];
      const std::int32_t* gl = gids.data() + (static_cast<std::size_t>(b) * c.hkv + h) * gmax;
      const std::span<const std::int32_t> cl = cpu.view().list(b, h);
      if (cc != gc) {
        fail_msg(b, h, "count gpu " + std::to_string(gc) + " cpu " + std::to_string(cc));
        continue;
      }
      bool valid = gc <= gmax;
      for (int i = 0; valid && i < gc; ++i)
        valid = gl[i] >= 0 && gl[i] < n && (i == 0 || gl[i] > gl[i - 1]);
      for (int i = gc; valid && i < gmax; ++i) valid = gl[i] == -1;
      if (!valid) {
        fail_msg(b, h, "gpu list not ascending in [0, n) with -1 padding");
        continue;
      }
      if (std::equal(cl.begin(), cl.end(), gl)) {
        ++st.identical;
        continue;
      }
      if (bits_equal) {
        fail_msg(b, h, "lists differ although every bound has the same bits (top-k bug)");
        continue;
      }
      // Near-tie tolerance: differing pages must be candidates with bounds within eps of the
      // threshold (the smallest bound among the CPU's selected candidates).
      std::vector<std::uint8_t> in_c(static_cast<std::size_t>(n), 0), in_g(in_c.size(), 0);
      for (std::int32_t j : cl) in_c[j] = 1;
      for (int i = 0; i < gc; ++i) in_g[gl[i]] = 1;
      const std::int64_t length = static_cast<std::int64_t>(n - 1) * c.page + sd.last[b];
      const select::KeptRanges<int> kept =
          select::kept_pages(n, length, c.page, c.pol.sink_pages, c.pol.window_tokens);
      const int sinks = kept.first_end, window = kept.last_begin;
      double thr = INFINITY;
      for (int j = sinks; j < window; ++j)
        if (in_c[j]) thr = std::min(thr, static_cast<double>(agg[j]));
      bool ok = true;
      for (int j = 0; j < n && ok; ++j) {
        if (in_c[j] == in_g[j]) continue;
        ok = j >= sinks && j < window && std::fabs(agg[j] - thr) <= eps;
        if (!ok) {
          char buf[200];
          std::snprintf(buf, sizeof buf,
                        "page %d %s: bound %.9g vs threshold %.9g (eps %.3g) is not a near-tie", j,
                        in_c[j] ? "only on the CPU" : "only on the GPU", agg[j], thr, eps);
          fail_msg(b, h, buf);
        }
      }
      if (ok) ++st.near_tie;
    }
  }
  return failures;
}

// Runs the GPU selection of a set-up case and downloads ids, counts and keys.
void run_gpu_select(SelGpu& g, const SelData& sd, cuda::SelectWorkspace& ws,
                    std::vector<std::int32_t>& ids, std::vector<std::int32_t>& cnt,
                    std::vector<std::uint32_t>& keys, int chunk_pages = 0) {
  CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));  // poison
  CK(cudaMemset(g.count.p, 0x7f, g.count.n * sizeof(std::int32_t)));
  cuda::SelectLaunch l = env_select_launch();
  l.workspace = &ws;
  l.max_pages_per_seq = sd.max_pages;
  l.chunk_pages = chunk_pages;
  cuda::quest_select(g.args, l);
  ids = g.ids.download();
  cnt = g.count.download();
  const auto k = ws.page_keys();
  keys.resize(k.size());
  CK(cudaMemcpy(keys.data(), k.data(), k.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
}

std::vector<SelCase> select_cases() {
  std::vector<SelCase> cases;
  const int groups[][2] = {{4, 4}, {8, 2}, {12, 4}, {32, 8}, {16, 2}, {28, 4}, {32, 2}};
  const int lens[] = {1, 15, 17, 100, 1000, 4097, 20000, 65537, 131073};
  const int pages[] = {16, 1, 8, 32, 64, 16, 4};  // the CPU cache takes powers of two
  const int budgets[] = {0, 1, 5, 16, 64, 256, 100000};
  const int sinks[] = {0, 1, 4, 1};
  const int windows[] = {0, 1, 64, 1000, 0};
  const int batches[] = {1, 3, 8, 1};
  for (int idx = 0; idx < 84; ++idx) {
    SelCase c{};
    const int gi = idx % 7;
    c.hq = groups[gi][0];
    c.hkv = groups[gi][1];
    c.d = (idx / 7) % 2 ? 128 : 64;
    c.len = lens[(idx * 5 + idx / 9) % 9];
    c.page = pages[(idx * 3 + idx / 7) % 7];
    if (c.page < 8 && c.len > 20000) c.page = 16;  // keep the pool (and the CPU) affordable
    c.batch = batches[(idx / 3) % 4];
    if (c.len > 65536 && c.batch > 3) c.batch = 3;
    // Keep the host summaries under ~40M floats per array.
    while (c.batch > 1 &&
           static_cast<double>(c.batch) * ((c.len + c.page - 1) / c.page) * c.hkv * c.d > 3e7)
      c.batch = 1;
    c.pol.budget_pages = budgets[(idx / 2 + idx * 5) % 7];
    c.pol.sink_pages = sinks[idx % 4];
    c.pol.window_tokens = windows[(idx / 2) % 5];
    c.scale = idx % 10 == 3 ? 1.0f : 0.f;
    c.tie_mode = idx % 12 == 5 ? 1 : idx % 17 == 8 ? 2 : 0;
    cases.push_back(c);
  }
  // Hand-picked edges: budget >= pages, budget 0, sinks covering the sequence, window covering
  // it, exact ties with a large budget, head_dim 256, one page.
  cases.push_back({1, 32, 8, 128, 16, 4097, {1000, 1, 0}, 0, 0});
  cases.push_back({2, 32, 8, 128, 16, 4097, {0, 0, 0}, 0, 0});
  cases.push_back({2, 8, 2, 64, 16, 100, {3, 10, 0}, 0, 0});
  cases.push_back({2, 8, 2, 64, 16, 100, {3, 0, 5000}, 0, 0});
  cases.push_back({4, 16, 4, 128, 16, 30000, {100, 2, 256}, 0, 2});
  cases.push_back({4, 16, 4, 128, 16, 30000, {700, 1, 16}, 0, 1});
  cases.push_back({2, 16, 2, 256, 16, 5000, {32, 1, 64}, 0, 0});
  cases.push_back({3, 4, 1, 64, 64, 1, {4, 1, 0}, 0, 0});
  cases.push_back({1, 32, 8, 128, 16, 1 << 20, {512, 1, 64}, 0, 0});  // 1M tokens, 65536 pages
  // Groups 2, 6 and 5 (the scoring kernel's q-head batches of 4: a batch of 2 and of 1 after 4),
  // and candidates spread over all eight slices of the top-k cluster, with ties across slices.
  cases.push_back({1, 16, 8, 128, 16, 200000, {4096, 1, 64}, 0, 1});
  cases.push_back({2, 24, 4, 64, 16, 70000, {1000, 4, 1000}, 0, 2});
  cases.push_back({1, 10, 2, 256, 16, 40000, {300, 1, 64}, 0, 0});
  cases.push_back({2, 16, 8, 128, 1, 33, {5, 0, 0}, 0, 0});
  // 9 x 8 = 72 (sequence, kv head) pairs: the top-k runs one CTA per pair (no cluster) on 132 SMs.
  cases.push_back({9, 32, 8, 128, 16, 3000, {64, 1, 64}, 0, 1});
  return cases;
}

// Runs body(i) (returns its failures) for cases 0..n-1; a case that throws (host or device) is
// one failure and the others still run; a progress line every 16 cases.
template <class F>
int run_cases(const char* what, std::size_t n, F&& body) {
  int failures = 0;
  for (std::size_t i = 0; i < n; ++i) {
    try {
      failures += body(i);
    } catch (const Error& e) {
      std::printf("FAIL %s case %zu threw: %s\n", what, i, e.what());
      failures += 1;
    }
    if (i % 16 == 15 || i + 1 == n) {
      std::printf("  %s cases ..%zu done (%d failures so far)\n", what, i, failures);
      std::fflush(stdout);
    }
  }
  return failures;
}

int run_select_check() {
  const std::vector<SelCase> cases = select_cases();
  std::printf(
      "select check: %zu cases, GPU quest_select vs CPU select::quest_select "
      "(bounds_bf16 store, same policy)\n",
      cases.size());
  std::printf(
      "tolerance: none where the bounds have the same bits; otherwise only candidate "
      "pages with a bound within eps of the threshold may differ (see gpu_bench.cu)\n");
  cuda::SelectWorkspace ws;
  SelStats st;
  const auto t0 = std::chrono::steady_clock::now();
  const int failures = run_cases("select", cases.size(), [&](std::size_t i) {
    SelData sd;
    sd.c = cases[i];
    build_sel_case(sd, 5000 + i);
    const select::BoundStoreView hv = sd.store.view();
    SelectionStorage cpu;
    select::quest_select(cpu_args(sd, hv), cpu);
    SelGpu g;
    setup_sel_gpu(sd, g);
    std::vector<std::int32_t> ids, cnt;
    std::vector<std::uint32_t> keys;
    // Alternate the planned chunk and a small explicit one (many CTAs per sequence).
    run_gpu_select(g, sd, ws, ids, cnt, keys, i % 2 ? 64 : 0);
    return compare_selection(sd, cpu, ids, cnt, g.max_per_head, keys, ws.keys_stride(), st,
                             i % 2 ? "cp64" : "auto");
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "select: %ld lists: %ld identical, %ld near-tie only; bounds bit-identical %ld/%ld "
      "pages (%.4f%%), worst |gpu-cpu| %.3f eps (%.1f s)\n",
      st.lists, st.identical, st.near_tie, st.bit_equal, st.pages,
      st.pages ? 100.0 * st.bit_equal / st.pages : 0.0, st.worst_bound, secs);
  std::printf("SELECT CHECK %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures;
}

// Self-test: properties that do not lean on the CPU selector (ties, budget edges,
// determinism, errors through the flag and on the host, graph capture), then an end-to-end
// sparse decode on the GPU's own selection against the f64 reference on the CPU's.
// ---- 8-bit and hierarchical selection: check against the CPU references ----------------------
// select::quest_select8 and select::hier_select evaluate every bound in the GPU kernel's order
// (compact_bounds.hpp, std::fma where the GPU fuses), on any host: keys and lists must be
// identical, no tolerance.

// Device copies of a host 8-bit store and of a group store (with its group table).
struct Store8Gpu {
  DevBuf<std::uint8_t> mn, mx;
  DevBuf<float> grid;
  select::BoundStore8View view;  // device pointers
};
Store8Gpu upload_store8(const select::BoundStore8View& hv) {
  Store8Gpu g;
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mn = DevBuf<std::uint8_t>(n);
  g.mx = DevBuf<std::uint8_t>(n);
  g.grid = DevBuf<float>(2 * static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads);
  g.mn.upload(hv.min, n);
  g.mx.upload(hv.max, n);
  g.grid.upload(hv.grid, g.grid.n);
  g.view = hv;
  g.view.min = g.mn.p;
  g.view.max = g.mx.p;
  g.view.grid = g.grid.p;
  return g;
}
struct GroupGpu {
  DevBuf<std::uint16_t> mn, mx;
  DevBuf<std::int32_t> indptr, indices;
  select::BoundStoreView view;  // device pointers
};
GroupGpu upload_groups(const select::GroupStore& gs) {
  GroupGpu g;
  const select::BoundStoreView hv = gs.view();
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mn = DevBuf<std::uint16_t>(n);
  g.mx = DevBuf<std::uint16_t>(n);
  g.mn.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
  g.mx.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
  g.indptr = to_device(std::vector<std::int32_t>(gs.indptr().begin(), gs.indptr().end()));
  g.indices = to_device(std::vector<std::int32_t>(gs.indices().begin(), gs.indices().end()));
  g.view = hv;
  g.view.min = reinterpret_cast<const bf16*>(g.mn.p);
  g.view.max = reinterpret_cast<const bf16*>(g.mx.p);
  g.view.wmax = nullptr;
  return g;
}
cuda::HierSelectArgs hier_args(const cuda::QuestSelectArgs& pages, const GroupGpu& gg,
                               double cover) {
  cuda::HierSelectArgs h;
  h.pages = pages;
  h.groups = gg.view;
  h.group_indptr = {gg.indptr.p, gg.indptr.n};
  h.group_indices = {gg.indices.p, gg.indices.n};
  h.group_pages = 16;
  h.cover = cover;
  return h;
}

// Page moments for the Gaussian-τ checks: mean inside [min, max], M2 >= 0, counts 1..page
// (from their own seed: the case's other data are unchanged).
struct MomentData {
  std::vector<float> mean, m2;
  std::vector<std::int32_t> count;
  kv::SummariesView view(int num_kv_heads, int head_dim) const {
    kv::SummariesView v;
    v.mean = mean.data();
    v.m2 = m2.data();
    v.count = count.data();
    v.num_pages = static_cast<int>(count.size());
    v.num_kv_heads = num_kv_heads;
    v.head_dim = head_dim;
    return v;
  }
};
MomentData make_moments(const SelData& sd, std::uint64_t seed) {
  Rng rng(seed);
  MomentData m;
  m.mean.resize(sd.smin.size());
  m.m2.resize(sd.smin.size());
  m.count.resize(static_cast<std::size_t>(sd.pool_pages));
  for (auto& n : m.count) n = 1 + rng.below(sd.c.page);
  const std::size_t per_page = static_cast<std::size_t>(sd.c.hkv) * sd.c.d;
  for (std::size_t i = 0; i < m.mean.size(); ++i) {
    const float lo = sd.smin[i], hi = sd.smax[i];
    m.mean[i] = lo + static_cast<float>(rng.uniform()) * (hi - lo);
    const float sd_c = 0.5f * (hi - lo) * static_cast<float>(rng.uniform());
    m.m2[i] = static_cast<float>(m.count[i / per_page]) * sd_c * sd_c;
  }
  return m;
}
// Device copy of a MomentStore and its table.
struct MomentGpu {
  DevBuf<float> mean, m2;
  DevBuf<std::int32_t> count, indptr, indices;
  kv::SummariesView view;  // device pointers
};
MomentGpu upload_moments(const select::MomentStore& ms) {
  MomentGpu g;
  const kv::SummariesView hv = ms.view();
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mean = DevBuf<float>(n);
  g.m2 = DevBuf<float>(n);
  g.count = DevBuf<std::int32_t>(static_cast<std::size_t>(hv.num_pages));
  g.mean.upload(hv.mean, n);
  g.m2.upload(hv.m2, n);
  g.count.upload(hv.count, g.count.n);
  g.indptr = to_device(std::vector<std::int32_t>(ms.indptr().begin(), ms.indptr().end()));
  g.indices = to_device(std::vector<std::int32_t>(ms.indices().begin(), ms.indices().end()));
  g.view = hv;
  g.view.mean = g.mean.p;
  g.view.m2 = g.m2.p;
  g.view.count = g.count.p;
  return g;
}
void set_moments(cuda::HierSelectArgs& h, const MomentGpu& mg, int moment_pages, double alpha,
                 bool adaptive, float margin) {
  h.moments = mg.view;
  h.moment_indptr = {mg.indptr.p, mg.indptr.n};
  h.moment_indices = {mg.indices.p, mg.indices.n};
  h.moment_pages = moment_pages;
  h.alpha = alpha;
  h.adaptive = adaptive;
  h.margin = margin;
}

struct ExactStats {
  long lists = 0, identical = 0, keys = 0, keys_equal = 0;
};

// Keys (CPU stride = GPU stride = max_pages) and lists must be identical.
int compare_exact(const SelData& sd, const SelectionStorage& cpu,
                  const std::vector<std::uint32_t>& ckeys, const std::vector<std::int32_t>& gids,
                  const std::vector<std::int32_t>& gcnt, int gmax,
                  const std::vector<std::uint32_t>& gkeys, int stride, const char* tag,
                  ExactStats& st) {
  const SelCase& c = sd.c;
  int failures = 0;
  for (int b = 0; b < c.batch; ++b) {
    const int n = sd.indptr[b + 1] - sd.indptr[b];
    for (int h = 0; h < c.hkv; ++h) {
      ++st.lists;
      const std::size_t base = (static_cast<std::size_t>(b) * c.hkv + h) * stride;
      int bad_key = -1;
      for (int j = 0; j < n; ++j) {
        ++st.keys;
        if (ckeys[base + j] == gkeys[base + j]) {
          ++st.keys_equal;
        } else if (bad_key < 0) {
          bad_key = j;
        }
      }
      const std::span<const std::int32_t> cl = cpu.view().list(b, h);
      const std::int32_t* gl = gids.data() + (static_cast<std::size_t>(b) * c.hkv + h) * gmax;
      const int gc = gcnt[b * c.hkv + h];
      bool same = gc == static_cast<int>(cl.size()) && std::equal(cl.begin(), cl.end(), gl);
      for (int i = gc; same && i < gmax; ++i) same = gl[i] == -1;
      st.identical += same;
      if ((bad_key >= 0 || !same) && failures++ < 5) {
        std::printf(
            "FAIL %s B=%d Hq=%d Hkv=%d d=%d page=%d len=%d budget=%d sinks=%d window=%d tie=%d: "
            "b=%d h=%d: ",
            tag, c.batch, c.hq, c.hkv, c.d, c.page, c.len, c.pol.budget_pages, c.pol.sink_pages,
            c.pol.window_tokens, c.tie_mode, b, h);
        if (bad_key >= 0)
          std::printf("key of page %d gpu %08x cpu %08x; ", bad_key, gkeys[base + bad_key],
                      ckeys[base + bad_key]);
        std::printf("lists %s (count gpu %d cpu %zu)\n", same ? "equal" : "differ", gc, cl.size());
      }
    }
  }
  return failures;
}

// Downloads the selection and page keys of the last GPU selection into the vectors.
void download_selection(const SelGpu& g, const cuda::SelectWorkspace& ws,
                        std::vector<std::int32_t>& ids, std::vector<std::int32_t>& cnt,
                        std::vector<std::uint32_t>& keys) {
  ids = g.ids.download();
  cnt = g.count.download();
  const auto k = ws.page_keys();
  keys.resize(k.size());
  CK(cudaMemcpy(keys.data(), k.data(), k.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
}

// A device span's contents.
template <class T>
std::vector<T> download_span(std::span<const T> s) {
  std::vector<T> v(s.size());
  if (!v.empty()) CK(cudaMemcpy(v.data(), s.data(), s.size_bytes(), cudaMemcpyDeviceToHost));
  return v;
}

// hier_select in one kernel (SelectLaunch::HierKernel::fused) against the separate launches
// (run here first, explicitly, for the reference group keys and lists) and the CPU: every
// group key and the group lists equal the separate path's, the page keys (0 outside the chosen
// groups) and lists equal the CPU's. Group and page keys are poisoned before the fused call, so
// a key it fails to write, or to zero, shows. `expect`: the fused kernel should serve this
// call (a fallback to the separate launches then fails). Returns the failures; `served` counts
// the calls the fused kernel served.
int check_hier_fused(const SelData& sd, const SelGpu& g, const cuda::SelectWorkspace& ws,
                     const cuda::HierSelectArgs& h, cuda::SelectLaunch l,
                     const SelectionStorage& cpu, const std::vector<std::uint32_t>& ckeys,
                     bool expect, const char* tag, ExactStats& st, long& served) {
  l.hier_kernel = cuda::SelectLaunch::HierKernel::separate;
  cuda::hier_select(h, l);
  const std::vector<std::int32_t> gid_ref = download_span(ws.group_ids());
  const std::vector<std::int32_t> gcnt_ref = download_span(ws.group_counts());
  const std::vector<std::uint32_t> gkey_ref = download_span(ws.group_keys());
  for (const auto k : {ws.page_keys(), ws.group_keys()})
    CK(cudaMemset(const_cast<std::uint32_t*>(k.data()), 0xA5, k.size_bytes()));
  CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
  l.hier_kernel = cuda::SelectLaunch::HierKernel::fused;
  cuda::hier_select(h, l);
  std::vector<std::int32_t> ids, cnt;
  std::vector<std::uint32_t> keys;
  download_selection(g, ws, ids, cnt, keys);
  int f = 0;
  served += ws.last_hier_fused();
  if (expect && !ws.last_hier_fused()) {
    std::printf("FAIL %s: the fused kernel did not serve a call it should\n", tag);
    ++f;
  }
  if (download_span(ws.group_ids()) != gid_ref || download_span(ws.group_counts()) != gcnt_ref) {
    std::printf("FAIL %s: group lists differ from the separate launches'\n", tag);
    ++f;
  }
  const SelCase& c = sd.c;
  const std::vector<std::uint32_t> gkey = download_span(ws.group_keys());
  const int gkstride = ws.group_keys_stride();
  long bad_gkeys = 0;
  for (int b = 0; b < c.batch; ++b) {
    const int ng = (sd.indptr[b + 1] - sd.indptr[b] + 15) / 16;
    for (int hh = 0; hh < c.hkv; ++hh)
      for (int j = 0; j < ng; ++j) {
        const std::size_t at = (static_cast<std::size_t>(b) * c.hkv + hh) * gkstride + j;
        bad_gkeys += gkey[at] != gkey_ref[at];
      }
  }
  if (bad_gkeys > 0) {
    std::printf("FAIL %s: %ld group keys differ from the separate launches'\n", tag, bad_gkeys);
    ++f;
  }
  return f + compare_exact(sd, cpu, ckeys, ids, cnt, g.max_per_head, keys, ws.keys_stride(), tag,
                           st);
}

// cuda::update_groups against the host GroupStore, bit for bit: every group rebuilt into a
// poisoned store, then only the last groups (the others must stay poisoned).
int check_group_update(const SelData& sd, const SelGpu& g, const select::GroupStore& groups,
                       const cuda::SelectLaunch& l) {
  const select::BoundStoreView hv = groups.view();
  const std::size_t row = static_cast<std::size_t>(hv.num_kv_heads) * hv.head_dim;
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * row;
  const auto* want_mn = reinterpret_cast<const std::uint16_t*>(hv.min);
  const auto* want_mx = reinterpret_cast<const std::uint16_t*>(hv.max);
  DevBuf<std::uint16_t> mn(n), mx(n);
  DevBuf<std::int32_t> gptr =
      to_device(std::vector<std::int32_t>(groups.indptr().begin(), groups.indptr().end()));
  DevBuf<std::int32_t> gind =
      to_device(std::vector<std::int32_t>(groups.indices().begin(), groups.indices().end()));
  int failures = 0;
  for (int last_only = 0; last_only < 2; ++last_only) {
    CK(cudaMemset(mn.p, 0x7f, n * sizeof(std::uint16_t)));
    CK(cudaMemset(mx.p, 0x7f, n * sizeof(std::uint16_t)));
    cuda::GroupUpdateArgs u;
    u.table = g.args.table;
    u.pages = g.args.bounds;
    u.group_indptr = {gptr.p, gptr.n};
    u.group_indices = {gind.p, gind.n};
    u.group_min = reinterpret_cast<bf16*>(mn.p);
    u.group_max = reinterpret_cast<bf16*>(mx.p);
    u.group_slots = hv.num_pages;
    u.group_pages = groups.group_pages();
    u.last_only = last_only == 1;
    cuda::update_groups(u, l);
    const auto got_mn = mn.download(), got_mx = mx.download();
    std::vector<std::uint8_t> is_last(static_cast<std::size_t>(hv.num_pages), 0);
    for (int b = 0; b + 1 < static_cast<int>(groups.indptr().size()); ++b)
      if (groups.indptr()[b + 1] > groups.indptr()[b]) is_last[groups.indptr()[b + 1] - 1] = 1;
    long bad = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const bool updated = !last_only || is_last[i / row];
      const std::uint16_t a = updated ? want_mn[i] : 0x7f7fu, z = updated ? want_mx[i] : 0x7f7fu;
      bad += got_mn[i] != a || got_mx[i] != z;
    }
    if (bad) {
      std::printf("FAIL update_groups (%s) B=%d len=%d d=%d: %ld values differ\n",
                  last_only ? "last groups" : "all groups", sd.c.batch, sd.c.len, sd.c.d, bad);
      ++failures;
    }
  }
  return failures;
}

// cuda::update_moments against the host MomentStore, bit for bit: every group rebuilt into a
// poisoned store, then only the last groups (the others must stay poisoned).
int check_moment_update(const SelData& sd, const SelGpu& g, const MomentData& md,
                        const select::MomentStore& ms, const cuda::SelectLaunch& l) {
  const kv::SummariesView want = ms.view();
  const std::size_t row = static_cast<std::size_t>(want.num_kv_heads) * want.head_dim;
  const std::size_t n = static_cast<std::size_t>(want.num_pages) * row;
  DevBuf<float> pmean = to_device(md.mean), pm2 = to_device(md.m2);
  DevBuf<std::int32_t> pcount = to_device(md.count);
  DevBuf<float> mean(n), m2(n);
  DevBuf<std::int32_t> count(static_cast<std::size_t>(want.num_pages));
  DevBuf<std::int32_t> mptr =
      to_device(std::vector<std::int32_t>(ms.indptr().begin(), ms.indptr().end()));
  DevBuf<std::int32_t> mind =
      to_device(std::vector<std::int32_t>(ms.indices().begin(), ms.indices().end()));
  int failures = 0;
  for (int last_only = 0; last_only < 2; ++last_only) {
    CK(cudaMemset(mean.p, 0x7f, n * sizeof(float)));
    CK(cudaMemset(m2.p, 0x7f, n * sizeof(float)));
    CK(cudaMemset(count.p, 0x7f, count.n * sizeof(std::int32_t)));
    cuda::MomentUpdateArgs u;
    u.table = g.args.table;
    u.pages.mean = pmean.p;
    u.pages.m2 = pm2.p;
    u.pages.count = pcount.p;
    u.pages.num_pages = sd.pool_pages;
    u.pages.num_kv_heads = sd.c.hkv;
    u.pages.head_dim = sd.c.d;
    u.moment_indptr = {mptr.p, mptr.n};
    u.moment_indices = {mind.p, mind.n};
    u.mean = mean.p;
    u.m2 = m2.p;
    u.count = count.p;
    u.slots = want.num_pages;
    u.group_pages = ms.group_pages();
    u.last_only = last_only == 1;
    cuda::update_moments(u, l);
    const auto got_mean = mean.download(), got_m2 = m2.download();
    const auto got_count = count.download();
    std::vector<std::uint8_t> is_last(static_cast<std::size_t>(want.num_pages), 0);
    for (std::size_t b = 0; b + 1 < ms.indptr().size(); ++b)
      if (ms.indptr()[b + 1] > ms.indptr()[b]) is_last[ms.indptr()[b + 1] - 1] = 1;
    long bad = 0;
    const auto bits = [](float x) { return std::bit_cast<std::uint32_t>(x); };
    for (std::size_t i = 0; i < n; ++i) {
      const bool updated = !last_only || is_last[i / row];
      const std::uint32_t poison = 0x7f7f7f7fu;
      bad += bits(got_mean[i]) != (updated ? bits(want.mean[i]) : poison) ||
             bits(got_m2[i]) != (updated ? bits(want.m2[i]) : poison);
    }
    for (std::size_t sl = 0; sl < got_count.size(); ++sl)
      bad += got_count[sl] != (!last_only || is_last[sl] ? want.count[sl] : 0x7f7f7f7f);
    if (bad) {
      std::printf("FAIL update_moments (%s) B=%d len=%d d=%d G=%d: %ld values differ\n",
                  last_only ? "last groups" : "all groups", sd.c.batch, sd.c.len, sd.c.d,
                  ms.group_pages(), bad);
      ++failures;
    }
  }
  return failures;
}

int run_compact_check() {
  std::vector<SelCase> cases;
  for (const SelCase& c : select_cases()) {
    // The CPU references are scalar: keep every case's store under ~2e7 values.
    const double values =
        static_cast<double>(c.batch) * ((c.len + c.page - 1) / c.page) * c.hkv * c.d;
    if (values <= 2e7) cases.push_back(c);
  }
  std::printf(
      "select-compact check: %zu cases, GPU 8-bit Quest vs select::quest_select8 and GPU "
      "hierarchical Quest (groups of 16 pages, cover 0.5/1/2/8) vs select::hier_select; keys and "
      "lists must be identical\n",
      cases.size());
  cuda::SelectWorkspace ws;
  ExactStats s8, sh, sh8, shf, sh8f;
  long fused_cases = 0, fused_served = 0;
  struct {
    ExactStats fixed, adaptive;
    long fixed_pages = 0, adaptive_pages = 0, skipped = 0;
    double worst_tau = 0;
  } sg;
  struct {
    long lists = 0, identical = 0, same_as_cpu = 0, held = 0, skipped = 0, errors = 0;
    double worst_mass = 0;
  } stp;
  const double covers[] = {2.0, 1.0, 0.5, 8.0};
  const auto t0 = std::chrono::steady_clock::now();
  const int failures = run_cases("select-compact", cases.size(), [&](std::size_t i) {
    int f = 0;
    SelData sd;
    sd.c = cases[i];
    build_sel_case(sd, 7000 + i);
    const SelCase& c = sd.c;
    SelGpu g;
    setup_sel_gpu(sd, g);
    const kv::PageTable table{sd.indptr, sd.indices, sd.last};
    const auto qv = View3<const float>::contiguous(sd.q.data(), c.batch, c.hq, c.d);
    cuda::SelectLaunch l = env_select_launch();
    l.workspace = &ws;
    l.max_pages_per_seq = sd.max_pages;
    l.chunk_pages = i % 2 ? 64 : 0;
    std::vector<std::int32_t> ids, cnt;
    std::vector<std::uint32_t> keys, ckeys;
    // 8-bit.
    kv::SummariesView sv;
    sv.min = sd.smin.data();
    sv.max = sd.smax.data();
    sv.num_pages = sd.pool_pages;
    sv.num_kv_heads = c.hkv;
    sv.head_dim = c.d;
    const select::BoundStore8 store8(sv);
    SelectionStorage cpu8;
    select::quest_select8(qv, table, c.page, store8.view(), c.scale, c.pol, cpu8, &ckeys,
                          sd.max_pages);
    const Store8Gpu g8 = upload_store8(store8.view());
    cuda::QuestSelectArgs a8 = g.args;
    a8.bounds8 = g8.view;
    CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
    cuda::quest_select(a8, l);
    download_selection(g, ws, ids, cnt, keys);
    f += compare_exact(sd, cpu8, ckeys, ids, cnt, g.max_per_head, keys, ws.keys_stride(), "select8",
                       s8);
    // Hierarchical.
    const select::BoundStoreView hv = sd.store.view();
    const select::GroupStore groups(hv, table, 16);
    const double cover = covers[i % 4];
    select::HierSelectArgs ha;
    ha.q = qv;
    ha.table = table;
    ha.page_size = c.page;
    ha.pages = &hv;
    ha.groups = &groups;
    ha.scale = c.scale;
    ha.policy = c.pol;
    ha.cover = cover;
    SelectionStorage cpuh;
    select::hier_select(ha, cpuh, &ckeys, sd.max_pages);
    const GroupGpu gg = upload_groups(groups);
    f += check_group_update(sd, g, groups, l);
    CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
    cuda::hier_select(hier_args(g.args, gg, cover), l);
    download_selection(g, ws, ids, cnt, keys);
    f += compare_exact(sd, cpuh, ckeys, ids, cnt, g.max_per_head, keys, ws.keys_stride(), "hier",
                       sh);
    // Cases the fused kernel serves (a Hopper path; head_dim 64/128, cover x budget <= 8192
    // pages, the group candidates in shared memory; elsewhere hier_select falls back to the
    // separate launches).
    const bool fused_expected =
        cuda::hopper_paths() && (c.d == 64 || c.d == 128) &&
        8 * ((sd.max_pages + 15) / 16) <= 160 * 1024 &&
        16 * std::min((sd.max_pages + 15) / 16,
                      select::hier_groups(std::numeric_limits<int>::max(), 16, c.pol.budget_pages,
                                          cover)) <= 8192;
    fused_cases += fused_expected;
    f += check_hier_fused(sd, g, ws, hier_args(g.args, gg, cover), l, cpuh, ckeys, fused_expected,
                          "hier-fused", shf, fused_served);
    // Hierarchical with 8-bit pages (bf16 groups).
    const select::BoundStore8View h8v = store8.view();
    ha.pages8 = &h8v;
    SelectionStorage cpuh8;
    select::hier_select(ha, cpuh8, &ckeys, sd.max_pages);
    CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
    cuda::hier_select(hier_args(a8, gg, cover), l);
    download_selection(g, ws, ids, cnt, keys);
    f += compare_exact(sd, cpuh8, ckeys, ids, cnt, g.max_per_head, keys, ws.keys_stride(), "hier8",
                       sh8);
    f += check_hier_fused(sd, g, ws, hier_args(a8, gg, cover), l, cpuh8, ckeys, fused_expected,
                          "hier8-fused", sh8f, fused_served);
    // Entmax-aware hierarchical ranking (Gaussian-τ from pooled moments): τ̂ against
    // select::group_tau_hat (to the solver's tolerance), then keys and lists against
    // select::hier_select given the GPU's τ̂ (identical). Fixed budget and the adaptive rule.
    // The case's page moments (read by Gaussian-τ and top-p below).
    const MomentData md = make_moments(sd, 9000 + i);
    const kv::SummariesView page_moments = md.view(c.hkv, c.d);
    {
      const int mpages[] = {64, 16, 5};
      const int mp = mpages[i % 3];
      const select::MomentStore ms(page_moments, table, mp);
      const MomentGpu mg = upload_moments(ms);
      f += check_moment_update(sd, g, md, ms, l);
      const double alpha = i % 2 ? 2.0 : 1.5;
      std::vector<double> tau_cpu(static_cast<std::size_t>(c.batch) * c.hq);
      select::group_tau_hat(ms, qv, c.scale, alpha, tau_cpu);
      for (int adaptive = 0; adaptive < 2; ++adaptive) {
        const float margin = adaptive ? 0.25f * static_cast<float>(i % 5) : 0.f;
        cuda::HierSelectArgs hg = hier_args(g.args, gg, cover);
        set_moments(hg, mg, mp, alpha, adaptive == 1, margin);
        CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
        try {
          cuda::hier_select(hg, l);
        } catch (const Error& e) {
          // The adaptive rule's candidate limit: expected only where cover × budget is large.
          if (adaptive && e.code() == ErrorCode::unsupported && e.argument() == "budget_pages") {
            ++sg.skipped;
            continue;
          }
          throw;
        }
        download_selection(g, ws, ids, cnt, keys);
        std::vector<double> tau_gpu(ws.tau().size());
        CK(cudaMemcpy(tau_gpu.data(), ws.tau().data(), tau_gpu.size() * sizeof(double),
                      cudaMemcpyDeviceToHost));
        for (std::size_t t = 0; t < tau_cpu.size(); ++t) {
          const double err =
              std::fabs(tau_gpu[t] - tau_cpu[t]) / std::max(1.0, std::fabs(tau_cpu[t]));
          const bool both_nan = std::isnan(tau_gpu[t]) && std::isnan(tau_cpu[t]);
          if (!both_nan) sg.worst_tau = std::max(sg.worst_tau, std::isnan(err) ? 1e300 : err);
          if (!both_nan && !(err <= 1e-9) && f++ < 5)
            std::printf("FAIL gauss tau case %zu (b, q head) %zu: gpu %.17g cpu %.17g\n", i, t,
                        tau_gpu[t], tau_cpu[t]);
        }
        select::HierSelectArgs he = ha;
        he.pages8 = nullptr;
        he.tau = tau_gpu.data();
        he.alpha = alpha;
        he.adaptive = adaptive == 1;
        he.margin = margin;
        SelectionStorage cpue;
        select::hier_select(he, cpue, &ckeys, sd.max_pages);
        f += compare_exact(sd, cpue, ckeys, ids, cnt, g.max_per_head, keys, ws.keys_stride(),
                           adaptive ? "gauss-adaptive" : "gauss-fixed",
                           adaptive ? sg.adaptive : sg.fixed);
        long held = 0;
        for (int x : cnt) held += x;
        (adaptive ? sg.adaptive_pages : sg.fixed_pages) += held;
      }
    }
    // Hierarchical top-p: masses against select::hier_top_p's (1e-12 relative), lists against
    // select::top_p_by_masses applied to the GPU's masses (identical).
    {
      const int mp = (i % 2) ? 16 : 64;
      const select::MomentStore ms(page_moments, table, mp);
      const MomentGpu mg = upload_moments(ms);
      DevBuf<float> pmean = to_device(md.mean), pm2 = to_device(md.m2);
      DevBuf<std::int32_t> pcount = to_device(md.count);
      const std::size_t nmass = static_cast<std::size_t>(c.batch) * c.hkv * sd.max_pages;
      DevBuf<double> dmass(nmass);
      CK(cudaMemset(dmass.p, 0, nmass * sizeof(double)));
      const double pvals[] = {0.5, 0.9, 1.0};
      const double pt = pvals[i % 3];
      cuda::HierTopPArgs ht;
      ht.hier = hier_args(g.args, gg, cover);
      set_moments(ht.hier, mg, mp, 1.5, false, 0.f);
      ht.pages = page_moments;
      ht.pages.mean = pmean.p;
      ht.pages.m2 = pm2.p;
      ht.pages.count = pcount.p;
      ht.p = pt;
      ht.masses = {dmass.p, nmass};
      CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
      bool ran = true;
      try {
        cuda::hier_top_p(ht, l);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::unsupported) throw;
        ran = false;
        ++stp.skipped;
      }
      if (ran && i == 0) {
        // Bad moment tables are reported through the device flag, for both selectors: a slot
        // outside the store, then an indptr that does not match the page counts.
        for (int bad = 0; bad < 2; ++bad) {
          std::vector<std::int32_t> mptr(ms.indptr().begin(), ms.indptr().end());
          std::vector<std::int32_t> mind(ms.indices().begin(), ms.indices().end());
          if (bad == 0) mind.back() = ms.view().num_pages;
          if (bad == 1) mptr.back() += 1;
          DevBuf<std::int32_t> dptr = to_device(mptr), dind = to_device(mind);
          const char* want = bad == 0 ? "moment_indices" : "moment_indptr";
          for (int which = 0; which < 2; ++which) {
            cuda::HierTopPArgs e = ht;
            e.hier.moment_indptr = {dptr.p, dptr.n};
            e.hier.moment_indices = {dind.p, dind.n};
            std::string got = "no error";
            try {
              if (which == 0) {
                cuda::hier_top_p(e, l);
              } else {
                cuda::hier_select(e.hier, l);
              }
            } catch (const Error& x) {
              got = x.argument();
            }
            if (got != want && f++ < 5)
              std::printf("FAIL %s with a bad moment table: got %s, want %s\n",
                          which == 0 ? "hier_top_p" : "hier_select (gauss)", got.c_str(), want);
            stp.errors += got == want;
          }
        }
        ws.check(nullptr);  // clean after the errors
        cuda::hier_top_p(ht, l);
      }
      if (ran) {
        download_selection(g, ws, ids, cnt, keys);
        const std::vector<double> gmass = dmass.download();
        select::HierTopPArgs ct;
        ct.hier = ha;
        ct.hier.pages8 = nullptr;
        ct.pages = page_moments;
        ct.moments = &ms;
        ct.p = pt;
        SelectionStorage cpu_tp;
        std::vector<double> cmass;
        select::hier_top_p(ct, cpu_tp, &cmass, sd.max_pages);
        std::vector<std::uint32_t> qkeys;
        SelectionStorage quest;
        select::hier_select(ct.hier, quest, &qkeys, sd.max_pages);
        for (std::size_t x = 0; x < nmass; ++x) {
          if (cmass[x] == 0.0) continue;
          const double err = std::fabs(gmass[x] - cmass[x]) / cmass[x];
          stp.worst_mass = std::max(stp.worst_mass, err);
          if (!(err <= 1e-12) && f++ < 5)
            std::printf("FAIL top-p mass case %zu at %zu: gpu %.17g cpu %.17g\n", i, x, gmass[x],
                        cmass[x]);
        }
        std::vector<std::int32_t> rule(static_cast<std::size_t>(g.max_per_head));
        for (int b = 0; b < c.batch; ++b) {
          const int n = sd.indptr[b + 1] - sd.indptr[b];
          const std::int64_t len =
              n == 0 ? 0 : static_cast<std::int64_t>(n - 1) * c.page + sd.last[b];
          for (int h = 0; h < c.hkv; ++h) {
            const std::size_t base = (static_cast<std::size_t>(b) * c.hkv + h) * sd.max_pages;
            std::vector<std::uint8_t> cand(static_cast<std::size_t>(n));
            for (int j = 0; j < n; ++j) cand[static_cast<std::size_t>(j)] = qkeys[base + j] != 0u;
            const int want =
                n == 0 ? 0
                       : select::top_p_by_masses(gmass.data() + base, cand.data(), n, len, c.page,
                                                 c.pol, pt, rule.data(), g.max_per_head);
            const std::int32_t* gl =
                ids.data() + (static_cast<std::size_t>(b) * c.hkv + h) * g.max_per_head;
            const int gc = cnt[b * c.hkv + h];
            bool same = gc == want;
            for (int x = 0; same && x < g.max_per_head; ++x)
              same = gl[x] == (x < want ? rule[x] : -1);
            const auto cl = cpu_tp.view().list(b, h);
            stp.same_as_cpu +=
                gc == static_cast<int>(cl.size()) && std::equal(cl.begin(), cl.end(), gl);
            ++stp.lists;
            stp.identical += same;
            stp.held += gc;
            if (!same && f++ < 5)
              std::printf(
                  "FAIL top-p list case %zu b=%d h=%d: gpu count %d, rule on gpu masses %d\n", i, b,
                  h, gc, want);
          }
        }
      }
    }
    if (i == 0) {  // a CUDA graph of each (warmed up above) replays to the same lists
      for (int which = 0; which < 2; ++which) {
        cudaStream_t st;
        CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
        cuda::SelectLaunch lg = l;
        lg.stream = st;
        lg.check_errors = false;
        const auto step = [&] {
          if (which == 0) {
            cuda::quest_select(a8, lg);
          } else {
            cuda::hier_select(hier_args(g.args, gg, cover), lg);
          }
        };
        step();
        CK(cudaStreamSynchronize(st));
        const auto want_ids = g.ids.download();
        const auto want_cnt = g.count.download();
        CK(cudaMemsetAsync(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t), st));
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
        step();
        CK(cudaStreamEndCapture(st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, st));
        ws.check(st);
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaStreamDestroy(st));
        if (g.ids.download() != want_ids || g.count.download() != want_cnt) {
          std::printf("FAIL %s: CUDA graph replay differs\n", which ? "hier" : "select8");
          ++f;
        }
      }
    }
    return f;
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "select8: %ld/%ld lists identical, keys %ld/%ld identical; hier: %ld/%ld lists identical, "
      "keys %ld/%ld identical; hier8: %ld/%ld lists identical, keys %ld/%ld identical (%.1f s)\n",
      s8.identical, s8.lists, s8.keys_equal, s8.keys, sh.identical, sh.lists, sh.keys_equal,
      sh.keys, sh8.identical, sh8.lists, sh8.keys_equal, sh8.keys, secs);
  std::printf(
      "hier in one kernel (%ld of %zu cases it serves, %ld of 2x that calls served; the rest "
      "fall back): hier %ld/%ld lists identical, keys %ld/%ld; hier8 %ld/%ld lists identical, "
      "keys %ld/%ld\n",
      fused_cases, cases.size(), fused_served, shf.identical, shf.lists, shf.keys_equal,
      shf.keys, sh8f.identical, sh8f.lists, sh8f.keys_equal, sh8f.keys);
  std::printf(
      "gauss (entmax-aware hier, pooled-moment tau): worst |tau gpu - cpu| / max(1, |tau|) %.3g; "
      "fixed %ld/%ld lists identical, keys %ld/%ld; adaptive %ld/%ld lists identical, keys "
      "%ld/%ld, %ld pages held vs %ld at the fixed budget (%ld cases over the candidate limit)\n",
      sg.worst_tau, sg.fixed.identical, sg.fixed.lists, sg.fixed.keys_equal, sg.fixed.keys,
      sg.adaptive.identical, sg.adaptive.lists, sg.adaptive.keys_equal, sg.adaptive.keys,
      sg.adaptive_pages, sg.fixed_pages, sg.skipped);
  std::printf(
      "top-p (hier, Gaussian page masses): worst mass |gpu - cpu| / cpu %.3g; lists equal to the "
      "rule on the GPU's masses %ld/%ld (to select::hier_top_p's own %ld/%ld), %ld pages held "
      "(%ld cases over the candidate limit); bad moment tables reported %ld/4\n",
      stp.worst_mass, stp.identical, stp.lists, stp.same_as_cpu, stp.lists, stp.held, stp.skipped,
      stp.errors);
  std::printf("SELECT-COMPACT CHECK %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures;
}

int run_select_selftest() {
  std::printf("select-selftest\n");
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("  %-62s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) ++failures;
  };
  cuda::SelectWorkspace ws;
  // 1. All pages equal (tie_mode 2): the candidates taken are the lowest ids.
  {
    SelData sd;
    sd.c = {2, 8, 2, 64, 16, 1600, {10, 2, 32}, 0, 2};
    build_sel_case(sd, 11);
    SelGpu g;
    setup_sel_gpu(sd, g);
    std::vector<std::int32_t> ids, cnt;
    std::vector<std::uint32_t> keys;
    run_gpu_select(g, sd, ws, ids, cnt, keys);
    bool ok = true;
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        const int n = sd.indptr[b + 1] - sd.indptr[b];
        const std::int32_t* l = ids.data() + (b * 2 + h) * g.max_per_head;
        // Expected: sinks 0,1; then the lowest candidates; then the window pages.
        const int len = (n - 1) * 16 + sd.last[b];
        const int window = std::min(n - 1, std::max(0, len - 32) / 16);
        std::vector<std::int32_t> want;
        const int kept = 2 >= window ? n : 2 + (n - window);
        const int total = std::min(n, std::max(10, kept));
        for (int j = 0; j < std::min(2, window); ++j) want.push_back(j);
        for (int j = 2; j < 2 + (total - kept); ++j) want.push_back(j);
        for (int j = window; j < n; ++j) want.push_back(j);
        ok &= cnt[b * 2 + h] == static_cast<int>(want.size()) &&
              std::equal(want.begin(), want.end(), l);
      }
    expect(ok, "equal bounds: ties go to the lowest page ids");
  }
  // 2. Budget edges and determinism on a random case.
  {
    SelData sd;
    sd.c = {3, 32, 8, 128, 16, 20000, {64, 1, 64}, 0, 0};
    build_sel_case(sd, 12);
    SelGpu g;
    setup_sel_gpu(sd, g);
    std::vector<std::int32_t> ids, cnt, ids2, cnt2;
    std::vector<std::uint32_t> keys, keys2;
    run_gpu_select(g, sd, ws, ids, cnt, keys);
    bool same = true;
    for (int r = 0; r < 3; ++r) {
      run_gpu_select(g, sd, ws, ids2, cnt2, keys2, r == 1 ? 64 : r == 2 ? 192 : 0);
      same &= ids2 == ids && cnt2 == cnt && keys2 == keys;
    }
    expect(same, "same output bits on reruns and for chunk_pages auto/64/192");
    // The top candidates by key are exactly the non-kept selected pages.
    bool topk_ok = true;
    for (int b = 0; b < 3 && topk_ok; ++b) {
      const int n = sd.indptr[b + 1] - sd.indptr[b];
      const int len = (n - 1) * 16 + sd.last[b];
      const int window = std::min(n - 1, std::max(0, len - 64) / 16);
      for (int h = 0; h < 8 && topk_ok; ++h) {
        const std::uint32_t* k = keys.data() + (b * 8 + h) * static_cast<std::size_t>(sd.max_pages);
        std::vector<std::uint64_t> cand;
        for (int j = 1; j < window; ++j)
          cand.push_back(static_cast<std::uint64_t>(k[j]) << 32 | (0xffffffffu - j));
        std::sort(cand.begin(), cand.end(), std::greater<>());
        const int kept = 1 >= window ? n : 1 + (n - window);
        const int need = std::min(n, std::max(64, kept)) - kept;
        std::vector<std::int32_t> want;
        if (window > 0) want.push_back(0);  // the sink (when it is not a window page)
        const std::size_t first = want.size();
        for (int i = 0; i < need; ++i)
          want.push_back(static_cast<std::int32_t>(0xffffffffu - (cand[i] & 0xffffffffu)));
        std::sort(want.begin() + static_cast<std::ptrdiff_t>(first), want.end());
        for (int j = window; j < n; ++j) want.push_back(j);
        const std::int32_t* l = ids.data() + (b * 8 + h) * static_cast<std::size_t>(g.max_per_head);
        topk_ok = cnt[b * 8 + h] == static_cast<int>(want.size()) &&
                  std::equal(want.begin(), want.end(), l);
      }
    }
    expect(topk_ok, "selected = sink + top keys (full sort reference) + window");
    cuda::QuestSelectArgs a = g.args;
    a.policy.budget_pages = 1 << 20;
    a.max_per_head = 0;
    a.ids = {};
    // budget >= pages: every page.
    {
      const int cap = cuda::select_capacity(sd.max_pages, 16, a.policy);
      DevBuf<std::int32_t> big(static_cast<std::size_t>(3) * 8 * cap);
      a.max_per_head = cap;
      a.ids = {big.p, big.n};
      cuda::SelectLaunch l = env_select_launch();
      l.workspace = &ws;
      l.max_pages_per_seq = sd.max_pages;
      cuda::quest_select(a, l);
      const auto c2 = g.count.download();
      const auto i2 = big.download();
      bool all = true;
      for (int b = 0; b < 3; ++b)
        for (int h = 0; h < 8; ++h) {
          const int n = sd.indptr[b + 1] - sd.indptr[b];
          all &= c2[b * 8 + h] == n;
          for (int j = 0; j < n; ++j)
            all &= i2[(b * 8 + h) * static_cast<std::size_t>(cap) + j] == j;
        }
      expect(all, "budget >= pages selects every page");
    }
    // Errors: host-side arguments, then bad data through the device flag.
    cuda::SelectLaunch l = env_select_launch();
    l.workspace = &ws;
    l.max_pages_per_seq = sd.max_pages;
    auto throws = [&](const char* name, const char* argument, const std::function<void()>& f) {
      if (!expect_throw(name, argument, f)) ++failures;
    };
    throws("budget_pages -1", "budget_pages", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.policy.budget_pages = -1;
      cuda::quest_select(b2, l);
    });
    throws("head_dim 96", "head_dim", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.bounds.head_dim = 96;
      cuda::quest_select(b2, l);
    });
    throws("ids span of the wrong size", "ids", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.ids = b2.ids.subspan(1);
      cuda::quest_select(b2, l);
    });
    throws("max_pages_per_seq 0", "max_pages_per_seq", [&] {
      cuda::SelectLaunch l2 = l;
      l2.max_pages_per_seq = 0;
      cuda::quest_select(g.args, l2);
    });
    throws("max_pages_per_seq too small (device flag)", "indptr", [&] {
      cuda::SelectLaunch l2 = l;
      l2.max_pages_per_seq = sd.max_pages - 1;
      cuda::quest_select(g.args, l2);
    });
    throws("max_per_head too small (device flag)", "max_per_head", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.max_per_head = 3;
      b2.ids = b2.ids.subspan(0, static_cast<std::size_t>(3) * 8 * 3);
      cuda::quest_select(b2, l);
    });
    {
      std::vector<std::int32_t> bad = sd.indices;
      bad[7] = sd.pool_pages;
      g.indices.upload(bad);
      throws("physical page id == pool pages (device flag)", "indices",
             [&] { cuda::quest_select(g.args, l); });
      g.indices.upload(sd.indices);
      std::vector<std::int32_t> badp = sd.indptr;
      badp.back() += 1;  // one past indices.size()
      g.indptr.upload(badp);
      throws("indptr past indices.size() (device flag)", "indptr",
             [&] { cuda::quest_select(g.args, l); });
      g.indptr.upload(sd.indptr);
      std::vector<std::int32_t> badl = sd.last;
      badl[1] = 17;
      g.last.upload(badl);
      throws("last_page_len 17 > page 16 (device flag)", "last_page_len",
             [&] { cuda::quest_select(g.args, l); });
      g.last.upload(sd.last);
      std::vector<float> badq = sd.q;
      badq[5] = NAN;
      g.q.upload(badq);
      throws("NaN in q (device flag)", "q", [&] { cuda::quest_select(g.args, l); });
      g.q.upload(sd.q);
    }
    run_gpu_select(g, sd, ws, ids2, cnt2, keys2);
    expect(ids2 == ids && cnt2 == cnt, "clean run after the errors gives the same selection");

    // CUDA graph: capture select on a stream, replay, same result.
    {
      cudaStream_t st;
      CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      cuda::SelectLaunch lg = l;
      lg.stream = st;
      lg.check_errors = false;
      CK(cudaMemsetAsync(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t), st));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      cuda::quest_select(g.args, lg);
      CK(cudaStreamEndCapture(st, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, st));
      ws.check(st);
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      CK(cudaStreamDestroy(st));
      expect(g.ids.download() == ids && g.count.download() == cnt,
             "CUDA graph replay gives the same selection");
    }
  }
  // 3. End to end: GPU selection -> GPU sparse decode vs the f64 reference on the CPU's
  // selection, with the summaries of the actual keys.
  for (int variant = 0; variant < 2; ++variant) {
    CaseData cd;
    cd.c = variant == 0 ? Case{5000, 4, 128, 3, 16, DType::bf16, kv::Layout::HND}
                        : Case{20000, 8, 64, 2, 16, DType::bf16, kv::Layout::NHD};
    build_case(cd, 77 + variant);
    const Case& c = cd.c;
    const std::size_t per_page = static_cast<std::size_t>(c.num_kv_heads) * c.d;
    std::vector<float> smin(static_cast<std::size_t>(cd.pool_pages) * per_page, 0.f);
    std::vector<float> smax(smin.size(), 0.f);
    int mp = 0;
    for (int b = 0; b < c.batch; ++b) {
      const int n = cd.indptr[b + 1] - cd.indptr[b];
      mp = std::max(mp, n);
      for (int j = 0; j < n; ++j) {
        const int phys = cd.indices[cd.indptr[b] + j];
        const int len = cd.view.table.page_len(b, j, c.page);
        for (int h = 0; h < c.num_kv_heads; ++h)
          for (int x = 0; x < c.d; ++x) {
            float lo = INFINITY, hi = -INFINITY;
            for (int s = 0; s < len; ++s) {
              const float kx = bf16_to_f32(cd.view.key<bf16>(phys, h, s)[x]);
              lo = std::min(lo, kx);
              hi = std::max(hi, kx);
            }
            smin[phys * per_page + h * c.d + x] = lo;
            smax[phys * per_page + h * c.d + x] = hi;
          }
      }
    }
    kv::SummariesView sv;
    sv.min = smin.data();
    sv.max = smax.data();
    sv.num_pages = cd.pool_pages;
    sv.num_kv_heads = c.num_kv_heads;
    sv.head_dim = c.d;
    const select::BoundStore store(sv);
    const select::BoundStoreView hv = store.view();
    const int hq = c.num_kv_heads * c.group;
    select::TopkPolicy pol;
    pol.budget_pages = 24;
    pol.sink_pages = 1;
    pol.window_tokens = 64;
    select::QuestArgs qa;
    qa.q = View3<const float>::contiguous(cd.q.data(), c.batch, hq, c.d);
    qa.table = {cd.indptr, cd.indices, cd.last};
    qa.page_size = c.page;
    qa.bounds_bf16 = &hv;
    qa.policy = pol;
    SelectionStorage cs;
    select::quest_select(qa, cs);
    std::vector<float> dummy(cd.q.size());
    attn::DecodeArgs ra;
    ra.q = qa.q;
    ra.cache = cd.view;
    ra.out = View3<float>::contiguous(dummy.data(), c.batch, hq, c.d);
    const SelectionView csv = cs.view();
    ra.selection = &csv;
    std::vector<double> ref(cd.q.size()), rlse(static_cast<std::size_t>(c.batch) * hq);
    attn::decode_reference(ra, ref, rlse);

    GpuCase gc;
    setup_gpu(cd, gc);
    const std::size_t n = static_cast<std::size_t>(cd.pool_pages) * per_page;
    DevBuf<std::uint16_t> dmn(n), dmx(n);
    dmn.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
    dmx.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
    const int cap = cuda::select_capacity(mp, c.page, pol);
    DevBuf<std::int32_t> ids(static_cast<std::size_t>(c.batch) * c.num_kv_heads * cap);
    DevBuf<std::int32_t> cnt(static_cast<std::size_t>(c.batch) * c.num_kv_heads);
    cuda::QuestSelectArgs sa;
    sa.q = gc.args.q;
    sa.table = gc.view.table;
    sa.page_size = c.page;
    sa.bounds = hv;
    sa.bounds.min = reinterpret_cast<const bf16*>(dmn.p);
    sa.bounds.max = reinterpret_cast<const bf16*>(dmx.p);
    sa.bounds.wmax = nullptr;
    sa.policy = pol;
    sa.max_per_head = cap;
    sa.ids = {ids.p, ids.n};
    sa.count = {cnt.p, cnt.n};
    cuda::SelectLaunch sl = env_select_launch();
    sl.workspace = &ws;
    sl.max_pages_per_seq = mp;
    bool same = false;
    Errors e;
    try {
      cuda::quest_select(sa, sl);
      const auto gi = ids.download();
      const auto gn = cnt.download();
      same = gn == cs.count;
      for (int b = 0; same && b < c.batch; ++b)
        for (int h = 0; same && h < c.num_kv_heads; ++h) {
          const auto l = csv.list(b, h);
          same = std::equal(l.begin(), l.end(), gi.begin() + (b * c.num_kv_heads + h) * cap);
        }
      const SelectionView gsv{
          SelectionView::Unit::page, c.batch, c.num_kv_heads, cap, {ids.p, ids.n}, {cnt.p, cnt.n}};
      attn::DecodeArgs da = gc.args;
      da.selection = &gsv;
      cuda::DecodeWorkspace dws;
      cuda::DecodeLaunch dl;
      dl.workspace = &dws;
      dl.max_pages_per_seq = mp;
      e = run_and_compare(gc, da, dl, ref, rlse);
    } catch (const Error& err) {
      e.ok = false;
      e.why = std::string("threw: ") + err.what();
    }
    const bool pass = same && e.ok && e.o <= kTolO && e.lse <= kTolLse;
    std::printf(
        "  end to end %s: GPU select %s CPU select, sparse decode o_err=%.3e "
        "lse_err=%.3e %s %s\n",
        variant == 0 ? "G=4 d=128 HND" : "G=8 d=64 NHD ", same ? "==" : "!=", e.o, e.lse,
        e.why.c_str(), pass ? "ok" : "FAIL");
    if (!pass) ++failures;
  }
  std::printf("SELECT SELFTEST %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures;
}

// ---- benchmark -----------------------------------------------------------------------------

// The launch floor: a kernel that does nothing (timed in a CUDA graph like the steps).
__global__ void empty_kernel() {}

// Read-only ceiling: every byte read once with 16-byte loads, four in flight per thread.
__global__ void read_kernel(const uint4* p, std::size_t n, unsigned* sink) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x;
  unsigned acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
          d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^
           d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldcs(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;  // keeps the loads alive
}

// Key min/max per (page, kv head) for the CPU Quest selector (f32, [page][head][d]).
__global__ void summaries_kernel(const std::uint16_t* k, int heads, int page, int d, float* mn,
                                 float* mx) {
  const int pg = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  const std::uint16_t* base = k + ((static_cast<std::size_t>(pg) * heads + h) * page) * d + c;
  float lo = INFINITY, hi = -INFINITY;
  for (int s = 0; s < page; ++s) {
    const float x = __uint_as_float(static_cast<unsigned>(base[s * d]) << 16);
    lo = fminf(lo, x);
    hi = fmaxf(hi, x);
  }
  const std::size_t o = (static_cast<std::size_t>(pg) * heads + h) * d + c;
  mn[o] = lo;
  mx[o] = hi;
}

// Page moments of the bf16 keys (the Gaussian-τ rows): per (page, head, channel) the mean and
// M2 over the page's slots, two passes in f64, stored f32 (the cache's Welford state, to
// rounding).
__global__ void moments_kernel(const std::uint16_t* k, int heads, int page, int d, float* mean,
                               float* m2) {
  const int pg = blockIdx.x, h = blockIdx.y, c = threadIdx.x;
  const std::uint16_t* base = k + ((static_cast<std::size_t>(pg) * heads + h) * page) * d + c;
  double sum = 0;
  for (int s = 0; s < page; ++s) sum += __uint_as_float(static_cast<unsigned>(base[s * d]) << 16);
  const double mu = sum / page;
  double acc = 0;
  for (int s = 0; s < page; ++s) {
    const double x = __uint_as_float(static_cast<unsigned>(base[s * d]) << 16) - mu;
    acc += x * x;
  }
  const std::size_t o = (static_cast<std::size_t>(pg) * heads + h) * d + c;
  mean[o] = static_cast<float>(mu);
  m2[o] = static_cast<float>(acc);
}

constexpr int kLayers = 8;  // the "_layers_graph" rows: steps per graph

struct Row {
  std::string kind;
  int ctx, batch, budget;
  double us, bytes;
  double cpu_select_ms = 0;  // CPU Quest selection time of the step (not in us), when known
  // Selection rows of the 8-bit and hierarchical selectors: recall of the flat bf16 GPU
  // selection's pages and the fraction of identical lists (-1: not a selection row).
  double recall = -1, identical = -1;
  int hq = 32;  // q heads (Hkv = 8, d = 128 throughout)
};

constexpr double kBenchAlpha = 1.5;  // the entmax rows

// Writes the rows measured so far (the bench rewrites the file after every shape, so a crash
// keeps what was measured before it).
bool write_rows(const char* json_path, const cudaDeviceProp& prop, const std::vector<Row>& rows) {
  FILE* f = std::fopen(json_path, "w");
  if (!f) {
    std::perror(json_path);
    return false;
  }
  std::fprintf(f, "{\"device\": \"%s\", \"sms\": %d, \"rows\": [\n", prop.name,
               prop.multiProcessorCount);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::fprintf(f,
                 "  {\"kind\": \"%s\", \"ctx\": %d, \"batch\": %d, \"budget\": %d, "
                 "\"us\": %.3f, \"bytes\": %.0f, \"cpu_select_ms\": %.4f, \"recall\": %.5f, "
                 "\"identical\": %.5f, \"hq\": %d}%s\n",
                 r.kind.c_str(), r.ctx, r.batch, r.budget, r.us, r.bytes, r.cpu_select_ms, r.recall,
                 r.identical, r.hq, i + 1 < rows.size() ? "," : "");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);
  return true;
}

int run_bench(const char* json_path) {
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %.0f MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize / 1e6);
  const int Hkv = 8, d = 128, P = 16;  // Hq per shape: 32, and 64 (group 8) at two contexts
  const int kIters = 100, kWarm = 10;
  // 2M tokens (8.6 GB of K and V): the largest shape, 16 sequences of 128K, in one cache.
  const int pool_pages = (1 << 21) / P;
  const std::size_t elems = static_cast<std::size_t>(pool_pages) * Hkv * P * d;
  DevBuf<std::uint16_t> K(elems), V(elems);
  fill_kernel<<<4096, 256>>>(K.p, elems, 1, 2.f);
  fill_kernel<<<4096, 256>>>(V.p, elems, 1ull << 40, 1.f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  std::vector<Row> rows;
  // Ceiling: read K and V once (4.29 GB).
  {
    DevBuf<unsigned> sink(1);
    const std::size_t n16 = elems * 2 / 16;
    const int grid = prop.multiProcessorCount * 8;
    const double us = time_us(3, 20, [&](int i) {
      read_kernel<<<grid, 512>>>(reinterpret_cast<const uint4*>(i % 2 ? V.p : K.p), n16, sink.p);
    });
    const double us2 = time_us(2, 10, [&](int) {
      read_kernel<<<grid, 512>>>(reinterpret_cast<const uint4*>(K.p), n16, sink.p);
      read_kernel<<<grid, 512>>>(reinterpret_cast<const uint4*>(V.p), n16, sink.p);
    });
    rows.push_back({"ceiling_read", 0, 0, 0, us, static_cast<double>(elems) * 2});
    rows.push_back({"ceiling_read_KV", 0, 0, 0, us2, static_cast<double>(elems) * 4});
    CK(cudaGetLastError());
  }
  // The launch floor of a step timed this way: one, two and four empty kernels in a row in one
  // CUDA graph (what a step of that many launches costs before it moves a byte).
  for (const int kernels : {1, 2, 4}) {
    const double us = time_graph_us(1, kWarm, kIters, [&](int, cudaStream_t st) {
      for (int k = 0; k < kernels; ++k) empty_kernel<<<1, 32, 0, st>>>();
    });
    rows.push_back({"floor_graph_" + std::to_string(kernels), 0, 0, 0, us, 0});
    std::printf("launch floor: %d empty kernel(s) in one CUDA graph %.1f us\n", kernels, us);
  }

  // Summaries of the whole pool for the CPU Quest selector (selection time not measured).
  std::vector<float> smin, smax;
  {
    const std::size_t n = static_cast<std::size_t>(pool_pages) * Hkv * d;
    DevBuf<float> mn(n), mx(n);
    summaries_kernel<<<dim3(pool_pages, Hkv), d>>>(K.p, Hkv, P, d, mn.p, mx.p);
    CK(cudaGetLastError());
    smin = mn.download();
    smax = mx.download();
  }
  std::vector<float> smean, sm2;
  std::vector<std::int32_t> scount(static_cast<std::size_t>(pool_pages), P);
  {
    const std::size_t n = static_cast<std::size_t>(pool_pages) * Hkv * d;
    DevBuf<float> mu(n), m2(n);
    moments_kernel<<<dim3(pool_pages, Hkv), d>>>(K.p, Hkv, P, d, mu.p, m2.p);
    CK(cudaGetLastError());
    smean = mu.download();
    sm2 = m2.download();
  }
  // The page moments on the device (the top-p rows read them).
  DevBuf<float> d_mean = to_device(smean), d_m2 = to_device(sm2);
  DevBuf<std::int32_t> d_count = to_device(scount);
  kv::SummariesView dsumm;
  dsumm.mean = d_mean.p;
  dsumm.m2 = d_m2.p;
  dsumm.count = d_count.p;
  dsumm.num_pages = pool_pages;
  dsumm.num_kv_heads = Hkv;
  dsumm.head_dim = d;
  kv::SummariesView summ;
  summ.min = smin.data();
  summ.max = smax.data();
  summ.mean = smean.data();
  summ.m2 = sm2.data();
  summ.count = scount.data();
  summ.num_pages = pool_pages;
  summ.num_kv_heads = Hkv;
  summ.head_dim = d;
  // The outward-rounded bf16 store the GPU selector reads (the summaries of bf16 keys are
  // bf16 values, so the rounding is exact here and CPU and GPU rank the same bounds).
  select::BoundStoreView dstore;
  DevBuf<std::uint16_t> store_min, store_max;
  const select::BoundStore store(summ);  // kept: the group stores are built from it
  {
    const select::BoundStoreView hv = store.view();
    const std::size_t n = static_cast<std::size_t>(pool_pages) * Hkv * d;
    store_min = DevBuf<std::uint16_t>(n);
    store_max = DevBuf<std::uint16_t>(n);
    store_min.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
    store_max.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
    dstore = hv;
    dstore.min = reinterpret_cast<const bf16*>(store_min.p);
    dstore.max = reinterpret_cast<const bf16*>(store_max.p);
    dstore.wmax = nullptr;
  }
  // The 8-bit store of the same summaries.
  const Store8Gpu store8 = upload_store8(select::BoundStore8(summ).view());
  cuda::SelectWorkspace sws;
  // The whole-step rows' append: the step's token goes into its sequence's last page, its
  // summaries and a scratch bf16 bound store (the selector keeps reading `dstore`, equal to
  // the CPU's summaries, so the selection the other rows compare is unchanged).
  AppendTarget app(pool_pages, Hkv, d, true);
  cuda::AppendWorkspace aws;
  constexpr int kMaxBatch = 16;
  DevBuf<float> app_k(static_cast<std::size_t>(kMaxBatch) * Hkv * d), app_v(app_k.n);
  CK(cudaMemset(app_k.p, 0, app_k.n * sizeof(float)));
  CK(cudaMemset(app_v.p, 0, app_v.n * sizeof(float)));
  const std::int64_t pool_stride_page = static_cast<std::int64_t>(Hkv) * P * d;

  cuda::DecodeWorkspace ws;
  Rng rng(42);
  struct Shape {
    int ctx, batch, hq = 32;
  };
  const Shape shapes[] = {{1024, 1},      {32768, 1},      {131072, 1},
                          {524288, 1},    {1048576, 1},    {32768, 16},
                          {131072, 16},   {131072, 1, 64}, {1048576, 1, 64}};
  for (const Shape& sh : shapes) {
    const int Hq = sh.hq;
    const std::size_t first_row = rows.size();  // this shape's rows get hq below
    std::printf("-- ctx=%d B=%d Hq=%d Hkv=%d d=%d\n", sh.ctx, sh.batch, Hq, Hkv, d);
    const int pages = sh.ctx / P;
    const double kv_bytes = static_cast<double>(sh.batch) * sh.ctx * Hkv * d * 2 * 2;
    const int rot = kv_bytes < 400e6 ? 8 : 1;  // rotate layer-sized caches past the L2
    const int seq_pages = pages * sh.batch;
    if (seq_pages * rot > pool_pages) {
      std::printf("skip ctx=%d B=%d: pool too small\n", sh.ctx, sh.batch);
      continue;
    }
    // Tables: rotation r owns pool pages [r * seq_pages, (r+1) * seq_pages), shuffled.
    std::vector<std::vector<std::int32_t>> indices(rot), indptr(rot), last(rot);
    std::vector<DevBuf<std::int32_t>> d_indices, d_indptr, d_last;
    // Queries rotate over kQRot vectors whatever `rot` is: a sparse step's selection follows
    // its q, so rotating q rotates the selected pages too (a budget of 8192 tokens is 34 MB of
    // KV, inside the 50 MB L2: one fixed selection would be served from L2).
    constexpr int kQRot = 8;
    std::vector<std::vector<float>> qh(kQRot);
    std::vector<DevBuf<float>> d_q, d_out, d_lse;
    for (int r = 0; r < kQRot; ++r) {
      qh[r].resize(static_cast<std::size_t>(sh.batch) * Hq * d);
      for (float& x : qh[r]) x = rng.sym(3.f);
      d_q.push_back(to_device(qh[r]));
      d_out.emplace_back(qh[r].size());
      d_lse.emplace_back(static_cast<std::size_t>(sh.batch) * Hq);
    }
    for (int r = 0; r < rot; ++r) {
      indices[r].resize(seq_pages);
      std::iota(indices[r].begin(), indices[r].end(), r * seq_pages);
      for (int i = seq_pages - 1; i > 0; --i)
        std::swap(indices[r][i], indices[r][rng.below(i + 1)]);
      for (int b = 0; b <= sh.batch; ++b) indptr[r].push_back(b * pages);
      last[r].assign(sh.batch, P);
      const kv::PagedKVView hv =
          bf16_hnd_pool(K.p, V.p, pool_pages, Hkv, P, d, {indptr[r], indices[r], last[r]});
      hv.validate();  // host-side validation where the table is built
      d_indices.push_back(to_device(indices[r]));
      d_indptr.push_back(to_device(indptr[r]));
      d_last.push_back(to_device(last[r]));
    }
    // The step's token slot per table: each sequence's last page, its last slot.
    std::vector<DevBuf<std::int32_t>> d_app_page;
    DevBuf<std::int32_t> d_app_slot = to_device(std::vector<std::int32_t>(sh.batch, P - 1));
    for (int r = 0; r < rot; ++r) {
      std::vector<std::int32_t> lastp(sh.batch);
      for (int b = 0; b < sh.batch; ++b) lastp[b] = indices[r][(b + 1) * pages - 1];
      d_app_page.push_back(to_device(lastp));
    }
    const auto append_args = [&](int r) {
      cuda::AppendArgs aa =
          app.args(K.p, V.p, DType::bf16, P, pool_stride_page, static_cast<std::int64_t>(P) * d, d);
      aa.k = View3<const float>::contiguous(app_k.p, sh.batch, Hkv, d);
      aa.v = View3<const float>::contiguous(app_v.p, sh.batch, Hkv, d);
      aa.page = {d_app_page[r % rot].p, static_cast<std::size_t>(sh.batch)};
      aa.slot = {d_app_slot.p, static_cast<std::size_t>(sh.batch)};
      return aa;
    };
    // Step r: page table r % rot, query r % kQRot.
    auto args_for = [&](int r) {
      const int t = r % rot;
      r %= kQRot;
      attn::DecodeArgs a;
      a.q = View3<const float>::contiguous(d_q[r].p, sh.batch, Hq, d);
      a.cache = bf16_hnd_pool(K.p, V.p, pool_pages, Hkv, P, d,
                              {{d_indptr[t].p, d_indptr[t].n},
                               {d_indices[t].p, d_indices[t].n},
                               {d_last[t].p, d_last[t].n}});
      a.out = View3<float>::contiguous(d_out[r].p, sh.batch, Hq, d);
      a.lse_or_tau = {d_lse[r].p, d_lse[r].n};
      return a;
    };
    cuda::DecodeLaunch launch;
    launch.workspace = &ws;
    launch.max_pages_per_seq = pages;
    launch.check_errors = false;
    // Median µs of decode(args(step % n_rot)): plain launches, and replayed from CUDA graphs.
    const auto time_decode = [&](int n_rot, const auto& args) {
      const double plain =
          time_us(kWarm, kIters, [&](int i) { cuda::decode(args(i % n_rot), launch); });
      ws.check(nullptr);
      const double graph = time_graph_us(n_rot, kWarm, kIters, [&](int r, cudaStream_t st) {
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(args(r), l);
      });
      ws.check(nullptr);
      return std::pair<double, double>{plain, graph};
    };
    const auto [us, gus] = time_decode(rot, args_for);
    rows.push_back({"ours_dense_graph", sh.ctx, sh.batch, 0, gus, kv_bytes});
    if (sh.batch == 1 && Hq == 32) {  // per layer in a kLayers-layer graph (cuDNN: torch_peer)
      const double lus = time_layers_graph_us(kLayers, kWarm, kIters, [&](int r, cudaStream_t st) {
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(args_for(r % rot), l);
      });
      ws.check(nullptr);
      rows.push_back({"ours_dense_layers_graph", sh.ctx, sh.batch, 0, lus, kv_bytes});
      std::printf("dense  ctx=%7d B=%2d: per layer in a %d-layer graph %.1f us\n", sh.ctx,
                  sh.batch, kLayers, lus);
    }
    const int cp = cuda::planned_chunk_pages(DType::bf16, d, sh.batch, Hkv, Hq, pages);
    std::printf(
        "dense  ctx=%7d B=%2d rot=%d chunk_pages(plan)=%d: %9.1f us  %7.1f GB/s "
        "(graph %.1f us)\n",
        sh.ctx, sh.batch, rot, cp, us, kv_bytes / us / 1e3, gus);
    rows.push_back({"ours_dense", sh.ctx, sh.batch, 0, us, kv_bytes});
    if (sh.batch == 1 && sh.ctx >= 131072) {
      // Smaller chunks than planned (several waves of CTAs): whether the tail of one wave
      // (CTAs that finish late) costs more than the extra partials and launches.
      for (int waves : {2, 4}) {
        launch.chunk_pages = std::max(8, (cp + waves - 1) / waves);
        const auto [wus, wgus] = time_decode(rot, args_for);
        std::printf(
            "dense  ctx=%7d B=%2d chunk_pages=%d (%d x planned chunks): %9.1f us "
            "(graph %.1f us), planned / this %.3f\n",
            sh.ctx, sh.batch, launch.chunk_pages, waves, wus, wgus, us / wus);
        rows.push_back({"ours_dense_chunks_x" + std::to_string(waves) + "_graph", sh.ctx, sh.batch,
                        0, wgus, kv_bytes});
      }
      launch.chunk_pages = 0;
    }
    {  // The SIMT softmax kernel side by side (the automatic choice is the tensor-core one).
      launch.kernel = cuda::DecodeLaunch::Kernel::simt;
      const auto [sus, sgus] = time_decode(rot, args_for);
      launch.kernel = cuda::DecodeLaunch::Kernel::automatic;
      std::printf("dense SIMT kernel ctx=%7d B=%2d: %9.1f us  %7.1f GB/s (graph %.1f us)\n", sh.ctx,
                  sh.batch, sus, kv_bytes / sus / 1e3, sgus);
      rows.push_back({"ours_dense_simt", sh.ctx, sh.batch, 0, sus, kv_bytes});
      rows.push_back({"ours_dense_simt_graph", sh.ctx, sh.batch, 0, sgus, kv_bytes});
    }

    // 1.5-entmax, dense. Bytes: K only (V is read at the support rows alone, a few per head
    // with these random scores), so GB/s is a lower bound of what moved.
    const auto ent_args = [&](int r) {
      attn::DecodeArgs a = args_for(r);
      a.mapping = Mapping::entmax(kBenchAlpha);
      return a;
    };
    const auto [eus, egus] = time_decode(rot, ent_args);
    std::printf("entmax dense ctx=%7d B=%2d: %9.1f us (graph %.1f us), softmax %.1f us: %.2fx\n",
                sh.ctx, sh.batch, eus, egus, us, eus / us);
    rows.push_back({"ours_entmax_dense", sh.ctx, sh.batch, 0, eus, kv_bytes / 2});
    rows.push_back({"ours_entmax_dense_graph", sh.ctx, sh.batch, 0, egus, kv_bytes / 2});

    // Sparse, kQRot steps in rotation (query r, table r % rot), per budget:
    //  - CPU Quest selection (f32 summaries) computed and uploaded beforehand: decode only;
    //  - GPU Quest selection (bf16 store) + decode in the step, plain and CUDA-graph captured;
    //  - the GPU selection alone, and its scoring kernel alone.
    const double summary_bytes = static_cast<double>(sh.batch) * pages * Hkv * d * 2 * 2;
    // MASSKV_BENCH_COMPACT=0 leaves out the rows past the flat Quest ones (top-k alone, 8-bit,
    // hierarchical, entmax-aware, top-p).
    static const bool compact_rows = [] {
      const char* e = std::getenv("MASSKV_BENCH_COMPACT");
      return e == nullptr || std::string(e) != "0";
    }();
    static const bool fused_rows = bench_fused_rows();
    // Their group stores (groups of 16 pages) and moment stores (64 pages), one per page
    // table: the same for every budget.
    constexpr int kMomentPages = 64;
    std::vector<GroupGpu> groups;
    std::vector<MomentGpu> mgpu;
    for (int t = 0; compact_rows && t < rot; ++t) {
      const kv::PageTable table{indptr[t], indices[t], last[t]};
      groups.push_back(upload_groups(select::GroupStore(store.view(), table, 16)));
      mgpu.push_back(upload_moments(select::MomentStore(summ, table, kMomentPages)));
    }
    for (int budget : {2048, 4096, 8192}) {
      select::TopkPolicy pol;
      pol.budget_pages = budget / P;
      pol.sink_pages = 1;
      pol.window_tokens = 0;
      std::vector<SelectionStorage> sels(kQRot);
      std::vector<DevBuf<std::int32_t>> s_ids, s_cnt;
      std::vector<SelectionView> svs(kQRot);
      double sel_pages = 0;
      const auto ts = std::chrono::steady_clock::now();
      for (int r = 0; r < kQRot; ++r) {
        const int t = r % rot;
        select::QuestArgs qa;
        qa.q = View3<const float>::contiguous(qh[r].data(), sh.batch, Hq, d);
        qa.table = {indptr[t], indices[t], last[t]};
        qa.page_size = P;
        qa.summaries = &summ;
        qa.policy = pol;
        select::quest_select(qa, sels[r]);
        for (int c : sels[r].count) sel_pages += c;
        s_ids.push_back(to_device(sels[r].ids));
        s_cnt.push_back(to_device(sels[r].count));
      }
      const double sel_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - ts).count() /
          kQRot;
      for (int r = 0; r < kQRot; ++r)
        svs[r] = {SelectionView::Unit::page, sels[r].batch,
                  sels[r].num_kv_heads,      sels[r].max_per_head,
                  {s_ids[r].p, s_ids[r].n},  {s_cnt[r].p, s_cnt[r].n}};
      const double bytes = sel_pages / kQRot * P * d * 2 * 2;
      const auto sparse_args = [&](int r, bool entmax) {
        attn::DecodeArgs a = entmax ? ent_args(r) : args_for(r);
        a.selection = &svs[r % kQRot];
        return a;
      };
      const auto [sus, sgus] = time_decode(kQRot, [&](int r) { return sparse_args(r, false); });
      std::printf(
          "sparse ctx=%7d B=%2d budget=%5d: %9.1f us  %7.1f GB/s (graph %.1f us; CPU Quest "
          "select %.2f ms, not in the time)\n",
          sh.ctx, sh.batch, budget, sus, bytes / sus / 1e3, sgus, sel_ms);
      Row cpu_row{"ours_sparse_quest_cpu_sel", sh.ctx, sh.batch, budget, sus, bytes, sel_ms};
      rows.push_back(cpu_row);
      cpu_row.kind = "ours_sparse_quest_cpu_sel_graph";
      cpu_row.us = sgus;
      rows.push_back(cpu_row);

      // 1.5-entmax on the same selections (decode only; K bytes, as the dense entmax rows).
      const auto [esus, esgus] = time_decode(kQRot, [&](int r) { return sparse_args(r, true); });
      std::printf(
          "entmax sparse ctx=%7d B=%2d budget=%5d: %9.1f us (graph %.1f us); softmax %.1f us "
          "(graph %.1f): %.2fx (graph %.2fx)\n",
          sh.ctx, sh.batch, budget, esus, esgus, sus, sgus, esus / sus, esgus / sgus);
      rows.push_back(
          {"ours_entmax_sparse_quest_cpu_sel", sh.ctx, sh.batch, budget, esus, bytes / 2, sel_ms});
      rows.push_back({"ours_entmax_sparse_quest_cpu_sel_graph", sh.ctx, sh.batch, budget, esgus,
                      bytes / 2, sel_ms});
      {  // The split-K entmax path (three kernels) on the same selections, side by side.
        launch.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::split;
        const auto [xus, xgus] = time_decode(kQRot, [&](int r) { return sparse_args(r, true); });
        launch.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::automatic;
        std::printf(
            "entmax sparse split-K ctx=%7d B=%2d budget=%5d: %9.1f us (graph %.1f us); "
            "automatic (cluster) / split-K %.2f (graph %.2f)\n",
            sh.ctx, sh.batch, budget, xus, xgus, esus / xus, esgus / xgus);
        rows.push_back({"ours_entmax_sparse_split_quest_cpu_sel", sh.ctx, sh.batch, budget, xus,
                        bytes / 2, sel_ms});
        rows.push_back({"ours_entmax_sparse_split_quest_cpu_sel_graph", sh.ctx, sh.batch, budget,
                        xgus, bytes / 2, sel_ms});
      }

      // GPU selection into per-rotation device lists, consumed by the same decode.
      const int cap = cuda::select_capacity(pages, P, pol);
      DeviceLists glists(kQRot, sh.batch, Hkv, cap);
      auto& g_ids = glists.ids;
      auto& g_cnt = glists.count;
      auto& gsv = glists.views;
      auto sel_args = [&](int r) {
        const int t = r % rot;
        r %= kQRot;
        cuda::QuestSelectArgs sa;
        sa.q = View3<const float>::contiguous(d_q[r].p, sh.batch, Hq, d);
        sa.table = {{d_indptr[t].p, d_indptr[t].n},
                    {d_indices[t].p, d_indices[t].n},
                    {d_last[t].p, d_last[t].n}};
        sa.page_size = P;
        sa.bounds = dstore;
        sa.policy = pol;
        sa.max_per_head = cap;
        sa.ids = {g_ids[r].p, g_ids[r].n};
        sa.count = {g_cnt[r].p, g_cnt[r].n};
        return sa;
      };
      cuda::SelectLaunch sl = env_select_launch();
      sl.workspace = &sws;
      sl.max_pages_per_seq = pages;
      sl.check_errors = false;
      // Same selection as the CPU's? (bf16-exact summaries: expected identical.)
      int same = 0;
      for (int r = 0; r < kQRot; ++r) {
        cuda::quest_select(sel_args(r), sl);
        sws.check(nullptr);
        const auto ids = g_ids[r].download();
        const auto cnt = g_cnt[r].download();
        bool eq = cnt == sels[r].count;
        for (int b = 0; eq && b < sh.batch; ++b)
          for (int h = 0; eq && h < Hkv; ++h) {
            const auto l = sels[r].view().list(b, h);
            eq = std::equal(l.begin(), l.end(), ids.begin() + (b * Hkv + h) * cap);
          }
        same += eq;
      }
      const double gsel_us =
          time_us(kWarm, kIters, [&](int i) { cuda::quest_select(sel_args(i), sl); });
      const double gscore_us =
          time_us(kWarm, kIters, [&](int i) { cuda::quest_score(sel_args(i), sl); });
      sws.check(nullptr);
      const double gus_plain = time_us(kWarm, kIters, [&](int i) {
        cuda::quest_select(sel_args(i), sl);
        attn::DecodeArgs a = args_for(i);
        a.selection = &gsv[i % kQRot];
        cuda::decode(a, launch);
      });
      sws.check(nullptr);
      ws.check(nullptr);
      // A step of rotation r: select_fn(r, stream), then the sparse decode on its lists.
      const auto sparse_step = [&](const auto& select_fn, bool entmax, int r, cudaStream_t st) {
        select_fn(r, st);
        attn::DecodeArgs a = entmax ? ent_args(r) : args_for(r);
        a.selection = &gsv[r];
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(a, l);
      };
      // A step in one CUDA graph per rotation.
      const auto step_graph = [&](const auto& select_fn, bool entmax = false) {
        const double us = time_graph_us(kQRot, kWarm, kIters, [&](int r, cudaStream_t st) {
          sparse_step(select_fn, entmax, r, st);
        });
        sws.check(nullptr);
        ws.check(nullptr);
        return us;
      };
      // The same step per layer, kLayers steps (rotations 0 .. kLayers - 1) in one graph.
      static_assert(kLayers <= kQRot, "a layer per query rotation");
      // Returns the µs per layer, or -1 off the shapes that have these rows.
      const bool layer_shape = sh.batch == 1 && Hq == 32 && budget == 4096;  // as torch_peer.py
      const auto layers_graph_row = [&](const std::string& kind, double row_bytes,
                                        const auto& layer_fn) {
        if (!layer_shape) return -1.0;
        const double us = time_layers_graph_us(kLayers, kWarm, kIters, layer_fn);
        sws.check(nullptr);
        ws.check(nullptr);
        std::printf("  %s ctx=%7d: per layer in a %d-layer graph %.1f us\n", kind.c_str(), sh.ctx,
                    kLayers, us);
        rows.push_back({kind, sh.ctx, sh.batch, budget, us, row_bytes});
        return us;
      };
      const auto layers_row = [&](const std::string& kind, double row_bytes,
                                  const auto& select_fn) {
        return layers_graph_row(kind, row_bytes, [&](int r, cudaStream_t st) {
          sparse_step(select_fn, false, r, st);
        });
      };
      const auto quest = [&](int r, cudaStream_t st) {
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        cuda::quest_select(sel_args(r), l2);
      };
      const double gus_graph = step_graph(quest);
      // Selection reuse (SessionOptions::reselect_every): a step between two selections
      // extends the last lists (cuda::extend_kept, from the lists quest just left in g_ids)
      // and decodes on them; a selection serving R steps costs (fresh + (R - 1) x reuse) / R
      // per step, both timed here as graphs. Quality: masskv reuse (docs/study.md).
      const int e_cap = cap + (pol.window_tokens + P - 1) / P + 2;
      DeviceLists elists(kQRot, sh.batch, Hkv, e_cap);
      auto& e_ids = elists.ids;
      auto& e_cnt = elists.count;
      auto& esv = elists.views;
      const auto reuse_step = [&](int r, cudaStream_t st) {
        const cuda::QuestSelectArgs sa = sel_args(r);
        cuda::ExtendKeptArgs ea;
        ea.table = sa.table;
        ea.page_size = P;
        ea.policy = pol;
        ea.max_in = cap;
        ea.ids_in = {g_ids[r].p, g_ids[r].n};
        ea.count_in = {g_cnt[r].p, g_cnt[r].n};
        ea.max_per_head = e_cap;
        ea.ids = {e_ids[r].p, e_ids[r].n};
        ea.count = {e_cnt[r].p, e_cnt[r].n};
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        cuda::extend_kept(ea, l2);
        attn::DecodeArgs a = args_for(r);
        a.selection = &esv[r];
        cuda::DecodeLaunch l = launch;
        l.stream = st;
        cuda::decode(a, l);
      };
      const double reuse_us = time_graph_us(kQRot, kWarm, kIters, reuse_step);
      sws.check(nullptr);
      ws.check(nullptr);
      rows.push_back({"ours_sparse_reuse_step_graph", sh.ctx, sh.batch, budget, reuse_us, bytes});
      // The reuse step per layer of a model's decode graph (extend_kept's input: the lists each
      // rotation's selection left in g_ids above).
      const double reuse_layer_us = layers_graph_row("ours_sparse_reuse_layers_graph", bytes,
                                                     reuse_step);
      // Amortised rows of a selector whose fresh step (select + decode) took fresh_us: as
      // standalone graphs, and per layer of the layers graph where fresh_layer_us >= 0.
      const auto reuse_rows = [&](const std::string& tag, double fresh_us, double sel_bytes,
                                  double fresh_layer_us) {
        const auto amortised = [&](const std::string& kind, double fresh, double reuse, int R) {
          const double us = (fresh + (R - 1) * reuse) / R;
          std::printf("  reuse ctx=%7d B=%2d budget=%5d: %s every %2d steps %.1f us per step "
                      "(fresh %.1f, reuse %.1f)\n",
                      sh.ctx, sh.batch, budget, kind.c_str(), R, us, fresh, reuse);
          rows.push_back({kind, sh.ctx, sh.batch, budget, us, bytes + sel_bytes / R});
        };
        for (const int R : {4, 8, 16}) {
          const std::string kind = "ours_sparse_" + tag + "_gpu_sel_reuse" + std::to_string(R);
          amortised(kind + "_graph", fresh_us, reuse_us, R);
          if (fresh_layer_us >= 0 && reuse_layer_us >= 0)
            amortised(kind + "_layers_graph", fresh_layer_us, reuse_layer_us, R);
        }
      };
      reuse_rows("quest", gus_graph, summary_bytes,
                 layers_row("ours_sparse_quest_gpu_sel_layers_graph", bytes + summary_bytes, quest));
      // The whole decode step of issue 7 item 4 in one graph: append, select, attend.
      const double append_step = step_graph([&](int r, cudaStream_t st) {
        cuda::append(append_args(r), aws, st, false);
        quest(r, st);
      });
      aws.check(nullptr);
      std::printf("  step ctx=%7d B=%2d budget=%5d: append+select+decode graph %.1f us\n", sh.ctx,
                  sh.batch, budget, append_step);
      rows.push_back({"ours_step_append_select_decode_graph", sh.ctx, sh.batch, budget, append_step,
                      bytes + summary_bytes});
      std::printf(
          "  gpu-sel ctx=%7d B=%2d budget=%5d: select+decode %9.1f us (graph %.1f us); select "
          "%.1f us, score %.1f us; GPU selection == CPU selection in %d/%d steps\n",
          sh.ctx, sh.batch, budget, gus_plain, gus_graph, gsel_us, gscore_us, same, kQRot);
      rows.push_back({"ours_sparse_quest_gpu_sel", sh.ctx, sh.batch, budget, gus_plain,
                      bytes + summary_bytes});
      rows.push_back({"ours_sparse_quest_gpu_sel_graph", sh.ctx, sh.batch, budget, gus_graph,
                      bytes + summary_bytes});
      rows.push_back({"gpu_quest_select", sh.ctx, sh.batch, budget, gsel_us, summary_bytes});
      rows.push_back({"gpu_quest_score", sh.ctx, sh.batch, budget, gscore_us, summary_bytes});
      // Two-stage selection + token decode (two_stage_check.cu), the default candidate factor
      // and factor 0 (token_codes), beside flat Quest; MASSKV_BENCH_TWO_STAGE=0 leaves it out (scripts/gpu.sh, when its
      // check failed).
      static const bool two_stage_rows = [] {
        const char* e = std::getenv("MASSKV_BENCH_TWO_STAGE");
        return e == nullptr || std::string(e) != "0";
      }();
      if (two_stage_rows && budget == 4096 && sh.batch == 1 && Hq == 32 &&
          (sh.ctx == 32768 || sh.ctx == 131072 || sh.ctx == 1048576)) {
        TwoStageBenchShape ts;
        ts.ctx = sh.ctx;
        ts.batch = sh.batch;
        ts.hq = Hq;
        ts.hkv = Hkv;
        ts.d = d;
        ts.page = P;
        ts.pool_pages = pool_pages;
        ts.budget = budget;
        ts.sink_pages = pol.sink_pages;
        ts.window_tokens = pol.window_tokens;
        ts.k = K.p;
        ts.v = V.p;
        ts.host_min = smin.data();
        ts.host_max = smax.data();
        ts.store = dstore;
        for (int t = 0; t < rot; ++t) ts.tables.push_back(sel_args(t).table);
        for (int r = 0; r < kQRot; ++r) ts.q.push_back(d_q[r].p);
        ts.decode_ws = &ws;
        for (const TwoStageBenchRow& x : bench_two_stage(ts))
          rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        ts.factor = 0;  // token_codes: every page a candidate
        for (const TwoStageBenchRow& x : bench_two_stage(ts))
          rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        ts.log_prob = true;  // token_codes, the heads pooled by log-probability
        for (const TwoStageBenchRow& x : bench_two_stage(ts))
          rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        // token_codes in two passes (rows ..._2p): 3/8 of the channels for every token, its
        // best 2 x budget tokens on every channel (the CPU default, the selection lab's
        // cascade), both rules.
        ts.code_channels = 0.375;
        ts.code_candidates = 2;
        for (const bool lp : {false, true}) {
          ts.log_prob = lp;
          for (const TwoStageBenchRow& x : bench_two_stage(ts))
            rows.push_back({x.kind, sh.ctx, sh.batch, budget, x.us, x.bytes});
        }
      }
      if (!compact_rows) continue;
      // Every compact row at 4096 tokens; at 2048 and 8192 the hierarchical selection (cover 2)
      // and the entmax-aware one (fixed budget) alone, the budgets issue 7 asks of both.
      const bool full = budget == 4096;

      // Top-k alone (on the keys the last scoring left), the 8-bit store, the hierarchical
      // selector: selection alone and the whole step (select + decode) in one CUDA graph,
      // bytes each reads, and the recall of the flat bf16 selection (GPU lists) per rotation.
      const double key_bytes = static_cast<double>(sh.batch) * Hkv * pages * 4;
      cuda::quest_score(sel_args(0), sl);
      const double topk_us =
          full ? time_us(kWarm, kIters, [&](int i) { cuda::quest_topk(sel_args(i), sl); }) : 0;
      if (full) rows.push_back({"gpu_quest_topk", sh.ctx, sh.batch, budget, topk_us, key_bytes});
      const auto sel8_args = [&](int r) {
        cuda::QuestSelectArgs a = sel_args(r);
        a.bounds8 = store8.view;
        return a;
      };
      // Flat lists of every rotation, then each selector's agreement with them.
      std::vector<std::vector<std::int32_t>> flat_ids(kQRot), flat_cnt(kQRot);
      for (int r = 0; r < kQRot; ++r) {
        cuda::quest_select(sel_args(r), sl);
        flat_ids[r] = g_ids[r].download();
        flat_cnt[r] = g_cnt[r].download();
      }
      sws.check(nullptr);
      const auto agreement = [&](const auto& select_fn) {
        long lists = 0, identical = 0;
        double hit = 0, total = 0;
        for (int r = 0; r < kQRot; ++r) {
          select_fn(r);
          sws.check(nullptr);
          const auto ids = g_ids[r].download();
          const auto cnt = g_cnt[r].download();
          const SelectionView ref{
              SelectionView::Unit::page, sh.batch, Hkv, cap, flat_ids[r], flat_cnt[r]};
          const SelectionView got{SelectionView::Unit::page, sh.batch, Hkv, cap, ids, cnt};
          const select::SelectionAgreement a = select::compare_selections(ref, got);
          lists += a.lists;
          identical += a.identical;
          long ref_pages = 0;
          for (int c : flat_cnt[r]) ref_pages += c;
          hit += a.recall * static_cast<double>(ref_pages);
          total += static_cast<double>(ref_pages);
        }
        return std::pair<double, double>{total ? hit / total : 1.0,
                                         lists ? static_cast<double>(identical) / lists : 1.0};
      };
      // One GPU selector, select_fn(step, stream): alone, its agreement with the flat lists,
      // and in the graph step; two rows (selection, step), `sel_bytes` the summaries it reads.
      const auto measure = [&](const std::string& tag, double sel_bytes, const auto& select_fn) {
        const double sel_us = time_us(kWarm, kIters, [&](int i) { select_fn(i, nullptr); });
        sws.check(nullptr);
        const auto [rec, same] = agreement([&](int r) { select_fn(r, nullptr); });
        const double step_us = step_graph(select_fn);
        std::printf(
            "  compact ctx=%7d B=%2d budget=%5d: %-8s select %6.1f us, step (graph) %6.1f us, "
            "%.1f MB, recall %.4f, identical lists %.3f\n",
            sh.ctx, sh.batch, budget, tag.c_str(), sel_us, step_us, sel_bytes / 1e6, rec, same);
        rows.push_back(
            {"gpu_" + tag + "_select", sh.ctx, sh.batch, budget, sel_us, sel_bytes, 0, rec, same});
        rows.push_back({"ours_sparse_" + tag + "_gpu_sel_graph", sh.ctx, sh.batch, budget, step_us,
                        bytes + sel_bytes, 0, rec, same});
        if (tag == "hier") {
          reuse_rows("hier", step_us, sel_bytes,
                     layers_row("ours_sparse_hier_gpu_sel_layers_graph", bytes + sel_bytes,
                                select_fn));
        }
      };
      const auto on = [&](cudaStream_t st) {
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        return l2;
      };
      // 8-bit: the scoring kernel alone too.
      if (full) {
        const double bytes8 = static_cast<double>(sh.batch) * pages * Hkv * (2.0 * d + 8);
        const double score8_us =
            time_us(kWarm, kIters, [&](int i) { cuda::quest_score(sel8_args(i), sl); });
        rows.push_back({"gpu_quest8_score", sh.ctx, sh.batch, budget, score8_us, bytes8});
        std::printf("  compact ctx=%7d B=%2d budget=%5d: top-k %.1f us, 8-bit score %.1f us\n",
                    sh.ctx, sh.batch, budget, topk_us, score8_us);
        measure("quest8", bytes8,
                [&](int r, cudaStream_t st) { cuda::quest_select(sel8_args(r), on(st)); });
      }
      // Hierarchical (groups of 16 pages): every group's bf16 summaries, and the pages of the
      // chosen groups (at most m per (sequence, kv head)); cover 2 and 4, and cover 4 over
      // 8-bit pages.
      const int ngroups = (pages + 15) / 16;
      for (const double cover : {2.0, 4.0}) {
        if (cover == 4.0 && !full) continue;
        const int m = select::hier_groups(ngroups, 16, pol.budget_pages, cover);
        const double group_bytes = static_cast<double>(sh.batch) * Hkv * 4.0 * d * ngroups;
        const double chosen = static_cast<double>(sh.batch) * Hkv * m * 16.0;
        const GroupGpu* gr = groups.data();
        measure(cover == 2.0 ? "hier" : "hier_c4", group_bytes + chosen * 4.0 * d,
                [&](int r, cudaStream_t st) {
                  cuda::hier_select(hier_args(sel_args(r), gr[r % rot], cover), on(st));
                });
        // The same selection in one kernel (SelectLaunch::HierKernel::fused).
        if (fused_rows && full)
          measure(cover == 2.0 ? "hier_fused" : "hier_fused_c4", group_bytes + chosen * 4.0 * d,
                  [&](int r, cudaStream_t st) {
                    cuda::SelectLaunch lf = on(st);
                    lf.hier_kernel = cuda::SelectLaunch::HierKernel::fused;
                    cuda::hier_select(hier_args(sel_args(r), gr[r % rot], cover), lf);
                  });
        if (cover == 4.0)
          measure("hier8_c4", group_bytes + chosen * (2.0 * d + 8), [&](int r, cudaStream_t st) {
            cuda::hier_select(hier_args(sel8_args(r), gr[r % rot], cover), on(st));
          });
      }
      // Entmax-aware hierarchical selection (Gaussian-τ from moments pooled over 64 pages,
      // alpha 1.5, cover 2): the fixed budget and the adaptive rule (margin 0), each in a step
      // with softmax decode (as the Quest rows) and with 1.5-entmax decode (what it is for).
      {
        const int m = select::hier_groups(ngroups, 16, pol.budget_pages, 2.0);
        const double group_bytes = static_cast<double>(sh.batch) * Hkv * 4.0 * d * ngroups;
        const double moment_bytes = static_cast<double>(sh.batch) * Hkv * 8.0 * d *
                                    ((pages + kMomentPages - 1) / kMomentPages);
        const double chosen = static_cast<double>(sh.batch) * Hkv * m * 16.0;
        const GroupGpu* gr = groups.data();
        // The fixed budget and the adaptive rule, then the fixed budget in one kernel
        // (SelectLaunch::HierKernel::fused).
        // Pages the lists of select_fn hold per step, over the rotations (the adaptive rule's
        // and top-p's budget is a cap).
        const auto held_pages = [&](const auto& select_fn) {
          double held = 0;
          for (int r = 0; r < kQRot; ++r) {
            select_fn(r, nullptr);
            sws.check(nullptr);
            for (int c : g_cnt[r].download()) held += c;
          }
          return held / kQRot;
        };
        struct GaussRun {
          bool adaptive, fused;
        };
        for (const GaussRun run : {GaussRun{false, false}, GaussRun{true, false},
                                   GaussRun{false, true}}) {
          const bool adaptive = run.adaptive, fused = run.fused;
          if ((fused && !fused_rows) || ((adaptive || fused) && !full)) continue;
          const auto gauss = [&, adaptive, fused](int r, cudaStream_t st) {
            cuda::HierSelectArgs h = hier_args(sel_args(r), gr[r % rot], 2.0);
            set_moments(h, mgpu[r % rot], kMomentPages, kBenchAlpha, adaptive, 0.f);
            cuda::SelectLaunch lg = on(st);
            if (fused) lg.hier_kernel = cuda::SelectLaunch::HierKernel::fused;
            cuda::hier_select(h, lg);
          };
          const std::string tag = fused ? "gauss_fused" : adaptive ? "gauss_adaptive" : "gauss";
          const double sel_bytes = group_bytes + moment_bytes + chosen * 4.0 * d;
          const double held = held_pages(gauss);
          const double kv_sel = held * P * d * 2 * 2;
          measure(tag, sel_bytes, gauss);
          rows.back().bytes = kv_sel + sel_bytes;  // the step row: the pages actually held
          const double ent_us = step_graph(gauss, true);
          std::printf(
              "  gauss   ctx=%7d B=%2d budget=%5d: %-14s %.0f pages held per step (budget %d x "
              "%d lists); entmax step (graph) %.1f us\n",
              sh.ctx, sh.batch, budget, tag.c_str(), held, pol.budget_pages, sh.batch * Hkv,
              ent_us);
          rows.push_back({"ours_entmax_sparse_" + tag + "_gpu_sel_graph", sh.ctx, sh.batch, budget,
                          ent_us, kv_sel / 2 + sel_bytes});
        }
        // Hierarchical top-p (p = 0.9, cover 2): the group stage, the moment groups' m and v,
        // the masses of the kept and chosen groups' pages from their f32 summaries.
        if (!full) continue;  // the last rows of this budget
        const auto top_p = [&](int r, cudaStream_t st) {
          cuda::HierTopPArgs t;
          t.hier = hier_args(sel_args(r), gr[r % rot], 2.0);
          set_moments(t.hier, mgpu[r % rot], kMomentPages, kBenchAlpha, false, 0.f);
          t.pages = dsumm;
          t.p = 0.9;
          cuda::hier_top_p(t, on(st));
        };
        const double held = held_pages(top_p);
        const double tp_bytes = group_bytes + moment_bytes + chosen * 8.0 * d;
        measure("top_p", tp_bytes, top_p);
        rows.back().bytes = held * P * d * 2 * 2 + tp_bytes;
        std::printf(
            "  top-p   ctx=%7d B=%2d budget=%5d: p 0.9, %.0f pages held per step (budget %d x "
            "%d lists)\n",
            sh.ctx, sh.batch, budget, held, pol.budget_pages, sh.batch * Hkv);
      }
    }
    for (std::size_t i = first_row; i < rows.size(); ++i) rows[i].hq = Hq;
    if (!write_rows(json_path, prop, rows)) return 2;
  }

  return write_rows(json_path, prop, rows) ? 0 : 2;
}

// A few launches of softmax and entmax decode on one shape (B=1, Hq=32, Hkv=8, d=128, bf16,
// page 16, 32K tokens; dense, and sparse with 128 and 512 random pages per kv head), for
// per-kernel times under a profiler: ncu --clock-control none masskv_gpu_bench profile.
int run_profile() {
  const int Hq = 32, Hkv = 8, d = 128, P = 16, pages = 32768 / P;
  const std::size_t elems = static_cast<std::size_t>(pages) * Hkv * P * d;
  DevBuf<std::uint16_t> K(elems), V(elems);
  fill_kernel<<<1024, 256>>>(K.p, elems, 1, 2.f);
  fill_kernel<<<1024, 256>>>(V.p, elems, 1ull << 40, 1.f);
  CK(cudaGetLastError());
  Rng rng(7);
  std::vector<float> qh(static_cast<std::size_t>(Hq) * d);
  for (float& x : qh) x = rng.sym(3.f);
  std::vector<std::int32_t> indices(pages), indptr = {0, pages}, last = {P};
  std::iota(indices.begin(), indices.end(), 0);
  DevBuf<float> q = to_device(qh), out(qh.size()), lse(Hq);
  DevBuf<std::int32_t> d_ind = to_device(indices), d_ptr = to_device(indptr),
                       d_last = to_device(last);
  attn::DecodeArgs a;
  a.q = View3<const float>::contiguous(q.p, 1, Hq, d);
  a.cache = bf16_hnd_pool(K.p, V.p, pages, Hkv, P, d,
                          {{d_ptr.p, d_ptr.n}, {d_ind.p, d_ind.n}, {d_last.p, d_last.n}});
  a.out = View3<float>::contiguous(out.p, 1, Hq, d);
  a.lse_or_tau = {lse.p, lse.n};
  cuda::DecodeWorkspace ws;
  cuda::DecodeLaunch launch;
  launch.workspace = &ws;
  launch.max_pages_per_seq = pages;
  const auto both = [&](const attn::DecodeArgs& base, const char* what) {
    // Plain launches (a few, for the profiler) and CUDA-graph replays (the device time).
    const char* names[5] = {"softmax", "entmax", "entmax-split", "entmax-c8", "entmax-c16"};
    for (int m = 0; m < 5; ++m) {
      attn::DecodeArgs x = base;
      if (m >= 1) x.mapping = Mapping::entmax(kBenchAlpha);
      cuda::DecodeLaunch l = launch;
      if (m == 2) l.entmax_kernel = cuda::DecodeLaunch::EntmaxKernel::split;
      if (m >= 3) l.cluster_size = m == 3 ? 8 : 16;
      if (m >= 2 && !x.selection) continue;  // dense entmax is the split path already
      const double us = time_us(2, 5, [&](int) { cuda::decode(x, l); });
      const double gus = time_graph_us(1, 5, 50, [&](int, cudaStream_t st) {
        cuda::DecodeLaunch lg = l;
        lg.stream = st;
        lg.check_errors = false;
        cuda::decode(x, lg);
      });
      std::printf("profile %-14s %-12s %8.1f us (graph %.1f us)\n", what, names[m], us, gus);
    }
  };
  both(a, "dense 32K");
  for (int budget : {128, 512}) {
    std::vector<std::int32_t> ids(static_cast<std::size_t>(Hkv) * budget), cnt(Hkv, budget);
    for (int h = 0; h < Hkv; ++h) {
      std::vector<std::int32_t> perm(pages);
      std::iota(perm.begin(), perm.end(), 0);
      for (int i = 0; i < budget; ++i) std::swap(perm[i], perm[i + rng.below(pages - i)]);
      std::sort(perm.begin(), perm.begin() + budget);
      std::copy(perm.begin(), perm.begin() + budget, ids.begin() + h * budget);
    }
    DevBuf<std::int32_t> d_ids = to_device(ids), d_cnt = to_device(cnt);
    const SelectionView sv{SelectionView::Unit::page, 1, Hkv, budget, {d_ids.p, d_ids.n},
                           {d_cnt.p, d_cnt.n}};
    attn::DecodeArgs x = a;
    x.selection = &sv;
    both(x, budget == 128 ? "sparse 2048" : "sparse 8192");
  }
  return 0;
}

// Quest scoring and top-k alone at 128K and 1M tokens (B=1, Hq=32, Hkv=8, d=128, page 16,
// 4096-token budget), on shuffled and on sequential page tables, rotated over the 1M-token
// pool so L2 does not serve 128K: for ncu (ncu --clock-control none -k regex:quest_score
// masskv_gpu_bench profile-select) and for timing scoring variants side by side.
// Hierarchical selection with and without the Gaussian-τ ranking on one 128K-token case, a few
// launches each, for per-kernel times under a profiler:
// ncu --clock-control none --metrics gpu__time_duration.sum masskv_gpu_bench profile-gauss.
int run_profile_gauss() {
  SelData sd;
  sd.c = {1, 32, 8, 128, 16, 131072, {256, 1, 64}, 0, 0};
  build_sel_case(sd, 5);
  SelGpu g;
  setup_sel_gpu(sd, g);
  const kv::PageTable table{sd.indptr, sd.indices, sd.last};
  const GroupGpu gg = upload_groups(select::GroupStore(sd.store.view(), table, 16));
  const MomentData md = make_moments(sd, 6);
  const MomentGpu mg = upload_moments(select::MomentStore(md.view(sd.c.hkv, sd.c.d), table, 64));
  cuda::SelectWorkspace ws;
  cuda::SelectLaunch l = env_select_launch();
  l.workspace = &ws;
  l.max_pages_per_seq = sd.max_pages;
  l.check_errors = false;
  for (int rep = 0; rep < 3; ++rep) {
    cuda::hier_select(hier_args(g.args, gg, 2.0), l);
    cuda::HierSelectArgs h = hier_args(g.args, gg, 2.0);
    set_moments(h, mg, 64, 1.5, false, 0.f);
    cuda::hier_select(h, l);
  }
  ws.check(nullptr);
  std::printf("profile-gauss done\n");
  return 0;
}

// hier_only > 0: only that many hierarchical selections per shape (for ncu), no timing.
int run_profile_select(int hier_only = 0) {
  const int Hq = 32, Hkv = 8, d = 128, P = 16, pool_pages = (1 << 20) / P;
  const SummaryPool pool = make_summary_pool(pool_pages, Hkv, d);
  Rng rng(11);
  cuda::SelectWorkspace sws;
  for (const int ctx : {131072, 1048576}) {
    const int pages = ctx / P, rot = pool_pages / pages;
    for (const bool shuffled : {true, false}) {
      cuda::SelectLaunch sl = env_select_launch();
      sl.workspace = &sws;
      sl.max_pages_per_seq = pages;
      sl.check_errors = false;
      const HierCase hc = make_hier_case(pool.store, Hq, P, pages, rot, shuffled, rng, sl);
      using Middle = cuda::SelectLaunch::HierKernel;
      const auto with = [&](Middle m, cudaStream_t st) {
        cuda::SelectLaunch l2 = sl;
        l2.stream = st;
        l2.hier_kernel = m;
        return l2;
      };
      if (hier_only > 0) {  // a few plain calls of each path for ncu's per-kernel times
        for (const Middle m : {Middle::separate, Middle::fused})
          for (int i = 0; i < hier_only; ++i)
            cuda::hier_select(hc.hier_args(i), with(m, nullptr));
        CK(cudaDeviceSynchronize());
        sws.check(nullptr);
        continue;
      }
      // The two paths give the same lists (the check compares both with the CPU).
      long same = 0;
      for (int r = 0; r < rot; ++r) {
        cuda::hier_select(hc.hier_args(r), with(Middle::separate, nullptr));
        const auto want_ids = hc.ids.download();
        const auto want_cnt = hc.cnt.download();
        cuda::hier_select(hc.hier_args(r), with(Middle::fused, nullptr));
        same += hc.ids.download() == want_ids && hc.cnt.download() == want_cnt;
      }
      const double score = time_us(10, 50, [&](int i) { cuda::quest_score(hc.args(i), sl); });
      const double topk = time_us(10, 50, [&](int i) { cuda::quest_topk(hc.args(i), sl); });
      const double sel = time_us(10, 50, [&](int i) { cuda::quest_select(hc.args(i), sl); });
      double hier[2], hier_graph[2];
      for (const Middle m : {Middle::separate, Middle::fused}) {
        const int k = m == Middle::fused ? 1 : 0;
        hier[k] = time_us(10, 50,
                          [&](int i) { cuda::hier_select(hc.hier_args(i), with(m, nullptr)); });
        hier_graph[k] = time_graph_us(rot, 10, 50, [&](int r, cudaStream_t st) {
          cuda::hier_select(hc.hier_args(r), with(m, st));
        });
      }
      sws.check(nullptr);
      const double mb = static_cast<double>(pages) * Hkv * d * 2 * 2 / 1e6;
      std::printf(
          "profile-select ctx=%7d table=%-10s score %7.1f us (%6.1f MB, %5.0f GB/s)  top-k %6.1f "
          "us  select %7.1f us\n"
          "  hier (cover 2): separate %6.1f us (graph %6.1f), one kernel %6.1f us (graph "
          "%6.1f), fused/separate (graph) %.2f, lists identical in %ld/%d rotations%s\n",
          ctx, shuffled ? "shuffled" : "sequential", score, mb, mb * 1e3 / score, topk, sel,
          hier[0], hier_graph[0], hier[1], hier_graph[1], hier_graph[1] / hier_graph[0], same, rot,
          sws.last_hier_fused() ? "" : " (the one kernel did not serve: separate launches twice)");
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  const char* const modes[] = {
      "check",          "decode-check",  "select-selftest", "select-check",
      "select-compact-check", "profile", "profile-select",  "profile-hier [N]",
      "profile-gauss",  "profile-phases", "bench OUT.json", "prefill-check",
      "prefill-bench OUT.json", "append-check", "extend-check", "decode-token-check",
      "two-stage-check", "profile-two-stage"};
  const auto known = [&] {
    for (const std::string_view m : modes)
      if (m.substr(0, m.find(' ')) == mode) return true;
    return false;
  };
  if (!known()) {
    std::fprintf(stderr, "usage: %s", argv[0]);
    for (const char* m : modes) std::fprintf(stderr, "%s %s", m == modes[0] ? "" : " |", m);
    std::fprintf(stderr, "\n");
    return 2;
  }
  try {
    cuda::set_cuda_paths(env_cuda_paths());
    // Which paths the mode runs (include/masskv/cuda/arch.hpp), first in each log.
    std::printf("masskv_gpu_bench %s: %s paths\n", mode.c_str(),
                cuda::hopper_paths() ? "Hopper (sm_90)" : "sm_80");
    if (mode == "check") {
      const int decode_rc = run_check();
      const int selftest = run_select_selftest();
      const int select = run_select_check();
      const int prefill = run_prefill_check();
      const int append = run_append_check();
      const int extend = run_extend_check();
      // Last: the newest kernels (a sticky CUDA error would fail every later section).
      const int compact = run_compact_check();
      const bool bad =
          decode_rc || selftest || select || compact || prefill || append || extend;
      std::printf(
          "ALL CHECKS %s (decode %s, select-selftest %d, select %d, select-compact %d, prefill "
          "%d, append %d, extend_kept %d failure(s))\n",
          bad ? "FAILED" : "PASSED", decode_rc ? "FAILED" : "passed", selftest, select, compact,
          prefill, append, extend);
      return bad ? 1 : 0;
    }
    if (mode == "decode-check") return run_check();
    if (mode == "profile") return run_profile();
    if (mode == "profile-select") return run_profile_select();
    if (mode == "profile-hier") return run_profile_select(argc > 2 ? std::atoi(argv[2]) : 3);
    if (mode == "select-selftest") return run_select_selftest() ? 1 : 0;
    if (mode == "select-check") return run_select_check() ? 1 : 0;
    if (mode == "select-compact-check") return run_compact_check() ? 1 : 0;
    if (mode == "profile-gauss") return run_profile_gauss();
    if (mode == "profile-phases") return run_profile_phases();
    if (mode == "bench") return run_bench(argc > 2 ? argv[2] : "bench_ours.json");
    if (mode == "prefill-check") return run_prefill_check() ? 1 : 0;
    if (mode == "append-check") return run_append_check() ? 1 : 0;
    if (mode == "extend-check") return run_extend_check() ? 1 : 0;
    if (mode == "decode-token-check") return run_decode_token_check() ? 1 : 0;
    if (mode == "two-stage-check") return run_two_stage_check() ? 1 : 0;
    if (mode == "profile-two-stage") return run_profile_two_stage();
    if (mode == "prefill-bench")
      return run_prefill_bench(argc > 2 ? argv[2] : "bench_prefill.json");
  } catch (const Error& e) {
    std::fprintf(stderr, "masskv::Error: %s\n", e.what());
    return 3;
  }
  return 2;  // not reached: every known mode returns above
}
