// CUDA two-stage token selection (include/masskv/cuda/two_stage.hpp; the CPU rule:
// src/select/rules/two_stage.cpp) and token_codes (factor 0: kernels 1-3 replaced by
// all_pages_kernel). Per step:
//   1. bounds_kernel: the §2.3 bound of every eligible page (no kept token) per q head, from
//      the bf16 store, in the CPU AVX2 scan's order (8 FMA chains of q+·M and of q-·m, the
//      same horizontal sum, finish_bound's slack): the CPU's bits, as an ordered 32-bit key;
//   2. rank_kernel (stage 1): per (sequence, q head) the best m1 pages in order (key
//      descending, ties to the lower page id): radix select of the m1-th key, then a bitonic
//      sort of the chosen;
//   3. merge (stage 1, two_stage_merge.cu): per (sequence, kv head) the round robin of the q
//      heads' lists (selectors.cpp fill: each head in turn takes its best page not yet taken)
//      up to m1 pages, then the candidates in ascending page order;
//   4. score_kernel: every candidate token, every q head of its group, on the page codes: the
//      integer score of kv/page_codes.hpp (int8 query, 8-bit ranges, exact int32 sums) and its
//      last f64 operations explicitly rounded in the CPU's order: the CPU's doubles (kv::
//      page_code_score), as an ordered 64-bit key;
//   5. the token ranking: per (sequence, q head) a sampled threshold, the keys above it
//      compacted and ranked (rank_kernel where that does not serve); with log_prob
//      (two_stage_pool.cu) the heads' keys pooled per group and one binned ranking instead;
//   6. merge (stage 2): the round robin to the cap (one list with log_prob: no turns), then the
//      list (kept tokens, the chosen candidates, ascending) into the output.
// token_codes in two passes (code_channels < 1): two_stage_twopass.cu's first pass picks the
// candidate tokens (a bitmap) and their pages; then 4-6 run on those pages, score_kernel
// scoring only the candidates (the others are not ranked, as the CPU's -inf).
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>

#include "device.cuh"
#include "masskv/cuda/two_stage.hpp"
#include "masskv/error.hpp"
#include "cta_select.cuh"
#include "two_stage_common.cuh"

namespace masskv::cuda {
namespace two_stage_impl {
namespace {

using detail::check_cuda;

// ---- 1. page bounds per q head ---------------------------------------------------------------

template <int kD>
__global__ void __launch_bounds__(kThreads) bounds_kernel(Params p) {
  __shared__ float s_qp[kMaxG * kD], s_qn[kMaxG * kD];
  __shared__ float s_fq[kMaxG];
  __shared__ uint4 s_rows[kTilePages][2][kD / 8 + 1];  // +1: rows on different banks
  __shared__ int s_phys[kTilePages];
  const int b = blockIdx.z, h = blockIdx.y, g = p.g;
  const Plan s = plan_of(p, b, blockIdx.x == 0 && h == 0 && threadIdx.x == 0);
  const int j0 = s.pg_first_end + static_cast<int>(blockIdx.x) * kTilePages;
  if (s.bad || j0 >= s.pg_last_begin) return;  // the whole CTA, before any barrier
  const int n = min(kTilePages, s.pg_last_begin - j0);
  for (int idx = threadIdx.x; idx < g * kD; idx += blockDim.x) {
    const int i = idx / kD, c = idx % kD;
    const float x = p.q[b * p.q_s0 + (h * g + i) * p.q_s1 + c];
    s_qp[idx] = x > 0.f ? x : 0.f;
    s_qn[idx] = x < 0.f ? x : 0.f;
  }
  if (threadIdx.x < g) {  // ||q||_1 in channel order, as SplitQuery::assign
    const float* row = p.q + b * p.q_s0 + (h * g + threadIdx.x) * p.q_s1;
    float l1 = 0.f;
    for (int c = 0; c < kD; ++c) l1 = __fadd_rn(l1, fabsf(row[c]));
    s_fq[threadIdx.x] = __fmul_rn(p.slack_f, l1);
  }
  const int seq_begin = p.indptr[b];
  if (threadIdx.x < kTilePages) {
    int phys = -1;
    if (static_cast<int>(threadIdx.x) < n) {
      phys = checked_phys(p, seq_begin + j0 + threadIdx.x, p.bound_pages);
    }
    s_phys[threadIdx.x] = phys;
  }
  __syncthreads();
  constexpr int kPieces = kD / 8;
  for (int idx = threadIdx.x; idx < n * 2 * kPieces; idx += blockDim.x) {
    const int t = idx / (2 * kPieces), r = (idx / kPieces) % 2, k = idx % kPieces;
    const int phys = s_phys[t];
    uint4 v = make_uint4(0, 0, 0, 0);
    if (phys >= 0) {
      const std::uint16_t* base = (r ? p.bmax : p.bmin) +
                                  (static_cast<std::int64_t>(phys) * p.Hkv + h) * kD;
      v = reinterpret_cast<const uint4*>(base)[k];
    }
    s_rows[t][r][k] = v;
  }
  __syncthreads();
  for (int item = threadIdx.x; item < n * g; item += blockDim.x) {
    const int t = item / g, i = item % g;
    const int j = j0 + t;
    std::uint32_t key = 0u;  // a bad page: never ranked
    if (s_phys[t] >= 0) {
      float ap[8], an[8];
#pragma unroll
      for (int l = 0; l < 8; ++l) ap[l] = an[l] = 0.f;
      float w = 0.f;
      const float* qp = s_qp + i * kD;
      const float* qn = s_qn + i * kD;
#pragma unroll 4
      for (int k = 0; k < kPieces; ++k) {
        const uint4 mn = s_rows[t][0][k], mx = s_rows[t][1][k];
        const unsigned wl[4] = {mn.x, mn.y, mn.z, mn.w};
        const unsigned wh[4] = {mx.x, mx.y, mx.z, mx.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float lo0 = __uint_as_float(wl[e] << 16), lo1 = __uint_as_float(wl[e] & 0xffff0000u);
          const float hi0 = __uint_as_float(wh[e] << 16), hi1 = __uint_as_float(wh[e] & 0xffff0000u);
          w = fmaxf(w, fmaxf(fmaxf(fabsf(lo0), fabsf(hi0)), fmaxf(fabsf(lo1), fabsf(hi1))));
          const int c = 8 * k + 2 * e;
          ap[2 * e] = fmaf(qp[c], hi0, ap[2 * e]);
          an[2 * e] = fmaf(qn[c], lo0, an[2 * e]);
          ap[2 * e + 1] = fmaf(qp[c + 1], hi1, ap[2 * e + 1]);
          an[2 * e + 1] = fmaf(qn[c + 1], lo1, an[2 * e + 1]);
        }
      }
      float v[8];
#pragma unroll
      for (int l = 0; l < 8; ++l) v[l] = __fadd_rn(ap[l], an[l]);
      // The AVX2 hsum: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
      const float sum = __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[4]), __fadd_rn(v[2], v[6])),
                                  __fadd_rn(__fadd_rn(v[1], v[5]), __fadd_rn(v[3], v[7])));
      // finish_bound: scale * (sum + fq * w + FLT_MIN), each operation rounded.
      const float bound =
          __fmul_rn(p.scale, __fadd_rn(__fadd_rn(sum, __fmul_rn(s_fq[i], w)), FLT_MIN));
      key = ordered_key(bound);
    }
    p.keys1[static_cast<std::int64_t>(b * p.Hq + h * g + i) * p.max_pages + j] = key;
  }
}

// ---- 2/5. ranked top lists -----------------------------------------------------------------

// ---- 5a. stage 2 on many keys: a sampled threshold, the keys above it, their exact rank ----
// The rank below streams a segment's keys once per 8-bit digit from one CTA: fine for
// two_stage's candidates, slow for token_codes' every token. First a threshold T from every
// S-th key (the (1.5 depth / S + 8)-th best of the sample, as the CPU's order_by), then the
// keys >= T (and their indices) gathered by many CTAs, then those ranked in one CTA's shared
// memory. Exact whenever at least `depth` keys are >= T: every key of the best `depth` is.
// Otherwise (or past Params::compact_cap) rank_kernel ranks the segment from all its keys.

__device__ __forceinline__ bool compacted(const Params& p, int seg, int depth) {
  const unsigned long long T = p.thresh[seg];
  const int c = p.ccount[seg];
  return T != 0ull && depth > 0 && c >= depth && c <= p.compact_cap;
}

// With log_prob only the group's first row (the pooled keys) is ranked.
__device__ __forceinline__ bool pooled_away(const Params& p, int seg) {
  return p.log_prob && (seg % p.Hq) % p.g != 0;
}

__global__ void __launch_bounds__(kRankThreads) sample_kernel(Params p) {
  extern __shared__ unsigned long long s_sample[];  // [kSampleMax]
  const int seg = blockIdx.x;
  if (pooled_away(p, seg)) return;
  const int b = seg / p.Hq, qh = seg % p.Hq, h = qh / p.g;
  const Plan s = plan_of(p, b, false);
  const int hi = stage2_items(p, s, b, h);
  const int depth = min(s.need, p.depth2);
  const unsigned long long* keys = p.keys2 + static_cast<std::int64_t>(seg) * p.kmax;
  int S = 16;
  while ((hi + S - 1) / S > kSampleMax) S *= 2;
  const int m = (hi + S - 1) / S;
  const int r = depth * 3 / (2 * S) + 8;  // 0-based, best first
  if (threadIdx.x == 0) p.ccount[seg] = 0;
  if (depth <= 0 || r >= m) {  // too few keys to gain: the plain rank
    if (threadIdx.x == 0) p.thresh[seg] = 0ull;
    return;
  }
  __shared__ int s_hist[256];
  __shared__ int s_warp[32];
  __shared__ RadixState s_radix;
  int mine = 0;
  for (int i = threadIdx.x; i < m; i += blockDim.x) {
    s_sample[i] = keys[static_cast<std::int64_t>(i) * S];
    mine += s_sample[i] != 0ull;
  }
  int valid = 0;
  block_exclusive_scan(mine, s_warp, &valid);  // synchronises
  // The (r + 1)-th best sample; no threshold (0) if too few are valid.
  radix_select<64>([&](int i) { return s_sample[i]; }, 0, m, valid > r ? r + 1 : 0, s_hist,
                   s_radix);
  if (threadIdx.x == 0) p.thresh[seg] = valid > r ? s_radix.prefix : 0ull;
}

constexpr int kCompactPer = 4;  // keys per thread of compact_kernel

__global__ void __launch_bounds__(kThreads) compact_kernel(Params p) {
  const int seg = blockIdx.y;
  if (pooled_away(p, seg)) return;
  const unsigned long long T = p.thresh[seg];
  if (T == 0ull) return;
  const int b = seg / p.Hq, qh = seg % p.Hq, h = qh / p.g;
  const Plan s = plan_of(p, b, false);
  const int hi = stage2_items(p, s, b, h);
  const unsigned long long* keys = p.keys2 + static_cast<std::int64_t>(seg) * p.kmax;
  const int base = static_cast<int>(blockIdx.x) * kThreads * kCompactPer;
  unsigned long long k[kCompactPer];
#pragma unroll
  for (int j = 0; j < kCompactPer; ++j) {  // every load first: kCompactPer in flight
    const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
    k[j] = i < hi ? keys[i] : 0ull;
  }
  // One global atomic per CTA: its count, then each thread's place after its CTA's base.
  __shared__ int s_warp[32];
  __shared__ int s_base;
  int mine = 0;
#pragma unroll
  for (int j = 0; j < kCompactPer; ++j) mine += k[j] != 0ull && k[j] >= T;
  int total = 0;
  int at = block_exclusive_scan(mine, s_warp, &total);
  if (total == 0) return;  // the whole CTA (total is uniform)
  if (threadIdx.x == 0) s_base = atomicAdd(&p.ccount[seg], total);
  __syncthreads();
  at += s_base;
#pragma unroll
  for (int j = 0; j < kCompactPer; ++j) {
    const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
    if (k[j] != 0ull && k[j] >= T) {
      if (at < kCompactCap) {
        p.ckeys[static_cast<std::int64_t>(seg) * kCompactCap + at] = k[j];
        p.cidx[static_cast<std::int64_t>(seg) * kCompactCap + at] = i;
      }
      ++at;
    }
  }
}

__global__ void __launch_bounds__(kRankThreads) rank_compact_kernel(Params p) {
  extern __shared__ unsigned long long s_ck[];  // [pow2 >= count]; then s_ci
  const int seg = blockIdx.x;
  if (pooled_away(p, seg)) return;
  const int b = seg / p.Hq;
  const Plan s = plan_of(p, b, false);
  const int depth = min(s.need, p.depth2);
  if (!compacted(p, seg, depth)) return;
  const int n = p.ccount[seg];
  const bool order = !p.log_prob;  // the round robin needs each list in order; one list does not
  int np = 1;
  while (order && np < n) np *= 2;
  std::int32_t* s_ci = reinterpret_cast<std::int32_t*>(s_ck + p.compact_cap);
  const unsigned long long* ck = p.ckeys + static_cast<std::int64_t>(seg) * kCompactCap;
  const std::int32_t* ci = p.cidx + static_cast<std::int64_t>(seg) * kCompactCap;
  for (int i = threadIdx.x; i < max(n, np); i += blockDim.x) {
    s_ck[i] = i < n ? ck[i] : 0ull;
    s_ci[i] = i < n ? ci[i] : 0x7fffffff;
  }
  __syncthreads();
  std::int32_t* list = p.list2 + static_cast<std::int64_t>(seg) * p.depth2;
  if (order) {
    bitonic_best_first<true>(s_ck, s_ci, np);
    for (int r = threadIdx.x; r < depth; r += blockDim.x) list[r] = s_ci[r];
  } else {
    // The best `depth` as a set: the depth-th key T by radix select; of the keys equal to T
    // the need_eq of lowest index (a second select on the complemented index, only on a tie).
    __shared__ int s_hist[256];
    __shared__ int s_warp[32];
    __shared__ RadixState s_radix;
    __shared__ int s_n;
    radix_select<64>([&](int i) { return s_ck[i]; }, 0, n, depth, s_hist, s_radix);
    const unsigned long long T = s_radix.prefix;
    const int need_eq = s_radix.remaining;
    int eq = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) eq += s_ck[i] == T;
    int n_eq = 0;
    block_exclusive_scan(eq, s_warp, &n_eq);  // synchronises
    const auto tie_key = [&](int i) {
      return s_ck[i] == T ? static_cast<unsigned long long>(~static_cast<unsigned>(s_ci[i])) : 0ull;
    };
    radix_select<32>(tie_key, 0, n, n_eq > need_eq ? need_eq : 0, s_hist, s_radix);
    const unsigned long long T2 = n_eq > need_eq ? s_radix.prefix : 0ull;
    if (threadIdx.x == 0) s_n = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const unsigned long long k = s_ck[i];
      if (k > T || (k == T && tie_key(i) >= T2)) list[atomicAdd(&s_n, 1)] = s_ci[i];
    }
  }
  if (threadIdx.x == 0) p.len2[seg] = depth;
}

// Segment (sequence b, q head qh): items [lo, hi) of keys[row] (0: not ranked), the best
// `depth` in order (key descending, index ascending) into list[row_out], their count in len.
template <class Key, int kStage>
__global__ void __launch_bounds__(kRankThreads) rank_kernel(Params p) {
  extern __shared__ unsigned long long s_key[];  // [pow2 >= depth]; then s_idx
  __shared__ int s_hist[256];
  __shared__ int s_warp[32];
  __shared__ RadixState s_radix;
  __shared__ int s_n;
  const int seg = blockIdx.x;
  const int b = seg / p.Hq, qh = seg % p.Hq, h = qh / p.g;
  const Plan s = plan_of(p, b, false);
  int lo = 0, hi = 0, depth = 0, depth_max = 0;
  const Key* keys = nullptr;
  std::int32_t* list = nullptr;
  std::int32_t* len = nullptr;
  if constexpr (kStage == 1) {
    lo = s.pg_first_end;
    hi = s.bad ? lo : max(lo, s.pg_last_begin);
    depth = s.m1;
    depth_max = p.cand_max;
    keys = reinterpret_cast<const Key*>(p.keys1) + static_cast<std::int64_t>(seg) * p.max_pages;
    list = p.list1 + static_cast<std::int64_t>(seg) * p.cand_max;
    len = p.len1 + seg;
  } else {
    hi = s.bad ? 0 : p.n_cand[b * p.Hkv + h] * p.P;
    depth = s.need;
    depth_max = p.depth2;
    keys = reinterpret_cast<const Key*>(p.keys2) + static_cast<std::int64_t>(seg) * p.kmax;
    list = p.list2 + static_cast<std::int64_t>(seg) * p.depth2;
    len = p.len2 + seg;
  }
  depth = min(depth, depth_max);
  if constexpr (kStage == 2) {
    // Ranked elsewhere (rank_compact_kernel, two_stage_pool.cu's bin_rank_kernel), or not.
    if (pooled_away(p, seg) || (p.log_prob ? p.thresh[seg] != 0ull : compacted(p, seg, depth)))
      return;
  }
  int pow2 = 1;
  while (pow2 < depth_max) pow2 *= 2;
  std::int32_t* s_idx = reinterpret_cast<std::int32_t*>(s_key + pow2);

  // Valid items (key != 0).
  int mine = 0;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) mine += keys[i] != 0 ? 1 : 0;
  int valid = 0;
  block_exclusive_scan(mine, s_warp, &valid);
  const bool all = valid <= depth;
  radix_select<static_cast<int>(sizeof(Key)) * 8>(
      [&](int i) { return static_cast<unsigned long long>(keys[i]); }, lo, hi, all ? 0 : depth,
      s_hist, s_radix);
  const unsigned long long T = s_radix.prefix;
  const int need_eq = s_radix.remaining;
  if (threadIdx.x == 0) s_n = 0;
  __syncthreads();
  // Collect: every valid item when all fit; else those above T and the first need_eq equal
  // to T (index order, a scan per round of the CTA's threads).
  int eq_base = 0;
  for (int i0 = lo; i0 < hi && depth > 0; i0 += blockDim.x) {
    const int i = i0 + threadIdx.x;
    const unsigned long long k = i < hi ? static_cast<unsigned long long>(keys[i]) : 0ull;
    const bool eq = !all && k != 0 && k == T;
    int eq_total = 0;
    const int eq_before = block_exclusive_scan(eq ? 1 : 0, s_warp, &eq_total);
    const bool take = k != 0 && (all || k > T || (eq && eq_base + eq_before < need_eq));
    if (take) {
      const int at = atomicAdd(&s_n, 1);
      s_key[at] = k;
      s_idx[at] = i;
    }
    eq_base += eq_total;
  }
  __syncthreads();
  const int n = min(s_n, depth);  // == depth unless fewer valid items
  // Bitonic sort of pow2(n) entries, best first (key descending, index ascending); padding
  // (key 0, index INT_MAX) sorts last.
  int np = 1;
  while (np < n) np *= 2;
  for (int i = n + threadIdx.x; i < np; i += blockDim.x) {
    s_key[i] = 0;
    s_idx[i] = 0x7fffffff;
  }
  __syncthreads();
  bitonic_best_first<true>(s_key, s_idx, np);
  for (int r = threadIdx.x; r < n; r += blockDim.x) list[r] = s_idx[r];
  if (threadIdx.x == 0) *len = n;
}

// ---- 1-3 for token_codes (factor 0): every page with a token that is not kept (every page with
// log_prob) -------------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) all_pages_kernel(Params p) {
  const int b = blockIdx.x / p.Hkv, h = blockIdx.x % p.Hkv;
  const std::int64_t pair = static_cast<std::int64_t>(b) * p.Hkv + h;
  const Plan s = plan_of(p, b, h == 0 && threadIdx.x == 0);
  const int first = s.bad || p.log_prob ? 0 : static_cast<int>(s.tok_first_end / p.P);
  const int n = s.bad ? 0 : s.m1;
  for (int k = threadIdx.x; k < n; k += blockDim.x) p.cand[pair * p.cand_max + k] = first + k;
  if (threadIdx.x == 0) p.n_cand[pair] = n;
}

// ---- 4. candidate tokens on the 2-bit codes ---------------------------------------------------
// One thread per token, every q head of the group at once. The integer score of
// kv/page_codes.hpp, I_i = Σ_c q8_ic (3 a_c + code_c (b_c − a_c)), is summed as
// A_i + Σ_c code_c u_ic with A_i = 3 Σ_c q8_ic a_c and u_ic = q8_ic (b_c − a_c) (|u| <= 127 · 255:
// 16 bits) made once per page and head: the token's codes, spread to bytes, meet the packed
// 16-bit u in __dp2a (two products a step). Integers: the same I in any order, so the CPU's.

// Four 2-bit codes (a byte, channel c at bits 2c) into the four bytes of a word.
__device__ __forceinline__ int spread_codes(unsigned byte) {
  unsigned t = (byte | (byte << 12)) & 0x000F000Fu;
  t = (t | (t << 6)) & 0x03030303u;
  return static_cast<int>(t);
}

template <int kD>
__global__ void __launch_bounds__(kThreads) score_kernel(Params p) {
  constexpr int kPairs = kD / 2;
  constexpr int kUStride = kMaxG * kPairs + 1;  // a page's u; +1: pages on different banks
  __shared__ int s_q8[kMaxG][kD];
  __shared__ int s_sum[kMaxG];
  __shared__ double s_unit[kMaxG];
  __shared__ int s_u[kScorePages * kUStride];   // [page][head][pair]: two 16-bit u_ic
  __shared__ int s_a[kScorePages][kMaxG];       // A_i
  __shared__ double s_base[kScorePages][kMaxG], s_third[kScorePages];
  __shared__ int s_phys[kScorePages];
  __shared__ unsigned long long s_max[kMaxG];  // log_prob: the CTA's best key per head
  const int b = blockIdx.z, h = blockIdx.y, g = p.g, P = p.P;
  const std::int64_t pair = static_cast<std::int64_t>(b) * p.Hkv + h;
  const Plan s = plan_of(p, b, false);
  const int n_c = s.bad ? 0 : p.n_cand[pair];
  const int per = p.score_pages;  // pages per CTA: per * P <= kThreads
  const int c0 = static_cast<int>(blockIdx.x) * per;
  if (c0 >= n_c) return;  // the whole CTA
  const int n = min(per, n_c - c0);
  constexpr int kBytes = kD / 4;
  // This thread's token (page t, slot): its codes loaded first, in flight while the queries and
  // the pages' ranges are prepared (a bad page id reads nothing here; it is flagged below).
  const int j = threadIdx.x;
  const int t = j / P, slot = j % P;
  const bool mine = j < n * P;
  uint4 my_codes[kBytes / 16];
  {
    int id = -1;
    if (mine) id = p.indices[p.indptr[b] + p.cand[pair * p.cand_max + c0 + t]];
    const bool ok = id >= 0 && id < p.code_pages;
    const uint4* row = reinterpret_cast<const uint4*>(
        p.codes + ((static_cast<std::int64_t>(ok ? id : 0) * p.Hkv + h) * P + slot) * kBytes);
#pragma unroll
    for (int piece = 0; piece < kBytes / 16; ++piece)
      my_codes[piece] = ok ? row[piece] : make_uint4(0u, 0u, 0u, 0u);
  }
  // The queries' integer form (kv::code_query): qs = q * scale in f32, m = max |qs|,
  // q8 = RNE(qs * (127 / m)) clamped to [-127, 127], Q = sum q8, unit = m / 127.
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < g; i += kThreads / 32) {
    const float* q = p.q + b * p.q_s0 + (h * g + i) * p.q_s1;
    float m = 0.f;
    for (int c = lane; c < kD; c += 32) m = fmaxf(m, fabsf(__fmul_rn(q[c], p.scale)));
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    const bool zero = !(m > 0.f) || !isfinite(m);
    const float r = zero ? 0.f : __fdiv_rn(127.0f, m);
    int sum = 0;
    for (int c = lane; c < kD; c += 32) {
      const float t = rintf(__fmul_rn(__fmul_rn(q[c], p.scale), r));
      const int v = zero ? 0 : static_cast<int>(fminf(fmaxf(t, -127.f), 127.f));
      s_q8[i][c] = v;
      sum += v;
    }
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) {
      s_sum[i] = sum;
      s_unit[i] = zero ? 0.0 : __ddiv_rn(static_cast<double>(m), 127.0);
    }
  }
  if (threadIdx.x < kScorePages) {
    int phys = -1;
    if (static_cast<int>(threadIdx.x) < n) {
      phys = checked_phys(p, p.indptr[b] + p.cand[pair * p.cand_max + c0 + threadIdx.x],
                          p.code_pages);
    }
    s_phys[threadIdx.x] = phys;
  }
  if (threadIdx.x < kMaxG) s_max[threadIdx.x] = 0ull;
  __syncthreads();
  // A warp per page: lane l holds channels 4l .. 4l + 3 of its ranges (one 32-bit load each
  // of a and b); per head the packed u of its two channel pairs and its share of A_i (then the
  // warp's sum); lo · Q and step / 3.
  for (int t = warp; t < n; t += kThreads / 32) {
    const int phys = s_phys[t];
    unsigned ra = 0u, rb = 0u;
    const bool has = lane < kD / 4;
    if (phys >= 0 && has) {
      const std::int64_t at = (static_cast<std::int64_t>(phys) * p.Hkv + h) * kD;
      ra = reinterpret_cast<const unsigned*>(p.rmin + at)[lane];
      rb = reinterpret_cast<const unsigned*>(p.rmax + at)[lane];
    }
    int a[4], df[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      a[e] = static_cast<int>((ra >> (8 * e)) & 255u);
      df[e] = static_cast<int>((rb >> (8 * e)) & 255u) - a[e];
    }
    int* u = s_u + t * kUStride;
    for (int i = 0; i < g; ++i) {
      int a3 = 0;
      if (has) {
        const int* q8 = s_q8[i] + 4 * lane;
#pragma unroll
        for (int e = 0; e < 4; ++e) a3 += q8[e] * (3 * a[e]);
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int u0 = q8[e] * df[e], u1 = q8[e + 1] * df[e + 1];
          u[i * kPairs + 2 * lane + e / 2] = static_cast<int>(
              (static_cast<unsigned>(u0) & 0xffffu) | (static_cast<unsigned>(u1) << 16));
        }
      }
      for (int o = 16; o > 0; o /= 2) a3 += __shfl_xor_sync(0xffffffffu, a3, o);
      if (lane == 0) s_a[t][i] = a3;
    }
    if (lane < g) {
      float lo = 0.f, step = 0.f;
      if (phys >= 0) {
        const std::int64_t ph = static_cast<std::int64_t>(phys) * p.Hkv + h;
        lo = p.rgrid[2 * ph];
        step = p.rgrid[2 * ph + 1];
      }
      s_base[t][lane] = __dmul_rn(static_cast<double>(lo), static_cast<double>(s_sum[lane]));
      if (lane == 0) s_third[t] = __ddiv_rn(static_cast<double>(step), 3.0);
    }
  }
  __syncthreads();
  const int phys = mine ? s_phys[t] : -1;
  int I[kMaxG];
#pragma unroll
  for (int i = 0; i < kMaxG; ++i) I[i] = 0;
  if (phys >= 0) {
    const int* u = s_u + t * kUStride;
#pragma unroll
    for (int piece = 0; piece < kBytes / 16; ++piece) {
      const uint4 r = my_codes[piece];
      const unsigned words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
        for (int by = 0; by < 4; ++by) {  // channels c .. c + 3 (a byte of codes)
          const int codes = spread_codes((words[wi] >> (8 * by)) & 0xffu);
          const int pr = (piece * 64 + wi * 16 + by * 4) / 2;
#pragma unroll
          for (int i = 0; i < kMaxG; ++i) {
            if (i < g) {
              I[i] = __dp2a_lo(u[i * kPairs + pr], codes, I[i]);
              I[i] = __dp2a_hi(u[i * kPairs + pr + 1], codes, I[i]);
            }
          }
        }
      }
    }
  }
  // A kept token is not ranked (token_codes' candidates can hold the window's partial page),
  // but with log_prob it is scored: it is in its head's LSE (the pooling zeroes it after).
  const std::int64_t token =
      mine ? static_cast<std::int64_t>(p.cand[pair * p.cand_max + c0 + t]) * P + slot : -1;
  const bool kept = token < s.tok_first_end || token >= s.tok_last_begin;
  // Two passes: only the first pass's candidates (the kept tokens among them) are scored.
  const bool candidate =
      p.cmask == nullptr ||
      (mine && token < s.L &&
       ((p.cmask[pair * p.mask_words + (token >> 5)] >> (token & 31)) & 1u) != 0u);
  const bool ranked = mine && phys >= 0 && (p.log_prob ? token < s.L : !kept) && candidate;
  const std::int64_t pos = static_cast<std::int64_t>(c0) * P + j;
#pragma unroll
  for (int i = 0; i < kMaxG; ++i) {
    if (i >= g) break;
    unsigned long long key = 0ull;
    if (ranked) {
      // score = unit · (lo · Q + (step / 3) · I), each operation rounded once (the CPU's).
      const double score = __dmul_rn(
          s_unit[i], __dadd_rn(s_base[t][i],
                               __dmul_rn(s_third[t], static_cast<double>(s_a[t][i] + I[i]))));
      key = ordered_key64(score);
    }
    const std::int64_t seg = static_cast<std::int64_t>(b) * p.Hq + h * g + i;
    if (mine) p.keys2[seg * p.kmax + pos] = key;
    if (p.log_prob) {  // the head's best key (two_stage_pool.cu's LSE): warp, CTA, then global
      unsigned long long m = key;
#pragma unroll
      for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
      if (lane == 0 && m != 0ull) atomicMax(&s_max[i], m);
    }
  }
  if (p.log_prob) {
    __syncthreads();
    if (static_cast<int>(threadIdx.x) < g && s_max[threadIdx.x] != 0ull)
      atomicMax(&p.lmax[static_cast<std::int64_t>(b) * p.Hq + h * g + threadIdx.x],
                s_max[threadIdx.x]);
  }
}

int pow2_ceil(int x) {
  int v = 1;
  while (v < x) v *= 2;
  return v;
}

template <class Kernel>
void go(Kernel k, dim3 grid, dim3 block, std::size_t smem, cudaStream_t st, const Params& p,
            const char* what) {
  k<<<grid, block, smem, st>>>(p);
  check_cuda(cudaGetLastError(), what);
}

}  // namespace
}  // namespace two_stage_impl

using namespace two_stage_impl;

struct TwoStageWorkspace::Impl {
  detail::GrowBuffer<std::uint32_t> keys1;
  detail::GrowBuffer<unsigned long long> keys2, thresh, ckeys, lmax, lsum;
  detail::GrowBuffer<int> ccount, hist, bins;
  detail::GrowBuffer<std::int32_t> cidx;
  detail::GrowBuffer<std::int32_t> list1, len1, cand, n_cand, list2, len2;
  // token_codes' two passes (two_stage_twopass.cu).
  detail::GrowBuffer<unsigned> cmask;
  detail::GrowBuffer<std::int32_t> ch;
  detail::GrowBuffer<int> q8, q1;
  detail::GrowBuffer<double> qunit;
  detail::ErrorFlag err;
  std::size_t cand_size = 0, count_size = 0;
  int cand_stride = 0;
};

TwoStageWorkspace::TwoStageWorkspace() : impl_(std::make_unique<Impl>()) {}
TwoStageWorkspace::~TwoStageWorkspace() = default;

void TwoStageWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "two-stage selection");
  if (flag == 0) return;
  if (flag & kBadPhysical)
    fail(ErrorCode::out_of_range, "indices", "a page id outside the stores was met on the GPU");
  if (flag & kBadLastLen)
    fail(ErrorCode::out_of_range, "last_page_len", "a value outside [1, page_size] on the GPU");
  if (flag & kBadIndptr)
    fail(ErrorCode::out_of_range, "indptr",
         "decreasing, or a sequence longer than TwoStageLaunch::max_pages_per_seq");
  fail(ErrorCode::out_of_range, "max_per_head", "a selection longer than the output lists");
}

std::span<const std::int32_t> TwoStageWorkspace::candidate_pages() const {
  return {impl_->cand.data(), impl_->cand_size};
}
std::span<const std::int32_t> TwoStageWorkspace::candidate_counts() const {
  return {impl_->n_cand.data(), impl_->count_size};
}
int TwoStageWorkspace::candidate_stride() const { return impl_->cand_stride; }

int two_stage_capacity(int max_pages_per_seq, int page_size, std::int64_t budget_tokens,
                       int sink_pages, int window_tokens) {
  const std::int64_t tokens = static_cast<std::int64_t>(max_pages_per_seq) * page_size;
  const std::int64_t kept = static_cast<std::int64_t>(std::max(sink_pages, 0)) * page_size +
                            std::max<std::int64_t>(window_tokens, page_size);
  return static_cast<int>(std::min(tokens, std::max(budget_tokens, kept)));
}

void two_stage_select(const TwoStageSelectArgs& a, const TwoStageLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const int d = a.q.n2;
  require(d == 64 || d == 128, unsupported, "head_dim", "the two-stage GPU selection serves 64 and 128; got ", d);
  require(a.q.data != nullptr && a.q.n0 >= 0, invalid_argument, "q", "null or negative batch");
  const int B = a.q.n0, Hq = a.q.n1;
  const int Hkv = a.candidate_factor == 0 ? a.codes.num_kv_heads : a.bounds.num_kv_heads;
  require(Hkv > 0 && Hq % Hkv == 0 && Hq / Hkv <= kMaxG, shape_mismatch, "q",
          "q heads must be a multiple of the kv heads, at most ", kMaxG, " per kv head");
  const bool every_page = a.candidate_factor == 0;  // token_codes: no page stage
  require(every_page ||
              (a.bounds.min && a.bounds.max && a.bounds.head_dim == d && a.bounds.num_pages > 0),
          invalid_argument, "bounds", "the bf16 store is missing or of another head_dim");
  require(a.codes.codes && a.codes.range_min && a.codes.range_max && a.codes.grid &&
              a.codes.head_dim == d && a.codes.num_kv_heads == Hkv &&
              a.codes.page_size == a.page_size && a.codes.num_pages > 0,
          invalid_argument, "codes", "page codes and their ranges of the store's geometry needed");
  require(reinterpret_cast<std::uintptr_t>(a.codes.codes) % 16 == 0, invalid_argument, "codes",
          "must be 16-byte aligned");
  require(reinterpret_cast<std::uintptr_t>(a.codes.range_min) % 4 == 0 &&
              reinterpret_cast<std::uintptr_t>(a.codes.range_max) % 4 == 0,
          invalid_argument, "codes", "the ranges must be 4-byte aligned");
  require(every_page || (reinterpret_cast<std::uintptr_t>(a.bounds.min) % 16 == 0 &&
                         reinterpret_cast<std::uintptr_t>(a.bounds.max) % 16 == 0),
          invalid_argument, "bounds", "must be 16-byte aligned");
  require(a.page_size >= 1 && a.page_size <= 256 && (a.page_size & (a.page_size - 1)) == 0,
          invalid_argument, "page_size", "must be a power of two in [1, 256]");
  require(a.table.indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch, "indptr",
          "needs batch + 1 entries (batch from q)");
  require(a.table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs batch entries");
  require(a.budget_tokens > 0, invalid_argument, "budget_tokens", "a fixed budget needs tokens > 0");
  require(a.sink_pages >= 0, invalid_argument, "sink_pages", "must be >= 0");
  require(a.window_tokens >= 0, invalid_argument, "window_tokens", "must be >= 0");
  require(a.candidate_factor >= 0, invalid_argument, "candidate_factor",
          "must be >= 1, or 0 for every page (token_codes)");
  // The CPU methods' own rules (select::resolved_group): token_codes log_prob, two_stage union.
  const select::GroupRule group =
      a.group != select::GroupRule::method_default ? a.group
      : a.candidate_factor == 0                    ? select::GroupRule::log_prob
                                                   : select::GroupRule::union_heads;
  require(group == select::GroupRule::union_heads ||
              (group == select::GroupRule::log_prob && a.candidate_factor == 0),
          unsupported, "group",
          "the GPU serves the round robin, and the log-prob pooling with candidate_factor 0");
  const bool log_prob = group == select::GroupRule::log_prob;
  // Two passes (token_codes only; the CPU scorer's checks, select/scorers/page_codes.cpp).
  require(a.code_channels > 0 && a.code_channels <= 1, invalid_argument, "code_channels",
          "must be in (0, 1], got ", a.code_channels);
  require(a.code_channels == 1 || a.code_candidates >= 1, invalid_argument, "code_candidates",
          "must be >= 1, got ", a.code_candidates);
  const bool two_pass = every_page && a.code_channels < 1;
  require(!two_pass || (a.codes.chan_codes != nullptr && a.codes.chan_ranges != nullptr),
          invalid_argument, "codes",
          "two passes (code_channels < 1) read the codes' channel-major copy (chan_codes, "
          "chan_ranges), which is missing");
  require(!two_pass || !a.code_channel_spread || a.codes.chan_spread != nullptr, invalid_argument,
          "codes",
          "two passes weighing channels by their spread (code_channel_spread) read the codes' "
          "chan_spread rows, which are missing");
  require(!two_pass || (reinterpret_cast<std::uintptr_t>(a.codes.chan_codes) % 4 == 0 &&
                        reinterpret_cast<std::uintptr_t>(a.codes.chan_ranges) % 2 == 0),
          invalid_argument, "codes",
          "the channel-major copy must be 4-byte aligned (its ranges 2-byte aligned)");
  // select::detail::code_channel_count (select/scorer.hpp): round(f · d), at least one.
  const int chan_r =
      two_pass ? std::clamp(static_cast<int>(std::lround(a.code_channels * d)), 1, d) : 0;
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq", "must be > 0");
  require(std::isfinite(a.scale) && a.scale >= 0, invalid_argument, "scale",
          "must be finite and >= 0 (0: 1/sqrt(d))");
  const int P = a.page_size, max_pages = launch.max_pages_per_seq;
  const int capmax = two_stage_capacity(max_pages, P, a.budget_tokens, a.sink_pages,
                                        a.window_tokens);
  const std::int64_t cand_max64 =
      every_page ? max_pages
                 : std::min<std::int64_t>(max_pages, static_cast<std::int64_t>(a.candidate_factor) *
                                                         ((capmax + P - 1) / P));
  require(every_page || cand_max64 <= kMaxDepth, unsupported, "candidate_factor",
          "candidate_factor x the budget's pages exceeds ", kMaxDepth, " pages");
  // The token merge marks the ranked tokens in a shared-memory bitmap (one bit each).
  require(cand_max64 * P <= static_cast<std::int64_t>(kMaxBitmapBytes) * 8, unsupported,
          "max_pages_per_seq", "more than ", static_cast<std::int64_t>(kMaxBitmapBytes) * 8,
          " candidate tokens per sequence");
  require(capmax <= kMaxDepth, unsupported, "budget_tokens", "more than ", kMaxDepth,
          " tokens per list");
  const int cand_max = std::max(1, static_cast<int>(cand_max64));
  require(a.max_per_head >= 0 &&
              a.ids.size() == static_cast<std::size_t>(B) * Hkv * a.max_per_head,
          shape_mismatch, "ids", "must be [batch][kv heads][max_per_head]");
  require(a.count.size() == static_cast<std::size_t>(B) * Hkv, shape_mismatch, "count",
          "must be [batch][kv heads]");
  if (B == 0) return;
  require(a.max_per_head > 0, invalid_argument, "max_per_head", "must be > 0");

  const int g = Hq / Hkv;
  const int kmax = cand_max * P;
  const int depth2 = std::max(1, capmax);
  // The first pass's list: min(L, code_candidates x cap) tokens less the kept ones, at most.
  const int depth1 =
      two_pass ? static_cast<int>(std::max<std::int64_t>(
                     1, std::min<std::int64_t>(static_cast<std::int64_t>(max_pages) * P,
                                               static_cast<std::int64_t>(a.code_candidates) *
                                                   capmax)))
               : 0;
  const int mask_words = two_pass ? (max_pages * P + 31) / 32 : 0;
  TwoStageWorkspace::Impl& ws = launch.workspace->impl();
  const std::size_t segs = static_cast<std::size_t>(B) * Hq, pairs = static_cast<std::size_t>(B) * Hkv;
  if (!every_page) {
    ws.keys1.reserve(segs * max_pages, "cudaMalloc(two-stage page keys)");
    ws.list1.reserve(segs * cand_max, "cudaMalloc(two-stage page lists)");
    ws.len1.reserve(segs, "cudaMalloc(two-stage page lists)");
  }
  ws.cand.reserve(pairs * cand_max, "cudaMalloc(two-stage candidates)");
  ws.n_cand.reserve(pairs, "cudaMalloc(two-stage candidates)");
  ws.keys2.reserve(segs * kmax, "cudaMalloc(two-stage token keys)");
  ws.list2.reserve(segs * static_cast<std::size_t>(std::max(depth2, depth1)),
                   "cudaMalloc(two-stage token lists)");
  ws.len2.reserve(segs, "cudaMalloc(two-stage token lists)");
  ws.thresh.reserve(segs, "cudaMalloc(two-stage token thresholds)");
  ws.ccount.reserve(segs, "cudaMalloc(two-stage token thresholds)");
  ws.ckeys.reserve(segs * kCompactCap, "cudaMalloc(two-stage compacted keys)");
  ws.cidx.reserve(segs * kCompactCap, "cudaMalloc(two-stage compacted keys)");
  if (two_pass) {
    ws.cmask.reserve(pairs * mask_words, "cudaMalloc(token_codes candidates)");
    ws.ch.reserve(pairs * d, "cudaMalloc(token_codes channels)");
    ws.q8.reserve(segs * d, "cudaMalloc(token_codes channels)");
    ws.q1.reserve(segs, "cudaMalloc(token_codes channels)");
    ws.qunit.reserve(segs, "cudaMalloc(token_codes channels)");
  }
  if (log_prob || two_pass) {
    ws.lmax.reserve(segs, "cudaMalloc(two-stage log-prob max)");
    ws.lsum.reserve(segs, "cudaMalloc(two-stage log-prob sum)");
    ws.hist.reserve(segs * kBins, "cudaMalloc(two-stage log-prob histogram)");
    ws.bins.reserve(segs * 3, "cudaMalloc(two-stage log-prob histogram)");
  }
  ws.cand_size = pairs * cand_max;
  ws.count_size = pairs;
  ws.cand_stride = cand_max;

  Params p{};
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.indptr = a.table.indptr.data();
  p.indices = a.table.indices.data();
  p.last_len = a.table.last_page_len.data();
  p.B = B;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.g = g;
  p.P = P;
  p.bmin = reinterpret_cast<const std::uint16_t*>(a.bounds.min);
  p.bmax = reinterpret_cast<const std::uint16_t*>(a.bounds.max);
  p.bound_pages = a.bounds.num_pages;
  p.codes = a.codes.codes;
  p.rmin = a.codes.range_min;
  p.rmax = a.codes.range_max;
  p.rgrid = a.codes.grid;
  p.code_pages = a.codes.num_pages;
  p.scale = a.scale > 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(d));
  p.slack_f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
  p.budget = a.budget_tokens;
  p.sinks = a.sink_pages;
  p.window = a.window_tokens;
  p.factor = a.candidate_factor;
  p.max_pages = max_pages;
  p.cand_max = cand_max;
  p.kmax = kmax;
  p.keys1 = ws.keys1.data();
  p.list1 = ws.list1.data();
  p.len1 = ws.len1.data();
  p.cand = ws.cand.data();
  p.n_cand = ws.n_cand.data();
  p.keys2 = ws.keys2.data();
  p.list2 = ws.list2.data();
  p.len2 = ws.len2.data();
  p.thresh = ws.thresh.data();
  p.ccount = ws.ccount.data();
  p.ckeys = ws.ckeys.data();
  p.cidx = ws.cidx.data();
  p.depth2 = depth2;
  p.log_prob = log_prob ? 1 : 0;
  p.lmax = ws.lmax.data();
  p.lsum = ws.lsum.data();
  p.hist = ws.hist.data();
  p.bins = ws.bins.data();
  p.out_ids = a.ids.data();
  p.out_count = a.count.data();
  p.max_per_head = a.max_per_head;
  p.err = ws.err.get();

  cudaStream_t st = launch.stream;
  const std::size_t rank1_smem = static_cast<std::size_t>(pow2_ceil(cand_max)) * 12;
  const std::size_t rank2_smem = static_cast<std::size_t>(pow2_ceil(depth2)) * 12;
  const std::size_t merge1_smem = static_cast<std::size_t>((max_pages + 31) / 32) * 4;
  const std::size_t merge2_smem = static_cast<std::size_t>((kmax + 31) / 32) * 4;
  // Shared-memory limits raised once per kernel to what the largest list can need.
  static const int compact_cap = compact_cap_of(detail::dynamic_smem_room(rank_compact_kernel));
  static const bool ready = [] {
    detail::set_dynamic_smem(rank_kernel<std::uint32_t, 1>, kMaxDepth * 12,
                             "the two-stage rank kernel");
    detail::set_dynamic_smem(rank_kernel<unsigned long long, 2>, kMaxDepth * 12,
                             "the two-stage rank kernel");
    detail::set_dynamic_smem(sample_kernel, kSampleMax * 8, "the two-stage sample kernel");
    detail::set_dynamic_smem(rank_compact_kernel, static_cast<std::size_t>(compact_cap) * 12,
                             "the two-stage compacted rank kernel");
    return true;
  }();
  (void)ready;
  p.compact_cap = compact_cap;

  // score_kernel (and the first pass): a thread per token, whole pages per CTA.
  p.score_pages = std::max(1, std::min(kScorePages, kThreads / P));
  if (two_pass) {
    // The first pass: every page (its Params: log_prob, the ranking's count from
    // code_candidates, its own list depth), then the candidates' bitmap and pages.
    Params p1 = p;
    p1.log_prob = 1;
    p1.pick = a.code_candidates;
    p1.depth2 = depth1;
    p1.r = chan_r;
    p1.chan_codes = a.codes.chan_codes;
    p1.chan_ranges = a.codes.chan_ranges;
    p1.chan_spread = a.code_channel_spread ? a.codes.chan_spread : nullptr;
    p1.ch = ws.ch.data();
    p1.q8 = ws.q8.data();
    p1.q1 = ws.q1.data();
    p1.qunit = ws.qunit.data();
    p1.cmask = ws.cmask.data();
    p1.mask_words = mask_words;
    go(all_pages_kernel, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0, st, p1,
       "token_codes candidate kernel");
    launch_first_pass(p1, d, static_cast<int>(segs), static_cast<int>(pairs), st);
    // The second pass: the candidates' pages (n_cand, cand), their tokens in the bitmap alone.
    p.cmask = ws.cmask.data();
    p.mask_words = mask_words;
  } else if (every_page) {
    go(all_pages_kernel, dim3(static_cast<unsigned>(pairs)), dim3(kThreads), 0, st, p,
       "token_codes candidate kernel");
  } else {
    const dim3 bgrid((max_pages + kTilePages - 1) / kTilePages, Hkv, B);
    if (d == 64) {
      go(bounds_kernel<64>, bgrid, dim3(kThreads), 0, st, p, "two-stage bounds kernel");
    } else {
      go(bounds_kernel<128>, bgrid, dim3(kThreads), 0, st, p, "two-stage bounds kernel");
    }
    go(rank_kernel<std::uint32_t, 1>, dim3(static_cast<unsigned>(segs)), dim3(kRankThreads),
       rank1_smem, st, p, "two-stage page rank kernel");
    launch_merge(1, p, static_cast<int>(pairs), merge1_smem, st);
  }
  if (log_prob) clear_log_prob(p, static_cast<int>(segs), st);  // the score kernel's max
  const dim3 sgrid((cand_max + p.score_pages - 1) / p.score_pages, Hkv, B);
  if (d == 64) {
    go(score_kernel<64>, sgrid, dim3(kThreads), 0, st, p, "two-stage score kernel");
  } else {
    go(score_kernel<128>, sgrid, dim3(kThreads), 0, st, p, "two-stage score kernel");
  }
  if (log_prob) {  // the pooled keys, and their best by a histogram of log-probabilities
    launch_log_prob_pool(p, static_cast<int>(segs), static_cast<int>(pairs), st);
  } else {
    go(sample_kernel, dim3(static_cast<unsigned>(segs)), dim3(kRankThreads), kSampleMax * 8, st,
       p, "two-stage token sample kernel");
    const int per_cta = kThreads * kCompactPer;
    go(compact_kernel, dim3(static_cast<unsigned>((kmax + per_cta - 1) / per_cta),
                            static_cast<unsigned>(segs)),
       dim3(kThreads), 0, st, p, "two-stage token compact kernel");
    go(rank_compact_kernel, dim3(static_cast<unsigned>(segs)), dim3(kRankThreads),
       static_cast<std::size_t>(p.compact_cap) * 12, st, p, "two-stage compacted rank kernel");
  }
  go(rank_kernel<unsigned long long, 2>, dim3(static_cast<unsigned>(segs)),
         dim3(kRankThreads), rank2_smem, st, p, "two-stage token rank kernel");
  launch_merge(2, p, static_cast<int>(pairs), merge2_smem, st);
  if (launch.check_errors) launch.workspace->check(st);
}

}  // namespace masskv::cuda
