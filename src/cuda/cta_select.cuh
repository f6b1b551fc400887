// CTA-wide building blocks of the selection kernels (two_stage.cu, two_stage_pool.cu): an
// exclusive scan, a bitonic sort of shared memory (best first, ties to the lower index) and a
// radix select of the k-th largest key. Every thread of the CTA calls each of them.
#pragma once

#include <cstdint>

namespace masskv::cuda::two_stage_impl {

// Exclusive scan over the CTA (kRankThreads or kThreads threads); returns the thread's
// exclusive prefix, total in *total. s_warp: >= 32 ints of shared memory.
__device__ __forceinline__ int block_exclusive_scan(int x, int* s_warp, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int inc = x;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, inc, o);
    if (lane >= o) inc += y;
  }
  __syncthreads();  // s_warp free (a previous scan's readers are done)
  if (lane == 31) s_warp[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    int v = lane < warps ? s_warp[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, v, o);
      if (lane >= o) v += y;
    }
    if (lane < warps) s_warp[lane] = v;  // inclusive per warp
  }
  __syncthreads();
  const int before = warp > 0 ? s_warp[warp - 1] : 0;
  *total = s_warp[warps - 1];
  return before + inc - x;
}

// Bitonic sort of np (a power of two) entries of shared memory, best first: key descending,
// then (with indices) index ascending. Every thread of the CTA calls it; ends synchronised.
template <bool kWithIndex>
__device__ void bitonic_best_first(unsigned long long* key, std::int32_t* idx, int np) {
  for (int k = 2; k <= np; k *= 2) {
    for (int j = k / 2; j > 0; j /= 2) {
      for (int t = threadIdx.x; t < np / 2; t += blockDim.x) {
        const int a = 2 * t - (t & (j - 1));  // the lower element of pair t at distance j
        const int c = a + j;
        const bool up = (a & k) == 0;  // this block sorts best first
        const unsigned long long ka = key[a], kc = key[c];
        bool c_better = kc > ka;
        if constexpr (kWithIndex) c_better = c_better || (kc == ka && idx[c] < idx[a]);
        if (c_better == up) {  // (keys alone: equal keys may swap, which changes nothing)
          key[a] = kc;
          key[c] = ka;
          if constexpr (kWithIndex) {
            const std::int32_t ia = idx[a];
            idx[a] = idx[c];
            idx[c] = ia;
          }
        }
      }
      __syncthreads();
    }
  }
}

// A CTA's radix select, most significant 8-bit digit first: the depth-th largest (1-based) of
// the nonzero keys key(i), i in [lo, hi) (0: not an item): rs.prefix = that key T, rs.remaining
// = how many of the items equal to T are among the best depth. Needs depth <= the nonzero
// items (depth 0: nothing done, prefix 0). Every thread calls it; ends synchronised.
struct RadixState {
  unsigned long long prefix;
  int remaining;
};
template <int kBits, class KeyAt>
__device__ void radix_select(KeyAt key, int lo, int hi, int depth, int* s_hist, RadixState& rs) {
  if (threadIdx.x == 0) {
    rs.prefix = 0;
    rs.remaining = depth;
  }
  __syncthreads();
  unsigned long long mask = 0;
  for (int shift = kBits - 8; shift >= 0 && depth > 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) s_hist[i] = 0;
    __syncthreads();
    const unsigned long long prefix = rs.prefix;
    // Warp-aggregated: one shared atomic per distinct digit of a warp (the high digits of
    // similar scores fall in one or two bins: per-item atomics there serialise).
    for (int i0 = lo; i0 < hi; i0 += blockDim.x) {
      const int i = i0 + threadIdx.x;
      const unsigned long long k = i < hi ? key(i) : 0ull;
      const bool in = k != 0 && (k & mask) == prefix;
      const int digit = in ? static_cast<int>((k >> shift) & 255) : 256 + static_cast<int>(threadIdx.x % 32);
      const unsigned same = __match_any_sync(0xffffffffu, digit);
      if (in && __ffs(same) - 1 == static_cast<int>(threadIdx.x % 32))
        atomicAdd(&s_hist[digit], __popc(same));
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      int c[8], sum = 0;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        c[e] = s_hist[lane * 8 + e];
        sum += c[e];
      }
      // Items in the bins of higher lanes.
      int above = sum;
#pragma unroll
      for (int o = 1; o < 32; o *= 2) {
        const int y = __shfl_down_sync(0xffffffffu, above, o);
        if (lane + o < 32) above += y;
      }
      above -= sum;
      const int rem = rs.remaining;
      int acc = above;
#pragma unroll
      for (int e = 7; e >= 0; --e) {
        if (acc < rem && rem <= acc + c[e]) {
          rs.prefix = prefix | (static_cast<unsigned long long>(lane * 8 + e) << shift);
          rs.remaining = rem - acc;
        }
        acc += c[e];
      }
    }
    mask |= 255ull << shift;
    __syncthreads();
  }
}

}  // namespace masskv::cuda::two_stage_impl
