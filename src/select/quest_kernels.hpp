// Inner loops of the Quest page bound (docs/design.md §2.3), shared by page_bound.cpp and the
// tests that compare the portable and AVX2 versions. With q split into q+ = max(q, 0) and
// q- = min(q, 0), max(q_c m_c, q_c M_c) = q+_c M_c + q-_c m_c exactly (one product is ±0),
// so a bound is two dot products: no compare per channel, FMA-friendly.
//
// For the physical pages pages[0..n) (page p's row of the kv head at mn + p * page_stride):
//   sums[h * n + j] = sum_c qpos[h * d + c] * M_c + qneg[h * d + c] * m_c,   h < nh
//   w[j]            = max_c max(|m_c|, |M_c|)   (scales the rounding slack)
#pragma once

#include <cstdint>

namespace masskv::select::detail {

void quest_sums_portable_f32(const float* mn, const float* mx, std::int64_t page_stride,
                             const std::int32_t* pages, int n, int d, const float* qpos,
                             const float* qneg, int nh, float* sums, float* w);
void quest_sums_portable_bf16(const std::uint16_t* mn, const std::uint16_t* mx,
                              std::int64_t page_stride, const std::int32_t* pages, int n, int d,
                              const float* qpos, const float* qneg, int nh, float* sums, float* w);

// AVX2 + FMA versions; d must be a multiple of 8. Enter only after cpu::has_avx2().
void quest_sums_avx2_f32(const float* mn, const float* mx, std::int64_t page_stride,
                         const std::int32_t* pages, int n, int d, const float* qpos,
                         const float* qneg, int nh, float* sums, float* w);
void quest_sums_avx2_bf16(const std::uint16_t* mn, const std::uint16_t* mx,
                          std::int64_t page_stride, const std::int32_t* pages, int n, int d,
                          const float* qpos, const float* qneg, int nh, float* sums, float* w);

// The fused scan of quest_select: for the physical pages pages[0..n) of a pool laid out
// [page][nkv][d], every kv head h and its g q heads (q rows h*g .. h*g+g-1 of qpos/qneg):
//   sums[(h * g + i) * n + j] = the same value quest_sums_* gives for that head and page
//   w[h * n + j]              = W of (page j, head h), taken from wpre[page * nkv + h] when
//                               wpre is given (the bound store's precomputed W), else computed
// Pages pages[n .. prefetch_n) are only prefetched (the next chunk's first pages).
void quest_scan_avx2_f32(const float* mn, const float* mx, const std::int32_t* pages, int n,
                         int prefetch_n, int nkv, int d, const float* qpos, const float* qneg,
                         int g, float* sums, float* w);
void quest_scan_avx2_bf16(const std::uint16_t* mn, const std::uint16_t* mx,
                          const std::int32_t* pages, int n, int prefetch_n, int nkv, int d,
                          const float* qpos, const float* qneg, int g, const float* wpre,
                          float* sums, float* w);

}  // namespace masskv::select::detail
