// The flat top-k of a selection, on the keys the scoring kernel wrote: per (sequence, kv head)
// the kept pages (sinks, window, last page: select/kept.hpp), then the best keys of the others,
// ties to the lower page id as the CPU, written ascending, -1 padded, with the count.
//  - quest_topk_block_kernel (the default where the plan gives one CTA per pair, i.e. up to
//    ~16K pages per sequence; the cluster kernel beyond, or where SelectLaunch::topk_kernel or
//    topk_cluster asks for it): one CTA per (sequence, kv head), launched with programmatic
//    dependent launch; radix passes of 2048 equal-width bins over the window of key values
//    still holding the threshold (min..max at first: at most 3 passes).
//  - quest_topk_kernel: a cluster of C CTAs (1024 threads each; C = 8, 4, 2 or 1 by how many
//    (sequence, kv head) pairs there are) per (sequence, kv head); each CTA caches its slice of
//    the candidate keys in shared memory; the cluster finds the need-th largest candidate key
//    by a radix select (4 passes of 8 bits, warp-aggregated per-slice histograms summed over
//    distributed shared memory), then takes every candidate above it and the lowest-id
//    candidates equal to it, and writes the ids ascending with two ballot passes (no sort; the
//    lower slices' counts as bases). Same result.
// Both end in the same ordered compaction (warp_counts, warp_emit).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "select_common.cuh"

namespace masskv::cuda::select_impl {
namespace {

namespace cg = cooperative_groups;

constexpr int kTopkThreads = 1024;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkMaxCluster = 8;  // CTAs per (sequence, kv head) in the top-k (portable limit)
// Candidate keys a top-k CTA keeps of its slice in shared memory (at most 160 KiB): the radix
// passes and the two compaction passes read global memory (L2) only for keys past these.
constexpr int kKeyCache = 40960;

// The two passes of the ordered compaction (both top-k kernels). Warp-contiguous ids
// [wbeg, wend), walked 32 at a time in id order; classify(j, gt, eq) puts candidate j above
// the threshold (always taken) or on it (taken in id order until need_eq). The counting pass
// and the emitting pass must classify alike.
template <class Classify>
__device__ void warp_counts(int wbeg, int wend, int lane, const Classify& classify, int& eq_w,
                            int& gt_w) {
  eq_w = gt_w = 0;
  for (int j0 = wbeg; j0 < wend; j0 += 32) {
    bool gt = false, eq = false;
    classify(j0 + lane, gt, eq);
    gt_w += __popc(__ballot_sync(0xffffffffu, gt));
    eq_w += __popc(__ballot_sync(0xffffffffu, eq));
  }
}
// Writes the selected ids at out[sel_r + rank]; eq_r, sel_r: the ties and the selected ids
// before this warp's range. mask (optional): 1/0 per id of the range.
template <class Classify>
__device__ void warp_emit(int wbeg, int wend, int lane, const Classify& classify, int need_eq,
                          int eq_r, int sel_r, std::int32_t* out, std::uint8_t* mask) {
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int j0 = wbeg; j0 < wend; j0 += 32) {
    const int j = j0 + lane;
    bool gt = false, eq = false;
    classify(j, gt, eq);
    const unsigned eqb = __ballot_sync(0xffffffffu, eq);
    const bool sel = gt || (eq && eq_r + __popc(eqb & lt_mask) < need_eq);
    const unsigned selb = __ballot_sync(0xffffffffu, sel);
    if (sel) out[sel_r + __popc(selb & lt_mask)] = j;
    if (mask != nullptr && j < wend) mask[j] = sel ? 1 : 0;
    eq_r += __popc(eqb);
    sel_r += __popc(selb);
  }
}

// Selection of one (sequence, kv head) by a cluster of kC CTAs (thread-block cluster,
// distributed shared memory). grid (kC, kv heads, batch), kTopkThreads threads, clusters of kC
// along x set at launch (launch_topk).
// CTA r of the cluster owns the r-th contiguous slice of the candidates [sinks, window): it
// caches the slice's keys, builds each radix pass's 256-bin histogram of its slice; after a
// cluster barrier every CTA sums the cluster's histograms (integer sums: the same in every CTA)
// and finds the same bin, so the threshold T and need_eq come out as with one CTA. The ordered
// compaction gives each CTA the counts of the lower-ranked slices (id order = rank order), so
// the ids are written ascending without a sort. All CTAs of a cluster take the same branches
// (they compute the same n, kept, need), so no barrier is left waiting.
template <int kC>
__global__ void __launch_bounds__(kTopkThreads) quest_topk_kernel(SelParams p) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  extern __shared__ std::uint32_t s_keys[];  // this CTA's slice [slo, slo + cached)
  __shared__ int s_hist[2][256];             // by pass parity (other CTAs read them)
  __shared__ int s_warp_a[kTopkWarps], s_warp_b[kTopkWarps];
  __shared__ int s_base_eq[kTopkWarps], s_base_sel[kTopkWarps];
  __shared__ int s_cta_eq, s_cta_gt;  // this slice's counts (other CTAs read them)
  __shared__ int s_bin, s_krem;

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  std::int32_t* out =
      p.out_ids + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_per_head;
  std::int32_t* out_count = p.out_count + b * p.num_kv_heads + h;
  const bool leader = rank == 0;  // writes the kept pages, the -1 padding and the count

  const TopkSplit sp = topk_split_of(p, b, tid == 0);
  const int n = sp.n, sinks = sp.sinks, window = sp.window, kept = sp.kept, total = sp.total;
  const bool bad = sp.bad;
  if (bad || n == 0) {
    if (leader) {
      for (int i = tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
      if (tid == 0) *out_count = 0;
    }
    return;
  }
  const int need = total - kept;  // > 0 only when sinks < window
  const int s0 = min(sinks, window);
  const int nsel = max(need, 0);
  if (leader) {
    for (int j = tid; j < s0; j += kTopkThreads) out[j] = j;
    for (int j = window + tid; j < n; j += kTopkThreads) out[s0 + nsel + (j - window)] = j;
    for (int i = total + tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
    if (tid == 0) *out_count = total;
  }
  if (nsel == 0) return;

  const std::uint32_t* keys =
      p.keys + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_pages;
  const int lo = sinks, hi = window, cand = hi - lo;
  const bool take_all = nsel >= cand;
  // This CTA's slice [slo, shi) of the candidates (whole warps of 32 ids).
  const int slice = (cand + kC * 32 - 1) / (kC * 32) * 32;
  const int slo = min(hi, lo + rank * slice), shi = min(hi, slo + slice);
  const int scount = shi - slo;
  const int cached = take_all ? 0 : min(scount, p.key_cache);
  for (int i = tid; i < cached; i += kTopkThreads) s_keys[i] = __ldg(keys + slo + i);
  __syncthreads();
  const auto key_at = [&](int j) {
    const int i = j - slo;
    return i < cached ? s_keys[i] : __ldg(keys + j);
  };
  // Threshold T = the nsel-th largest key of all candidates; k_rem = how many keys equal to T
  // are taken.
  std::uint32_t prefix = 0, pmask = 0;
  int k_rem = nsel;
  if (!take_all) {
    const int iters = (scount + kTopkThreads - 1) / kTopkThreads;
    int parity = 0;
    for (int shift = 24; shift >= 0; shift -= 8, parity ^= 1) {
      // s_hist[parity] was last read (by every CTA) before the previous pass's cluster barrier.
      int* hist = s_hist[parity];
      for (int i = tid; i < 256; i += kTopkThreads) hist[i] = 0;
      __syncthreads();
      for (int it = 0; it < iters; ++it) {
        const int j = slo + it * kTopkThreads + tid;
        unsigned bin = 256;
        if (j < shi) {
          const std::uint32_t key = key_at(j);
          if ((key & pmask) == prefix) bin = (key >> shift) & 255u;
        }
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
      cluster.sync();  // every CTA's histogram of this pass is complete
      if (warp == 0) {
        // Lane l holds bins [8l, 8l + 8) summed over the cluster; suffix sums over lanes find
        // the bin holding the k_rem-th largest key of the current prefix.
        int c[8], sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) c[i] = 0;
        for (int r = 0; r < kC; ++r) {
          const int* rh = cluster.map_shared_rank(hist, r);
#pragma unroll
          for (int i = 0; i < 8; ++i) c[i] += rh[8 * lane + i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += c[i];
        int suffix = sum;  // sum over lanes >= lane
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const int o = __shfl_down_sync(0xffffffffu, suffix, off);
          if (lane + off < 32) suffix += o;
        }
        const int above = suffix - sum;  // keys in bins of higher lanes
        if (suffix >= k_rem && above < k_rem) {
          int acc = above;
          for (int i = 7; i >= 0; --i) {
            if (acc + c[i] >= k_rem) {
              s_bin = 8 * lane + i;
              s_krem = k_rem - acc;
              break;
            }
            acc += c[i];
          }
        }
      }
      __syncthreads();
      prefix |= static_cast<std::uint32_t>(s_bin) << shift;
      pmask |= 255u << shift;
      k_rem = s_krem;
      __syncthreads();  // s_bin / s_krem are rewritten next pass
    }
  }
  const std::uint32_t T = prefix;
  const int need_eq = k_rem;

  // Warp w owns the slice's ids [slo + w * seg, slo + (w + 1) * seg), walked 32 at a time in id
  // order: ranks are running ballot counts, so ids come out ascending without a sort.
  const int seg = ((scount + kTopkWarps * 32 - 1) / (kTopkWarps * 32)) * 32;
  const int wbeg = min(shi, slo + warp * seg), wend = min(shi, wbeg + seg);
  // Candidate j against the threshold: above it (always taken) or equal to it (taken in id
  // order until need_eq); the counting pass and the emitting pass must agree exactly.
  const auto classify = [&](int j, bool& gt, bool& eq) {
    if (j >= wend) return;
    const std::uint32_t key = key_at(j);
    gt = take_all || key > T;
    eq = !take_all && key == T;
  };
  int eq_w, gt_w;
  warp_counts(wbeg, wend, lane, classify, eq_w, gt_w);
  if (lane == 0) {
    s_warp_a[warp] = eq_w;
    s_warp_b[warp] = gt_w;
  }
  __syncthreads();
  if (tid == 0) {
    int eq = 0, gt = 0;
    for (int w = 0; w < kTopkWarps; ++w) {
      eq += s_warp_a[w];
      gt += s_warp_b[w];
    }
    s_cta_eq = eq;
    s_cta_gt = gt;
  }
  cluster.sync();  // every slice's counts are published
  if (tid == 0) {
    // The lower slices first (ties to the lower id), then this CTA's warps.
    int eq_base = 0, sel_base = 0;
    for (int r = 0; r < rank; ++r) {
      const int eq_r = *cluster.map_shared_rank(&s_cta_eq, r);
      const int gt_r = *cluster.map_shared_rank(&s_cta_gt, r);
      sel_base += gt_r + min(max(need_eq - eq_base, 0), eq_r);
      eq_base += eq_r;
    }
    for (int w = 0; w < kTopkWarps; ++w) {
      s_base_eq[w] = eq_base;
      s_base_sel[w] = sel_base;
      const int take = min(max(need_eq - eq_base, 0), s_warp_a[w]);
      sel_base += s_warp_b[w] + take;
      eq_base += s_warp_a[w];
    }
  }
  // No CTA leaves (or reuses) its shared memory while another may still read it; also orders
  // s_base_* for this CTA's threads.
  cluster.sync();
  warp_emit(wbeg, wend, lane, classify, need_eq, s_base_eq[warp], s_base_sel[warp], out + s0,
            nullptr);
#endif
}

// ---- top-k, one CTA per (sequence, kv head) ----------------------------------------------------

// The block top-k is launched with programmatic dependent launch (device.cuh) so that its
// launch and prologue (kept pages, padding, count) overlap the scoring kernel (which allows
// dependents once its CTAs have started); it waits for the scoring grid (wait_for_predecessor)
// before reading a key.

constexpr int kBlkBinsLog = 11;
constexpr int kBlkBins = 1 << kBlkBinsLog;  // 2 per thread

// The selection of one (sequence, kv head) by one CTA of kTopkThreads threads, grid (1, kv
// heads, batch): the same result as quest_topk_kernel (and the CPU's topk_one), found with
// fewer, cheaper passes and no cluster barriers.
//  - The candidates' keys are cached in shared memory (up to key_cache; the rest is read from
//    L2 on every pass) while their min and max are reduced (redux.sync).
//  - A window [wlo, whi] of key values always holds the threshold: at first [min, max]. A
//    pass bins the candidates in the window by (key - wlo) >> shift into 2048 bins (shift so
//    that the window fits: equal-width bins over the values the keys actually take, not over
//    the key bits, so the first pass already splits keys that share their top bits — bounds
//    of one binade share the top 9), finds the bin of the k_rem-th largest key by a suffix scan
//    of the histogram, and narrows the window to that bin. Windows shrink by 2^11 per pass:
//    at most 3 passes; fewer when min == max, or when the bin holds exactly the keys still
//    needed (then every key of the window is taken).
//  - Selected: every key above the window, and the first k_rem keys inside it in id order
//    (inside a window of one value: ties to the lower page id, as the CPU; a window whose keys
//    are all taken: order irrelevant). Ids are written ascending without a sort by two ballot
//    passes over warp-contiguous id ranges (counts, then positions).
// Shared-memory atomics only count; nothing depends on timing (deterministic).
// out_mask (optional): 1 for every selected logical page of [0, n), 0 for the others.
__global__ void __launch_bounds__(kTopkThreads) quest_topk_block_kernel(SelParams p) {
  extern __shared__ std::uint32_t s_keys[];
  __shared__ int s_hist[kBlkBins];
  __shared__ int s_wsum[kTopkWarps];
  __shared__ std::uint32_t s_wmin[kTopkWarps], s_wmax[kTopkWarps];
  __shared__ int s_warp_a[kTopkWarps], s_warp_b[kTopkWarps];
  __shared__ int s_base_eq[kTopkWarps], s_base_sel[kTopkWarps];
  __shared__ int s_bin, s_above, s_cnt;

  const int h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  std::int32_t* out =
      p.out_ids + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_per_head;
  std::int32_t* out_count = p.out_count + b * p.num_kv_heads + h;
  std::uint8_t* mask =
      p.out_mask != nullptr
          ? p.out_mask + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_pages
          : nullptr;

  detail::stamp(p.stamps, p.stamp_score + 1, 0);
  const TopkSplit sp = topk_split_of(p, b, tid == 0);
  const int n = sp.n, sinks = sp.sinks, window = sp.window, kept = sp.kept, total = sp.total;
  const bool bad = sp.bad;
  if (bad || n == 0) {
    for (int i = tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
    if (tid == 0) *out_count = 0;
    if (mask != nullptr && n > 0)
      for (int j = tid; j < n; j += kTopkThreads) mask[j] = 0;
    // Every exit waits for the scoring grid, so this grid never completes before it (a later
    // launch in the stream then finds both done).
    detail::wait_for_predecessor();
    return;
  }
  const int need = total - kept;
  const int s0 = min(sinks, window);
  const int nsel = max(need, 0);
  for (int j = tid; j < s0; j += kTopkThreads) out[j] = j;
  for (int j = window + tid; j < n; j += kTopkThreads) out[s0 + nsel + (j - window)] = j;
  for (int i = total + tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
  if (tid == 0) *out_count = total;
  if (mask != nullptr) {
    for (int j = tid; j < s0; j += kTopkThreads) mask[j] = 1;
    for (int j = max(window, s0) + tid; j < n; j += kTopkThreads) mask[j] = 1;
    if (nsel == 0)
      for (int j = s0 + tid; j < window; j += kTopkThreads) mask[j] = 0;
  }
  detail::wait_for_predecessor();
  detail::stamp(p.stamps, p.stamp_score + 1, 1);
  // The next kernel (page scoring, the decode) may launch now and wait on the device: after
  // this CTA's wait, so its own early reads find the scoring done (the decode merge reads the
  // counts before its wait).
  detail::allow_dependents();
  if (nsel == 0) return;

  const std::uint32_t* keys =
      p.keys + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_pages;
  const int lo = sinks, hi = window, cand = hi - lo;
  const bool take_all = nsel >= cand;
  const int cached = take_all ? 0 : min(cand, p.key_cache);
  // Plain loads, not __ldg: the scoring grid wrote the keys while this grid was already
  // resident (programmatic dependent launch), so they are not read-only for its lifetime.
  const auto key_at = [&](int j) {
    const int i = j - lo;
    return i < cached ? s_keys[i] : keys[j];
  };
  std::uint32_t wlo = 0, whi = 0xffffffffu;
  int k_rem = nsel;
  if (!take_all) {
    std::uint32_t kmin = 0xffffffffu, kmax = 0;
    for (int i = tid; i < cand; i += kTopkThreads) {
      const std::uint32_t key = keys[lo + i];
      if (i < cached) s_keys[i] = key;
      kmin = min(kmin, key);
      kmax = max(kmax, key);
    }
    kmin = __reduce_min_sync(0xffffffffu, kmin);
    kmax = __reduce_max_sync(0xffffffffu, kmax);
    if (lane == 0) {
      s_wmin[warp] = kmin;
      s_wmax[warp] = kmax;
    }
    __syncthreads();  // also publishes s_keys
    wlo = __reduce_min_sync(0xffffffffu, s_wmin[lane]);
    whi = __reduce_max_sync(0xffffffffu, s_wmax[lane]);
    // Invariant: every key above whi is taken (nsel - k_rem of them), and the window holds at
    // least k_rem keys.
    while (wlo != whi) {
      const std::uint32_t range = whi - wlo;
      const int shift = max(0, 32 - __clz(static_cast<int>(range)) - kBlkBinsLog);
      s_hist[2 * tid] = 0;
      s_hist[2 * tid + 1] = 0;
      __syncthreads();
      // Uniform trip count (whole warps vote). The lanes whose bin is lane 0's add with one
      // atomic: runs of equal keys — the unscored pages (key 0) of the hierarchical selector,
      // ties — would otherwise serialise on one shared-memory address.
      for (int j0 = lo; j0 < hi; j0 += kTopkThreads) {
        const int j = j0 + tid;
        unsigned bin = 0xffffffffu;
        if (j < hi) {
          const std::uint32_t key = key_at(j);
          if (key >= wlo && key <= whi) bin = (key - wlo) >> shift;
        }
        const unsigned bin0 = __shfl_sync(0xffffffffu, bin, 0);
        const unsigned same = __ballot_sync(0xffffffffu, bin == bin0);
        if (bin0 != 0xffffffffu && lane == 0) atomicAdd(&s_hist[bin0], __popc(same));
        if (bin != 0xffffffffu && bin != bin0) atomicAdd(&s_hist[bin], 1);
      }
      __syncthreads();
      // Suffix sums over the bins from the top: thread t owns bins 2t (lower) and 2t + 1.
      const int c_lo = s_hist[2 * tid], c_hi = s_hist[2 * tid + 1];
      const int v = c_lo + c_hi;
      int suf = v;  // over the lanes >= lane of this warp
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int o = __shfl_down_sync(0xffffffffu, suf, off);
        if (lane + off < 32) suf += o;
      }
      if (lane == 0) s_wsum[warp] = suf;
      __syncthreads();
      // Keys in the warps above this one: every warp scans the 32 warp sums itself.
      int ws = s_wsum[lane];
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int o = __shfl_down_sync(0xffffffffu, ws, off);
        if (lane + off < 32) ws += o;
      }
      const int warps_above = __shfl_sync(0xffffffffu, ws, (warp + 1) & 31);
      const int incl = suf + (warp + 1 < kTopkWarps ? warps_above : 0);  // bins >= 2t
      const int above = incl - v;                                        // bins > 2t + 1
      if (above < k_rem && incl >= k_rem) {                              // exactly one thread
        if (above + c_hi >= k_rem) {
          s_bin = 2 * tid + 1;
          s_above = above;
          s_cnt = c_hi;
        } else {
          s_bin = 2 * tid;
          s_above = above + c_hi;
          s_cnt = c_lo;
        }
      }
      __syncthreads();
      const std::uint32_t bin_lo = wlo + (static_cast<std::uint32_t>(s_bin) << shift);
      const std::uint64_t bin_hi = static_cast<std::uint64_t>(bin_lo) + ((1ull << shift) - 1);
      k_rem -= s_above;
      const bool whole = s_cnt == k_rem;
      wlo = bin_lo;
      whi = static_cast<std::uint32_t>(min(static_cast<std::uint64_t>(whi), bin_hi));
      __syncthreads();  // s_bin, s_above, s_cnt and s_hist are rewritten by the next pass
      if (whole) break;
    }
  }
  const int need_eq = k_rem;

  // Warp w owns the candidate ids [lo + w * seg, lo + (w + 1) * seg), walked 32 at a time in
  // id order. The counting pass and the emitting pass classify alike.
  const int seg = ((cand + kTopkWarps * 32 - 1) / (kTopkWarps * 32)) * 32;
  const int wbeg = min(hi, lo + warp * seg), wend = min(hi, wbeg + seg);
  const auto classify = [&](int j, bool& gt, bool& eq) {
    if (j >= wend) return;
    const std::uint32_t key = key_at(j);
    gt = take_all || key > whi;
    eq = !take_all && key >= wlo && key <= whi;
  };
  int eq_w, gt_w;
  warp_counts(wbeg, wend, lane, classify, eq_w, gt_w);
  if (lane == 0) {
    s_warp_a[warp] = eq_w;
    s_warp_b[warp] = gt_w;
  }
  __syncthreads();
  if (tid == 0) {
    int eq_base = 0, sel_base = 0;
    for (int w = 0; w < kTopkWarps; ++w) {
      s_base_eq[w] = eq_base;
      s_base_sel[w] = sel_base;
      sel_base += s_warp_b[w] + min(max(need_eq - eq_base, 0), s_warp_a[w]);
      eq_base += s_warp_a[w];
    }
  }
  __syncthreads();
  warp_emit(wbeg, wend, lane, classify, need_eq, s_base_eq[warp], s_base_sel[warp], out + s0, mask);
  detail::stamp(p.stamps, p.stamp_score + 1, stamps::kExit);
}

}  // namespace

// The top-k kernel for clusters of c CTAs, its dynamic shared-memory limit raised once (the key
// cache).
TopkFn topk_kernel(int c) {
  static const TopkFn fns[4] = {quest_topk_kernel<1>, quest_topk_kernel<2>, quest_topk_kernel<4>,
                                quest_topk_kernel<8>};
  static std::once_flag once;
  std::call_once(once, [] {
    for (TopkFn f : fns)
      detail::set_dynamic_smem(f, sizeof(std::uint32_t) * kKeyCache, "the cluster top-k");
  });
  return fns[c == 1 ? 0 : c == 2 ? 1 : c == 4 ? 2 : 3];
}

// CTAs per (sequence, kv head) in the top-k: the most (<= 8, a power of two) that keep all the
// pairs' CTAs in one wave of one 1024-thread CTA per SM and give each CTA at least
// kTopkMinSlice candidates; 1 when the pairs alone fill the GPU: the cluster's barriers cost
// more than one CTA's scan on short sequences (docs/gpu-results.md, tuning notes).
constexpr int kTopkMinSlice = 8192;
int plan_topk_cluster(int pairs, int max_pages) {
  int c = kTopkMaxCluster;
  while (c > 1 && (static_cast<std::int64_t>(pairs) * c > device_sms() ||
                   max_pages / c < kTopkMinSlice))
    c /= 2;
  return c;
}

// Keys a top-k CTA caches in shared memory (SelParams::key_cache's cap; the rest it reads
// from global memory): kKeyCache, or what the device leaves beside the block kernel's static
// arrays where that is less (an sm_80 GPU's 163 KB), in whole 1024-key steps.
int key_cache_cap() {
  static const int cap = static_cast<int>(
      std::min<std::size_t>(kKeyCache, detail::dynamic_smem_room(quest_topk_block_kernel) /
                                           sizeof(std::uint32_t) / 1024 * 1024));
  return cap;
}

// The block top-k kernel (one CTA per pair, no cluster), its shared-memory limit raised once.
TopkFn block_topk_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    detail::set_dynamic_smem(quest_topk_block_kernel, sizeof(std::uint32_t) * key_cache_cap(),
                             "the block top-k");
  });
  return quest_topk_block_kernel;
}

// The top-k launch: the block kernel may start while the scoring kernel finishes (it waits
// for the keys on the device), the cluster kernel after it.
void launch_topk(const Prepared& pr, cudaStream_t stream) {
  if (!pr.block_topk) {  // clusters of kC = grid.x CTAs: one per (sequence, kv head)
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg =
        detail::cluster_config(pr.topk_grid, dim3(kTopkThreads), pr.topk_smem, stream, attr,
                               static_cast<int>(pr.topk_grid.x));
    check_cuda(cudaLaunchKernelEx(&cfg, pr.topk, pr.p), "quest top-k kernel launch");
    return;
  }
  detail::PdlLaunch l(stream, pr.topk_grid, dim3(kTopkThreads), pr.topk_smem);
  check_cuda(cudaLaunchKernelEx(&l.cfg, pr.topk, pr.p), "quest top-k kernel launch");
}

}  // namespace masskv::cuda::select_impl
