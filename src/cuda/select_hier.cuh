// The hierarchical selection's device code that is generic over the scorers (select_score.cuh's
// contract), so that a scorer's file instantiates it: the page top-k over the chosen groups
// (hier_page_topk, run by select_hier.cu's kernel and by the fused kernel) and hier_select in
// one kernel (hier_fused_kernel<group scorer, page scorer>). Host side: select_hier.cu.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "block_select.cuh"
#include "select_common.cuh"
#include "select_score.cuh"

namespace masskv::cuda::select_impl {

// The page-level selection of hier_select for one (sequence, kv head) (hier_page_topk_kernel,
// grid (1, kv heads, batch); hier_fused_kernel's last step): the flat rule (kept pages, then
// the best keys, ties to the lower id) over keys that are 0 outside the chosen groups, found
// from those groups' pages alone. The flat top-k kernels rank every page of the sequence
// (65536 at 1M tokens, 40 µs), although at most groups × 16 can have a key.
//  - Candidates: the pages of the chosen groups (the group top-k's ascending list) inside
//    [sinks, window), as 64-bit (key, ~id) in id order; valid keys are > 0 (ordered_key).
//  - Enough keyed candidates: the top nsel by radix selection, written ascending by a scan.
//  - Fewer (a cover below 1): every keyed page and the lowest-id pages of key 0, as the flat
//    rule, merged in id order by block scans over [sinks, window).
// One (sequence b, kv head h) by the CTA's kHierThreads threads: sp its split
// (topk_split_of(p, b, ...)), gl the chosen groups (ascending), mg of them; s_cand room for
// mg * kWarpPages candidates; s_hist 256, s_pick 3, s_warp kHierThreads / 32 ints of shared
// memory.
__device__ __forceinline__ void hier_page_topk(const SelParams& p, int b, int h,
                                               const TopkSplit& sp, const std::int32_t* gl,
                                               int mg, unsigned long long* s_cand, int* s_hist,
                                               int* s_pick, int* s_warp) {
  const int tid = threadIdx.x;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  std::int32_t* out = p.out_ids + slot * p.max_per_head;
  std::int32_t* out_count = p.out_count + slot;
  const int n = sp.n, sinks = sp.sinks, window = sp.window;
  if (sp.bad || n == 0) {
    for (int i = tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
    if (tid == 0) *out_count = 0;
    return;
  }
  const int s0 = min(sinks, window);
  int nsel = max(sp.total - sp.kept, 0);
  const std::uint32_t* keys = p.keys + slot * p.max_pages;
  const int m = nsel > 0 ? mg * kWarpPages : 0;
  int keyed = 0;
  for (int i = tid; i < m; i += kHierThreads) {
    const int j = gl[i / kWarpPages] * kWarpPages + i % kWarpPages;
    const std::uint32_t key = j >= sinks && j < window ? keys[j] : 0u;
    s_cand[i] = key != 0u ? (static_cast<unsigned long long>(key) << 32) |
                                static_cast<std::uint32_t>(~j)
                          : 0ull;
    keyed += key != 0u;
  }
  int all_keyed = 0;
  block_select::exclusive_scan<kHierThreads>(keyed, s_warp, all_keyed);  // also a barrier
  detail::stamp(p.stamps, p.stamp_score + 1, 2);
  // The adaptive rule takes keyed pages only: the list may be shorter than the budget.
  if (p.adaptive) nsel = min(nsel, all_keyed);
  const int total = sp.kept + nsel;
  for (int j = tid; j < s0; j += kHierThreads) out[j] = j;
  for (int j = window + tid; j < n; j += kHierThreads) out[s0 + nsel + (j - window)] = j;
  for (int i = total + tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
  if (tid == 0) *out_count = total;
  if (nsel == 0) return;
  std::int32_t* dst = out + s0;
  if (all_keyed >= nsel) {
    const unsigned long long thr =
        block_select::radix_threshold<kHierThreads>(s_cand, m, nsel, s_hist, s_pick);
    detail::stamp(p.stamps, p.stamp_score + 1, 3);
    // Candidates are in id order: the taken ones written in that order.
    block_select::ordered_compact<kHierThreads>(
        m, s_warp, [&](int i) { return s_cand[i] >= thr; },
        [&](int i, int r) { dst[r] = static_cast<std::int32_t>(~static_cast<std::uint32_t>(s_cand[i])); });
  } else {
    // Every keyed page plus the first `zeros` pages of key 0, in id order: kHierThreads pages
    // a round, each page's rank among the key-0 pages and among the taken ones by block scans.
    const int zeros = nsel - all_keyed;
    // Keyed: a nonzero key of a chosen group's page (other pages' keys are 0 after both paths;
    // testing membership keeps this rule independent of that).
    const auto chosen = [&](int grp) {  // the list is ascending
      int lo = 0, hi = mg;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (gl[mid] < grp) lo = mid + 1; else hi = mid;
      }
      return lo < mg && gl[lo] == grp;
    };
    int zeros_before = 0, taken_before = 0;
    for (int j0 = sinks; j0 < window && taken_before < nsel; j0 += kHierThreads) {
      const int j = j0 + tid;
      const bool live = j < window;
      const bool keyed_j = live && chosen(j / kWarpPages) && keys[j] != 0u;
      const bool zero_j = live && !keyed_j;
      int round_zeros = 0;
      const int zrank = zeros_before + block_select::exclusive_scan<kHierThreads>(
                                           zero_j ? 1 : 0, s_warp, round_zeros);
      const bool take = keyed_j || (zero_j && zrank < zeros);
      int round_taken = 0;
      const int at = taken_before + block_select::exclusive_scan<kHierThreads>(
                                        take ? 1 : 0, s_warp, round_taken);
      if (take) dst[at] = j;
      zeros_before += round_zeros;
      taken_before += round_taken;
    }
  }
}

// ---- hierarchical selection in one kernel ------------------------------------------------------

constexpr int kFusedThreads = kHierThreads;  // 8 scoring warps (stages fit at d 64 and 128)

// hier_select in one launch (SelectLaunch::HierKernel::fused; hier_launch says when): a
// thread-block cluster of C CTAs per (sequence, kv head), grid (C, kv heads, batch),
// kFusedThreads threads. Why: at B = 1 the four launches of the separate path are each a few
// µs of latency while the bytes they move take well under one (docs/gpu-results.md).
//  0. CTA x scores group tiles [x·T, (x + 1)·T) of the pair (score_kernel's code,
//     score_tiles, on the group store) into the group keys; cluster barrier.
//  1. Every CTA ranks all the pair's group keys itself, as the block top-k does at the group
//     level (the kept groups, then the best others by key, ties to the lower id): the top nsel
//     of the 64-bit (key, ~id) by radix selection, written ascending by an ordered compaction.
//     The CTAs compute the same list from the same keys, so nothing is exchanged; CTA 0 writes
//     it to the workspace (SelectWorkspace::group_ids).
//  2. CTA x scores the tiles of list entries [x·S, (x + 1)·S), S = ceil(count / C) (score_tiles,
//     list mode, on the page store: bf16 or 8-bit); cluster barrier.
//  3. CTA 0 selects the pages (hier_page_topk) from the chosen groups' keys.
// Page keys outside the chosen groups are 0, as after the separate launches (step 0 zeroes the
// sequence's keys). Global writes before each cluster barrier are fenced (__threadfence), so
// the other CTAs read them after it.
// Dynamic shared memory: [0, list_off) the group candidates (1), the scoring stages and q (0,
// 2), the page candidates (3), one after the other; the group list (gstride ints) at list_off.
template <class GS, class PS>
__global__ void __launch_bounds__(kFusedThreads, 1) hier_fused_kernel(SelParams gp, SelParams pp,
                                                                   std::int32_t* gids,
                                                                   std::int32_t* gcount,
                                                                   int gstride, int list_off) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  extern __shared__ uint4 smem_raw[];
  __shared__ int s_hist[256], s_pick[3], s_warp[kFusedThreads / 32];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_raw);
  auto* s_cand = reinterpret_cast<unsigned long long*>(smem);
  auto* s_glist = reinterpret_cast<std::int32_t*>(smem + list_off);
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const int x = blockIdx.x, C = gridDim.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const std::int64_t slot = static_cast<std::int64_t>(b) * gp.num_kv_heads + h;
  // A decode launched next by programmatic dependent launch may be scheduled now (it waits for
  // this grid to finish before it reads anything), so its launch overlaps this selection.
  detail::allow_dependents();
  detail::stamp(gp.stamps, stamps::hier_fused, 0);
  // No early return anywhere: every CTA reaches both cluster barriers.

  // 0. This CTA's share of the page keys set to 0 (the chosen groups' are written in step 2,
  // after the barrier: every other page keeps 0, as after the separate launches), then its
  // group tiles.
  {
    const int n = max(seq_pages(pp, b), 0);
    const int per = (n + C - 1) / C;
    std::uint32_t* keys = pp.keys + slot * pp.max_pages;
    for (int j = x * per + tid; j < min(n, (x + 1) * per); j += kFusedThreads) keys[j] = 0u;
  }
  {
    const int ng = seq_pages(gp, b);  // groups of the sequence (flags a bad group table)
    const int per = ((max(ng, 0) + kWarpPages - 1) / kWarpPages + C - 1) / C * kWarpPages;
    const int j0 = min(max(ng, 0), x * per), j1 = min(max(ng, 0), j0 + per);
    score_tiles<GS>(gp, smem, b, h, ng, nullptr, j0, j1);
  }
  detail::stamp(gp.stamps, stamps::hier_fused, 1);
  __threadfence();
  cluster.sync();  // every CTA's group keys and zeroed page keys written
  detail::stamp(gp.stamps, stamps::hier_fused, 2);

  // 1. The group list (uniform branches: every thread computes the same split).
  const TopkSplit sp = topk_split_of(gp, b, x == 0 && tid == 0);
  const int total = sp.bad || sp.n == 0 ? 0 : sp.total;
  if (total > 0) {
    const int s0 = min(sp.sinks, sp.window);
    const int nsel = max(sp.total - sp.kept, 0);
    for (int j = tid; j < s0; j += kFusedThreads) s_glist[j] = j;
    for (int j = sp.window + tid; j < sp.n; j += kFusedThreads)
      s_glist[s0 + nsel + (j - sp.window)] = j;
    const int lo = sp.sinks, cand = sp.window - sp.sinks;
    std::int32_t* dst = s_glist + s0;
    if (nsel >= cand) {  // every candidate (nsel <= cand: total <= n)
      for (int i = tid; i < nsel; i += kFusedThreads) dst[i] = lo + i;
    } else if (nsel > 0) {
      const std::uint32_t* keys = gp.keys + slot * gp.max_pages;
      for (int i = tid; i < cand; i += kFusedThreads) {
        const int j = lo + i;
        s_cand[i] = (static_cast<unsigned long long>(keys[j]) << 32) |
                    static_cast<std::uint32_t>(~j);
      }
      __syncthreads();
      const unsigned long long thr =
          block_select::radix_threshold<kFusedThreads>(s_cand, cand, nsel, s_hist, s_pick);
      block_select::ordered_compact<kFusedThreads>(
          cand, s_warp, [&](int i) { return s_cand[i] >= thr; },
          [&](int i, int r) { dst[r] = lo + i; });
    }
  }
  __syncthreads();  // the list; the candidates' memory is the scoring's from here on
  detail::stamp(gp.stamps, stamps::hier_fused, 3);
  if (x == 0) {
    std::int32_t* out = gids + slot * gstride;
    for (int i = tid; i < gstride; i += kFusedThreads) out[i] = i < total ? s_glist[i] : -1;
    if (tid == 0) gcount[slot] = total;
  }

  // 2. This CTA's share of the chosen groups' pages.
  {
    const int share = (total + C - 1) / C;
    const int j0 = min(total, x * share), j1 = min(total, j0 + share);
    score_tiles<PS>(pp, smem, b, h, seq_pages(pp, b), s_glist, j0, j1);
  }
  detail::stamp(gp.stamps, stamps::hier_fused, 4);
  __threadfence();
  cluster.sync();  // every CTA's page keys written
  detail::stamp(gp.stamps, stamps::hier_fused, 5);

  // 3. The page selection, by CTA 0 (its stages are free: candidates at offset 0).
  if (x == 0)
    hier_page_topk(pp, b, h, topk_split_of(pp, b, tid == 0), s_glist, total, s_cand, s_hist,
                   s_pick, s_warp);
  detail::stamp(gp.stamps, stamps::hier_fused, stamps::kExit);
#endif
}

// The fused kernel of a pair of scorers, as HierScorer::fused.
template <class GS, class PS>
FusedFn fused_kernel() {
  return hier_fused_kernel<GS, PS>;
}

}  // namespace masskv::cuda::select_impl
