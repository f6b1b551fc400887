// AVX2 dot product on INT4 selector keys (see int4_kernels.hpp): nibbles are widened to f32 in
// registers, never written back. Compiled with -mavx2 -mfma -mf16c; entered after a CPU check.
#include <immintrin.h>

#include "kv/int4_kernels.hpp"

namespace masskv::kv::int4::detail {

namespace {

// 8 int8 values at p (already minus 8) as f32.
inline __m256 widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

}  // namespace

float dot_row_avx2(const float* q, const std::uint8_t* packed, const std::uint16_t* scales,
                   int d) {
  const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  __m256 total = _mm256_setzero_ps();
  for (int b0 = 0; b0 < d; b0 += 32) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + b0 / 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                     // 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // 16..31
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(q + b0), widen8(lo));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + b0 + 8), widen8(_mm_srli_si128(lo, 8)), acc);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + b0 + 16), widen8(hi), acc);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + b0 + 24), widen8(_mm_srli_si128(hi, 8)), acc);
    const float s = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(scales[b0 / 32])));
    total = _mm256_fmadd_ps(_mm256_set1_ps(s), acc, total);
  }
  return hsum(total);
}

}  // namespace masskv::kv::int4::detail
