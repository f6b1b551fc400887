// Small AVX2 helpers shared by the *_avx2.cpp kernels. Include it only from *_avx2.cpp files:
// the functions are compiled for AVX2+F16C and have internal linkage, so no copy of them can
// reach code built for the baseline ISA.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace masskv::simd {

// Sum of the 8 lanes in a fixed tree: ((v0+v4) + (v2+v6)) + ((v1+v5) + (v3+v7)).
static inline float hsum(__m256 v) {
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

// The little-endian f16 at p as a float (exact).
static inline float f16_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

}  // namespace masskv::simd
