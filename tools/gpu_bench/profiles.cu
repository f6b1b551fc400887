// masskv_gpu_bench profile / profile-select / profile-hier / profile-gauss: a few launches of one
// shape each, for ncu.
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
#include "compact_stores.cuh"
#include "gpu_bench.hpp"

using namespace masskv;

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
  cuda::SelectLaunch l = select_launch();
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
int run_profile_select(int hier_only) {
  const int Hq = 32, Hkv = 8, d = 128, P = 16, pool_pages = (1 << 20) / P;
  const SummaryPool pool = make_summary_pool(pool_pages, Hkv, d);
  Rng rng(11);
  cuda::SelectWorkspace sws;
  for (const int ctx : {131072, 1048576}) {
    const int pages = ctx / P, rot = pool_pages / pages;
    for (const bool shuffled : {true, false}) {
      cuda::SelectLaunch sl = select_launch();
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
