// exp of 8 floats, shared by the AVX2 kernels (attention softmax, FFN activations). Include
// it only from *_avx2.cpp files: the function is compiled for AVX2+FMA and has internal
// linkage, so no copy of it can reach code built for the baseline ISA.
#pragma once

#include <immintrin.h>

namespace masskv::simd {

inline constexpr float kExpMin = -87.33654f;  // ln of the smallest normal f32
inline constexpr float kExpMax = 88.7f;       // below ln(FLT_MAX) = 88.72

// exp(x) for x in [kExpMin, kExpMax] (callers clamp): Cody-Waite reduction by ln 2, degree-6
// polynomial, ~1 ulp. 2^n (n in [-126, 128]) is applied as two exact power-of-two factors so
// that n = 128 does not overflow the exponent field.
static inline __attribute__((always_inline)) __m256 exp_in_range(__m256 x) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
  const __m256 s2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

}  // namespace masskv::simd
