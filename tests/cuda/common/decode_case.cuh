// masskv_gpu_bench's decode cases: the case grid's shapes, their host inputs with the f64
// references, the device copies, the comparison and its tolerances (decode_check.cu, select_selftest.cu).
#pragma once

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

#include "gpu_util.cuh"
#include "hier_case.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "select/kept.hpp"

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

inline kv::PagedKVView make_view(const Case& c, int pool_pages, const void* k, const void* v) {
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

inline void build_case(CaseData& cd, std::uint64_t seed) {
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

inline Errors compare(const std::vector<float>& o, const std::vector<float>& lse,
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

inline void setup_gpu(const CaseData& cd, GpuCase& g) {
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

inline int max_pages(const CaseData& cd) {
  int m = 0;
  for (std::size_t b = 0; b + 1 < cd.indptr.size(); ++b)
    m = std::max(m, cd.indptr[b + 1] - cd.indptr[b]);
  return m;
}

inline Errors run_and_compare(GpuCase& g, const attn::DecodeArgs& args, cuda::DecodeLaunch launch,
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
inline bool expect_throw(const char* name, const char* argument, const std::function<void()>& f) {
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
inline bool cluster_serves(const CaseData& cd, int cs) {
  const int per_rank = (std::max(cd.sel.max_per_head, 1) + cs - 1) / cs;
  return (cd.c.d == 64 || cd.c.d == 128) && per_rank * cd.c.page <= 1024;
}

}  // namespace
