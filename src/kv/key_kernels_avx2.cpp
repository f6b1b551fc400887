// AVX2 dot products on selector keys (see key_kernels.hpp): codes are widened to f32 in
// registers, never written back. Compiled with -mavx2 -mfma -mf16c; entered after a CPU check.
#include <immintrin.h>

#include <cstring>

#include "kv/key_kernels.hpp"

namespace masskv::kv::detail {

namespace {

// 8 int8 values as f32.
inline __m256 widen8(__m128i bytes) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes)); }

inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps(t, t, 1)));
}

// q[0..16) times 16 int8 values, summed into acc.
inline __m256 fma16(const float* q, __m128i v, __m256 acc) {
  acc = _mm256_fmadd_ps(_mm256_loadu_ps(q), widen8(v), acc);
  return _mm256_fmadd_ps(_mm256_loadu_ps(q + 8), widen8(_mm_srli_si128(v, 8)), acc);
}

// The values 2 v of 2n E2M1 codes packed in n bytes (value 2i in the low nibble of byte i):
// a shuffle through the 16-entry table, then the low/high nibbles interleaved back in order.
// `lo` receives values 0..15, `hi` values 16..31 (when n = 16).
inline void decode_e2m1x2(__m128i raw, __m128i& lo, __m128i& hi) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kE2M1Twice));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i even = _mm_shuffle_epi8(table, _mm_and_si128(raw, mask));
  const __m128i odd = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(raw, 4), mask));
  lo = _mm_unpacklo_epi8(even, odd);
  hi = _mm_unpackhi_epi8(even, odd);
}

inline float load_f16_scale(const std::uint8_t* p) {
  const int bits = p[0] | (p[1] << 8);
  return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits)));
}

}  // namespace

float dot_bf16_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t*, int d) {
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= d; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 2 * i));
    const __m256 k = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), k, acc);
  }
  float total = hsum(acc);
  for (; i < d; ++i) {
    const std::uint32_t bits = static_cast<std::uint32_t>(codes[2 * i] | (codes[2 * i + 1] << 8))
                               << 16;
    float k;
    std::memcpy(&k, &bits, sizeof k);
    total += q[i] * k;
  }
  return total;
}

float dot_int4_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d) {
  const __m128i mask = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
  __m256 total = _mm256_setzero_ps();
  for (int b0 = 0; b0 < d; b0 += 32) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b0 / 2));
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(raw, mask), eight);                     // 0..15
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), eight);  // 16..31
    const __m256 acc = fma16(q + b0 + 16, hi, fma16(q + b0, lo, _mm256_setzero_ps()));
    const float s = load_f16_scale(scales + 2 * (b0 / 32));
    total = _mm256_fmadd_ps(_mm256_set1_ps(s), acc, total);
  }
  return hsum(total);
}

float dot_mxfp4_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d) {
  __m256 total = _mm256_setzero_ps();
  for (int b0 = 0; b0 < d; b0 += 32) {
    __m128i lo, hi;
    decode_e2m1x2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b0 / 2)), lo, hi);
    const __m256 acc = fma16(q + b0 + 16, hi, fma16(q + b0, lo, _mm256_setzero_ps()));
    const float s = 0.5f * kE8M0Value[scales[b0 / 32]];  // the table holds 2 v
    total = _mm256_fmadd_ps(_mm256_set1_ps(s), acc, total);
  }
  return hsum(total);
}

float dot_nvfp4_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d) {
  __m256 total = _mm256_setzero_ps();
  int b0 = 0;
  for (; b0 + 32 <= d; b0 += 32) {  // two scale blocks per 16 bytes of codes
    __m128i lo, hi;
    decode_e2m1x2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + b0 / 2)), lo, hi);
    const __m256 a0 = fma16(q + b0, lo, _mm256_setzero_ps());
    const __m256 a1 = fma16(q + b0 + 16, hi, _mm256_setzero_ps());
    total = _mm256_fmadd_ps(_mm256_set1_ps(kE4M3Value[scales[b0 / 16]]), a0, total);
    total = _mm256_fmadd_ps(_mm256_set1_ps(kE4M3Value[scales[b0 / 16 + 1]]), a1, total);
  }
  if (b0 < d) {  // d % 32 == 16: one block of 8 bytes left
    __m128i lo, hi;
    decode_e2m1x2(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + b0 / 2)), lo, hi);
    const __m256 a0 = fma16(q + b0, lo, _mm256_setzero_ps());
    total = _mm256_fmadd_ps(_mm256_set1_ps(kE4M3Value[scales[b0 / 16]]), a0, total);
  }
  return 0.5f * hsum(total);
}

// 8 E4M3 codes as f32 / 256: the code's bits placed in an f16 (sign to bit 15, exponent and
// mantissa shifted left by 7) are the same value times 2^-8 — f16's bias is 8 more than
// E4M3's, and E4M3's subnormals (m 2^-9) land on f16's (m 2^7 2^-24) — so F16C converts them
// exactly (the NaN codes are never stored).
inline __m256 e4m3x8_over_256(const std::uint8_t* codes) {
  const __m128i c = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
  const __m128i sign = _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x80)), 8);
  const __m128i mag = _mm_slli_epi16(_mm_and_si128(c, _mm_set1_epi16(0x7f)), 7);
  return _mm256_cvtph_ps(_mm_or_si128(sign, mag));
}

float dot_mxfp8_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d) {
  __m256 total = _mm256_setzero_ps();
  for (int b0 = 0; b0 < d; b0 += 32) {
    __m256 acc = _mm256_setzero_ps();
    for (int i = 0; i < 32; i += 8) {
      acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + b0 + i), e4m3x8_over_256(codes + b0 + i), acc);
    }
    const float s = 256.0f * kE8M0Value[scales[b0 / 32]];  // exact: mxfp8 scales are <= 2^119
    total = _mm256_fmadd_ps(_mm256_set1_ps(s), acc, total);
  }
  return hsum(total);
}

}  // namespace masskv::kv::detail
