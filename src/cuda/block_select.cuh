// Block-wide selection helpers of the CUDA selectors (prefill_index.cu's block top-k,
// select_hier.cu's hierarchical page top-k, select_top_p.cu's top-p): the need-th largest of a
// CTA's keys by radix selection, an exclusive prefix sum over the CTA, and an ordered compaction.
#pragma once

#include <cstdint>

namespace masskv::cuda::block_select {

// The need-th largest of n keys (1 <= need <= n; keys equal to others only below the need-th
// largest, e.g. zeros for "no key", else distinct), by most-significant-digit radix
// selection, 8 bits a pass: the keys >= the result are exactly the top `need`. A pass counts
// the next digit of the keys that share the digits chosen so far (warp-aggregated: the first
// passes put most keys in one or two bins, where one shared atomic per key would serialise),
// and picks the digit where the count from the top reaches `need`; it stops as soon as that
// digit's bin holds exactly the keys still needed (usually after 2-3 passes when the keys are
// scores: their high bits differ). hist: 256 ints, pick: 3 ints of shared memory. Every thread
// of the CTA (kThreads) must call it.
template <int kThreads>
__device__ unsigned long long radix_threshold(const unsigned long long* keys, int n, int need,
                                              int* hist, int* pick) {
  const int tid = threadIdx.x, lane = tid % 32;
  unsigned long long prefix = 0, mask = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = tid; i < 256; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int i = tid; i < n; i += kThreads) {
      const unsigned long long k = keys[i];
      const int bin = (k & mask) == prefix ? static_cast<int>((k >> shift) & 255) : -1;
      const unsigned peers = __match_any_sync(__activemask(), bin);
      if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
    }
    __syncthreads();
    if (tid < 32) {  // lane l owns the bins 255 - 8l down to 248 - 8l
      int c[8], sum = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = hist[255 - 8 * lane - e];
        sum += c[e];
      }
      int incl = sum;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      const int first = __ffs(__ballot_sync(0xffffffffu, incl >= need)) - 1;
      if (lane == first) {
        int above = incl - sum;
        for (int e = 0; e < 8; ++e) {
          if (above + c[e] >= need) {
            pick[0] = 255 - 8 * lane - e;
            pick[1] = need - above;
            pick[2] = c[e];
            break;
          }
          above += c[e];
        }
      }
    }
    __syncthreads();
    prefix |= static_cast<unsigned long long>(pick[0]) << shift;
    mask |= 0xffull << shift;
    need = pick[1];
    const bool whole_bin = pick[2] == need;
    __syncthreads();  // pick is rewritten by the next pass
    if (whole_bin) break;
  }
  return prefix;
}

// Exclusive prefix sum over the CTA (kThreads) of one int per thread; `total` gets the sum.
// s_warp: kThreads / 32 ints of shared memory.
template <int kThreads>
__device__ int exclusive_scan(int v, int* s_warp, int& total) {
  constexpr int kWarps = kThreads / 32;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) s_warp[warp] = x;
  __syncthreads();
  int base = 0;
  total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w < warp) base += s_warp[w];
    total += s_warp[w];
  }
  __syncthreads();
  return base + x - v;
}

// Ordered compaction over the CTA: emit(i, r) for every i in [0, n) with keep(i), r its rank
// among the kept ones in index order (thread t owns the segment [t·seg, (t + 1)·seg)); returns
// how many were kept. Every thread of the CTA (kThreads) must call it; keep must not change.
template <int kThreads, class Keep, class Emit>
__device__ int ordered_compact(int n, int* s_warp, const Keep& keep, const Emit& emit) {
  const int seg = (n + kThreads - 1) / kThreads;
  const int lo = min(n, static_cast<int>(threadIdx.x) * seg), hi = min(n, lo + seg);
  int mine = 0;
  for (int i = lo; i < hi; ++i) mine += keep(i) ? 1 : 0;
  int all = 0;
  int at = exclusive_scan<kThreads>(mine, s_warp, all);
  for (int i = lo; i < hi; ++i)
    if (keep(i)) emit(i, at++);
  return all;
}

}  // namespace masskv::cuda::block_select
