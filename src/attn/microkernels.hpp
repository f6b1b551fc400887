// Pointer micro-kernels of the CPU attention stages (docs/design.md §1): scores of the g query
// heads of one kv group against n key rows, and the weighted sum of n value rows. Rows are
// given as an array of pointers so one kernel serves dense pages, page selections, token
// selections and any layout (HND, NHD). Every row is loaded and converted once for all g
// heads (GQA: the bytes read per token do not grow with the group size).
#pragma once

#include <cstdint>

namespace masskv::attn::mk {

// dtype codes: the values of masskv::DType (0 = f32, 1 = f16, 2 = bf16).

// Prefetching: `pf` lists up to `npf` rows the caller reads next (e.g. the next page of the
// same head); the kernel spreads their prefetches over its own work so that memory and
// arithmetic overlap (a burst of prefetches would stall on the miss buffers instead).
// pf == nullptr: the kernel looks ahead in its own rows.
//
// s[h * ls + r] = scale * dot(q + h * d, rows[r]) for h < g, r < n. q is f32, [g][d].
using ScoresFn = void (*)(int dtype, const float* q, int g, int d, const void* const* rows, int n,
                          float scale, float* s, std::int64_t ls, const void* const* pf, int npf);
// acc[h * d + c] += sum_r w[h * lw + r] * rows[r][c] for h < g, c < d.
using AccumulateFn = void (*)(int dtype, const float* w, std::int64_t lw, int g, int d,
                              const void* const* rows, int n, float* acc, const void* const* pf,
                              int npf);
// x[i] = exp(x[i] - m) (0 for x[i] = -inf); returns the sum of the new x.
using ExpSumFn = float (*)(float* x, int n, float m);
// max of x[0..n), n > 0 (x holds no NaN).
using MaxFn = float (*)(const float* x, int n);

struct Kernels {
  ScoresFn scores;
  AccumulateFn accumulate;
  ExpSumFn exp_sum;
  MaxFn max;
  const char* name;
};

// Largest head_dim the kernels accept (their stack scratch is sized for it).
inline constexpr int kMaxHeadDim = 512;

// simd = false: the scalar kernels. simd = true: AVX2+FMA+F16C when the CPU has them and
// MASSKV_ISA does not forbid them, else scalar.
const Kernels& kernels(bool simd);

// Scalar versions (microkernels_scalar.cpp).
void scores_scalar(int dtype, const float* q, int g, int d, const void* const* rows, int n,
                   float scale, float* s, std::int64_t ls, const void* const* pf, int npf);
void accumulate_scalar(int dtype, const float* w, std::int64_t lw, int g, int d,
                       const void* const* rows, int n, float* acc, const void* const* pf, int npf);
float exp_sum_scalar(float* x, int n, float m);
float max_scalar(const float* x, int n);

// AVX2 versions (microkernels_avx2.cpp): call only after cpu::has_avx2().
void scores_avx2(int dtype, const float* q, int g, int d, const void* const* rows, int n,
                 float scale, float* s, std::int64_t ls, const void* const* pf, int npf);
void accumulate_avx2(int dtype, const float* w, std::int64_t lw, int g, int d,
                     const void* const* rows, int n, float* acc, const void* const* pf, int npf);
float exp_sum_avx2(float* x, int n, float m);
float max_avx2(const float* x, int n);

}  // namespace masskv::attn::mk
