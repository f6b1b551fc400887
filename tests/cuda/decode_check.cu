// masskv_gpu_tests decode: every CUDA decode kernel against the CPU f64 reference on the case
// grid (common/decode_case.cuh).
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
#include "decode_case.cuh"
#include "checks.hpp"

using namespace masskv;

int run_decode_check() {
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
  std::printf("decode check %s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
  return failures;
}

