// AVX2/FMA/F16C dot kernels (see quant_kernels.hpp). Pointer kernels only: entered after
// masskv::cpu::has_avx2(). Same block formulas as the scalar decoders in quant.cpp; the
// summation order differs (8 lanes, then a fixed horizontal sum), so results agree with the
// scalar kernels to f32 rounding, not bit for bit.
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/simd_avx2.hpp"
#include "model/quant_kernels.hpp"

namespace masskv::model::kernels {
namespace {

using simd::f16_at;
using simd::hsum;

__m128i load8(const std::uint8_t* p) {
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}

// 8 signed bytes -> 8 floats.
__m256 i8_to_ps(__m128i low8) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(low8)); }

// The 32 nibble values of a 16-byte run as 4 x 8 int32: low nibbles are values 0-15, high
// nibbles values 16-31 (the Q4_0/Q4_1/Q5 layout).
void nibbles32(const std::uint8_t* qs, __m256i q[4]) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(v, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  q[0] = _mm256_cvtepu8_epi32(lo);
  q[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8));
  q[2] = _mm256_cvtepu8_epi32(hi);
  q[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8));
}

// Adds the fifth bit (bit j of qh for value j) to 32 nibble values.
void add_high_bits(std::uint32_t qh, __m256i q[4]) {
  const __m256i bits = _mm256_set1_epi32(static_cast<int>(qh));
  const __m256i one = _mm256_set1_epi32(1);
  for (int g = 0; g < 4; ++g) {
    const __m256i shift = _mm256_setr_epi32(8 * g, 8 * g + 1, 8 * g + 2, 8 * g + 3, 8 * g + 4,
                                            8 * g + 5, 8 * g + 6, 8 * g + 7);
    const __m256i h = _mm256_and_si256(_mm256_srlv_epi32(bits, shift), one);
    q[g] = _mm256_or_si256(q[g], _mm256_slli_epi32(h, 4));
  }
}

void sub_all(__m256i q[4], int c) {
  const __m256i v = _mm256_set1_epi32(c);
  for (int g = 0; g < 4; ++g) q[g] = _mm256_sub_epi32(q[g], v);
}

// sum_j q_j * x_j over 32 values.
__m256 dot32(const __m256i q[4], const float* x) {
  __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(q[0]), _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[1]), _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[2]), _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[3]), _mm256_loadu_ps(x + 24), s);
}

// sum_j x_j over 32 values (the "+ m" term of Q4_1/Q5_1, the "- min" term of Q4_K).
__m256 sum32(const float* x) {
  const __m256 a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
  const __m256 b = _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24));
  return _mm256_add_ps(a, b);
}

// Q4_K sub-block 2c + half of byte run c (v0, v1: its two 16-byte halves) as 4 x 8 int32.
void q4_k_sub_block(__m128i v0, __m128i v1, int half, __m256i q[4]) {
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i l0 =
      half == 0 ? _mm_and_si128(v0, mask) : _mm_and_si128(_mm_srli_epi16(v0, 4), mask);
  const __m128i l1 =
      half == 0 ? _mm_and_si128(v1, mask) : _mm_and_si128(_mm_srli_epi16(v1, 4), mask);
  q[0] = _mm256_cvtepu8_epi32(l0);
  q[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(l0, 8));
  q[2] = _mm256_cvtepu8_epi32(l1);
  q[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(l1, 8));
}

// Calls f(s, q, d * scale_s, dmin * min_s) for the 8 sub-blocks s of the Q4_K block at b
// (q: its 32 values as 4 x 8 int32).
template <class F>
void q4_k_sub_blocks(const std::uint8_t* b, F f) {
  const float d = f16_at(b);
  const float dmin = f16_at(b + 2);
  std::uint8_t sc[8], mn[8];
  q4_k_scales_mins(b + 4, sc, mn);
  __m256i qv[4];
  for (int c = 0; c < 4; ++c) {
    const std::uint8_t* q = b + 16 + 32 * c;
    const __m128i v0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m128i v1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16));
    for (int half = 0; half < 2; ++half) {  // low nibbles: sub-block 2c, high: 2c+1
      const int s = 2 * c + half;
      q4_k_sub_block(v0, v1, half, qv);
      f(s, qv, d * static_cast<float>(sc[s]), dmin * static_cast<float>(mn[s]));
    }
  }
}

// Q6_K: values l..l+7 of the four 32-value quarters of a 128-value half, minus 32 (see
// decode_q6_k in quant.cpp for the layout).
void q6_k_quads(const std::uint8_t* ql, const std::uint8_t* qh, int l, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi32(0x0F), m2 = _mm256_set1_epi32(3);
  const __m256i bias = _mm256_set1_epi32(32);
  const __m256i a = _mm256_cvtepu8_epi32(load8(ql + l));
  const __m256i c = _mm256_cvtepu8_epi32(load8(ql + l + 32));
  const __m256i hb = _mm256_cvtepu8_epi32(load8(qh + l));
  const auto high = [&](int shift) {
    return _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(hb, shift), m2), 4);
  };
  q[0] = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(a, m4), high(0)), bias);
  q[1] = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(c, m4), high(2)), bias);
  q[2] = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(a, 4), high(4)), bias);
  q[3] = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(c, 4), high(6)), bias);
}

}  // namespace

float dot_f32_avx2(const void* row, const float* x, std::size_t n) {
  // Byte pointer: a GGUF may declare an alignment below 4, so rows need not be float-aligned.
  const auto* w = static_cast<const std::uint8_t*>(row);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto* wi = reinterpret_cast<const float*>(w + 4 * i);  // loadu: any alignment
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wi), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wi + 8), _mm256_loadu_ps(x + i + 8), a1);
  }
  float total = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) {
    float wv;
    std::memcpy(&wv, w + 4 * i, 4);
    total += wv * x[i];
  }
  return total;
}

float dot_f16_avx2(const void* row, const float* x, std::size_t n) {
  const auto* w = static_cast<const std::uint8_t*>(row);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
    const __m256 w1 =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i + 16)));
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
  }
  float total = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) total += f16_at(w + 2 * i) * x[i];
  return total;
}

float dot_bf16_avx2(const void* row, const float* x, std::size_t n) {
  const auto* w = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i));
    const __m256 wf = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    acc = _mm256_fmadd_ps(wf, _mm256_loadu_ps(x + i), acc);
  }
  float total = hsum(acc);
  for (; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, w + 2 * i, 2);
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    total += f * x[i];
  }
  return total;
}

float dot_q4_0_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk4_0; ++i, b += q4_0_bytes, x += qk4_0) {
    nibbles32(b + 2, q);
    sub_all(q, 8);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, x), acc);
  }
  return hsum(acc);
}

float dot_q4_1_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk4_1; ++i, b += q4_1_bytes, x += qk4_1) {
    nibbles32(b + 4, q);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, x), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b + 2)), sum32(x), acc);
  }
  return hsum(acc);
}

float dot_q5_0_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk5_0; ++i, b += q5_0_bytes, x += qk5_0) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 2, 4);  // little-endian host (x86)
    nibbles32(b + 6, q);
    add_high_bits(qh, q);
    sub_all(q, 16);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, x), acc);
  }
  return hsum(acc);
}

float dot_q5_1_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk5_1; ++i, b += q5_1_bytes, x += qk5_1) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    nibbles32(b + 8, q);
    add_high_bits(qh, q);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), dot32(q, x), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b + 2)), sum32(x), acc);
  }
  return hsum(acc);
}

float dot_q8_0_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t i = 0; i < n / qk8_0; ++i, b += q8_0_bytes, x += qk8_0) {
    const std::uint8_t* qs = b + 2;
    __m256 s = _mm256_mul_ps(i8_to_ps(load8(qs)), _mm256_loadu_ps(x));
    s = _mm256_fmadd_ps(i8_to_ps(load8(qs + 8)), _mm256_loadu_ps(x + 8), s);
    s = _mm256_fmadd_ps(i8_to_ps(load8(qs + 16)), _mm256_loadu_ps(x + 16), s);
    s = _mm256_fmadd_ps(i8_to_ps(load8(qs + 24)), _mm256_loadu_ps(x + 24), s);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(b)), s, acc);
  }
  return hsum(acc);
}

// Q4_K: per sub-block s, sum w x = d*scale_s * sum q x - dmin*min_s * sum x.
float dot_q4_k_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q4_k_bytes, x += qk_k) {
    q4_k_sub_blocks(b, [&](int s, const __m256i* qv, float ds, float ms) {
      const float* xs = x + 32 * s;
      acc = _mm256_fmadd_ps(_mm256_set1_ps(ds), dot32(qv, xs), acc);
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(ms), sum32(xs), acc);
    });
  }
  return hsum(acc);
}

// Q6_K: 8 values at a time in int32 lanes.
float dot_q6_k_avx2(const void* row, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  __m256 acc = _mm256_setzero_ps();
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q6_k_bytes) {
    const float d = f16_at(b + 208);
    for (int h = 0; h < 2; ++h) {
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192 + 8 * h);
      const float* xh = x + qk_k * i + 128 * h;
      for (int l = 0; l < 32; l += 8) {
        q6_k_quads(b + 64 * h, b + 128 + 32 * h, l, q);
        const int is = l / 16;
        for (int k = 0; k < 4; ++k) {
          const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc[is + 2 * k]));
          const __m256 w = _mm256_mul_ps(_mm256_cvtepi32_ps(q[k]), scale);
          acc = _mm256_fmadd_ps(w, _mm256_loadu_ps(xh + 32 * k + l), acc);
        }
      }
    }
  }
  return hsum(acc);
}

}  // namespace masskv::model::kernels

// ---- dequantisers: the scalar decoders' formulas with the same single rounding per value ----
// (d*q, d*scale and d*scale*q before the "+ m" / "- m" are exact in f32 except Q6_K's last
// product, which both sides round once in the same order), so they equal quant.cpp's bit for bit.
namespace masskv::model::kernels {
namespace {

void store32(float* y, const __m256i q[4], __m256 d) {
  for (int g = 0; g < 4; ++g)
    _mm256_storeu_ps(y + 8 * g, _mm256_mul_ps(_mm256_cvtepi32_ps(q[g]), d));
}

void store32_plus(float* y, const __m256i q[4], __m256 d, __m256 m) {
  for (int g = 0; g < 4; ++g)
    _mm256_storeu_ps(y + 8 * g, _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[g]), d, m));
}

}  // namespace

void dequant_f16_avx2(const void* src, float* dst, std::size_t n) {
  const auto* w = static_cast<const std::uint8_t*>(src);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i))));
  }
  for (; i < n; ++i) dst[i] = f16_at(w + 2 * i);
}

void dequant_bf16_avx2(const void* src, float* dst, std::size_t n) {
  const auto* w = static_cast<const std::uint8_t*>(src);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, w + 2 * i, 2);
    const std::uint32_t u = static_cast<std::uint32_t>(bits) << 16;
    std::memcpy(dst + i, &u, 4);
  }
}

void dequant_q4_0_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk4_0; ++i, b += q4_0_bytes, dst += qk4_0) {
    nibbles32(b + 2, q);
    sub_all(q, 8);
    store32(dst, q, _mm256_set1_ps(f16_at(b)));
  }
}

void dequant_q4_1_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk4_1; ++i, b += q4_1_bytes, dst += qk4_1) {
    nibbles32(b + 4, q);
    store32_plus(dst, q, _mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b + 2)));
  }
}

void dequant_q5_0_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk5_0; ++i, b += q5_0_bytes, dst += qk5_0) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 2, 4);
    nibbles32(b + 6, q);
    add_high_bits(qh, q);
    sub_all(q, 16);
    store32(dst, q, _mm256_set1_ps(f16_at(b)));
  }
}

void dequant_q5_1_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk5_1; ++i, b += q5_1_bytes, dst += qk5_1) {
    std::uint32_t qh;
    std::memcpy(&qh, b + 4, 4);
    nibbles32(b + 8, q);
    add_high_bits(qh, q);
    store32_plus(dst, q, _mm256_set1_ps(f16_at(b)), _mm256_set1_ps(f16_at(b + 2)));
  }
}

void dequant_q8_0_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n / qk8_0; ++i, b += q8_0_bytes, dst += qk8_0) {
    const __m256 d = _mm256_set1_ps(f16_at(b));
    for (int g = 0; g < 4; ++g)
      _mm256_storeu_ps(dst + 8 * g, _mm256_mul_ps(i8_to_ps(load8(b + 2 + 8 * g)), d));
  }
}

void dequant_q4_k_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q4_k_bytes, dst += qk_k) {
    q4_k_sub_blocks(b, [&](int s, const __m256i* qv, float ds, float ms) {
      for (int g = 0; g < 4; ++g) {
        _mm256_storeu_ps(
            dst + 32 * s + 8 * g,
            _mm256_fmsub_ps(_mm256_set1_ps(ds), _mm256_cvtepi32_ps(qv[g]), _mm256_set1_ps(ms)));
      }
    });
  }
}

void dequant_q6_k_avx2(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  __m256i q[4];
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q6_k_bytes) {
    const float d = f16_at(b + 208);
    for (int h = 0; h < 2; ++h) {
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192 + 8 * h);
      float* y = dst + qk_k * i + 128 * h;
      for (int l = 0; l < 32; l += 8) {
        q6_k_quads(b + 64 * h, b + 128 + 32 * h, l, q);
        const int is = l / 16;
        for (int k = 0; k < 4; ++k) {
          const __m256 scale = _mm256_set1_ps(d * static_cast<float>(sc[is + 2 * k]));
          _mm256_storeu_ps(y + 32 * k + l, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(q[k])));
        }
      }
    }
  }
}

}  // namespace masskv::model::kernels
