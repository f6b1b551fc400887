// AVX2 Q8-activation kernels (see quant_kernels.hpp): the quantiser and integer dot products.
// Pointer kernels only, entered after masskv::cpu::has_avx2().
//
// Per block of 32: the weight integers as 32 bytes in value order, _mm256_maddubs_epi16
// (unsigned x signed bytes -> pairs summed in int16, no overflow: |pair| <= 2 * 128 * 127)
// and _mm256_madd_epi16 by the group scale (or 1) give 8 exact int32 lanes (lane l: values
// 4l..4l+3); signed weights go in as |w| against x with w's sign. One fused multiply-add per
// block folds the lanes into the f32 accumulator. quant_q8.cpp computes the same bits.
#include <immintrin.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "core/simd_avx2.hpp"
#include "model/quant_kernels.hpp"

namespace masskv::model::kernels {
namespace {

using simd::f16_at;
using simd::hsum;

__m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Lane l = g_l * sum_{j=4l}^{4l+3} u_j s_j for unsigned bytes u, signed bytes s and the int16
// group scales g (pairs of int16 lanes 2l, 2l+1 carry g_l).
__m256i dot_us(__m256i u, __m256i s, __m256i g) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), g);
}
// The same for signed weights w: |w| * (s with w's sign; zero where w is 0).
__m256i dot_ss(__m256i w, __m256i s, __m256i g) {
  return dot_us(_mm256_abs_epi8(w), _mm256_sign_epi8(s, w), g);
}

__m256i ones16() { return _mm256_set1_epi16(1); }

// A matrix too large for L3 (the output layer: 30-180 MB) streams one row after another; the
// hardware prefetcher stops at 4 KiB pages, so software prefetch 3 KiB ahead (the best distance
// measured: docs/model.md, "Decode: integer dot products on Q8 activations").
// Prefetches never fault, so reading past the matrix's end is harmless.
constexpr std::size_t kPrefetchBytes = 3072;
void prefetch_ahead(const std::uint8_t* p, std::size_t bytes) {
  for (std::size_t o = 0; o < bytes; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + o), _MM_HINT_T0);
  }
}

// acc += scale * lanes (the block's 8 exact partial sums, |lane| < 2^24 so exact in f32).
__m256 fold(__m256 acc, float scale, __m256i lanes) {
  return _mm256_fmadd_ps(_mm256_set1_ps(scale), _mm256_cvtepi32_ps(lanes), acc);
}

// The 32 nibbles of a 16-byte run in value order: low nibbles (values 0-15), then high.
__m256i nibbles(const std::uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m4 = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

// 0x10 in byte j where bit j of the little-endian 32-bit qh is set (Q5's fifth bit).
__m256i fifth_bits(const std::uint8_t* qh_bytes) {
  std::uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  // Byte j takes byte j / 8 of qh (each 128-bit lane holds all 4), then tests bit j % 8.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// kQ8Chains accumulators (block xb folds into chain xb % 4), so a block's FMA does not wait on
// the previous block's; summed lane-wise as (c0 + c1) + (c2 + c3), then hsum.
static_assert(kQ8Chains == 4);
struct Chains {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};

  float sum() const {
    return hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
  }
};

// The f16 values at p + k * stride for k < 4 as 4 floats: gathered in a general register, so
// the vector units convert 4 scales with one instruction.
__m128 f16x4(const std::uint8_t* p, std::size_t stride) {
  std::uint64_t v = 0;
  for (std::size_t k = 0; k < 4; ++k) {
    std::uint16_t h;
    std::memcpy(&h, p + k * stride, 2);
    v |= static_cast<std::uint64_t>(h) << (16 * k);
  }
  return _mm_cvtph_ps(_mm_cvtsi64_si128(static_cast<long long>(v)));
}

// Lane k of v in all 8 lanes.
template <int K>
__m256 lane(__m128 v) {
  return _mm256_broadcastss_ps(_mm_shuffle_ps(v, v, _MM_SHUFFLE(K, K, K, K)));
}

// Types with blocks of 32 (see dot_blocks32 in quant_q8.cpp): Weights(b) gives the block's 32
// weight bytes, signed or unsigned per Signed; Offset: the type adds m * sum_x per block, lane
// k of `off` being chain k. Blocks go in groups of 4 (one per chain) whose scales and offsets
// are converted and multiplied 4 at a time; the per-lane roundings are the scalar kernel's.
template <std::size_t Bytes, bool Signed, bool Offset, class Weights>
float dot_blocks32(const void* row, Q8View x, std::size_t n, Weights weights) {
  const auto* base = static_cast<const std::uint8_t*>(row);
  const auto lanes = [&](std::size_t i) {
    const __m256i w = weights(base + i * Bytes);
    const __m256i xq = load32(x.q + 32 * i);
    if constexpr (Signed) return dot_ss(w, xq, ones16());
    return dot_us(w, xq, ones16());
  };
  Chains c;
  __m128 off = _mm_setzero_ps();
  const std::size_t nb = n / 32;
  std::size_t i = 0;
  for (; i + 4 <= nb; i += 4) {
    const std::uint8_t* b = base + i * Bytes;
    prefetch_ahead(b, 4 * Bytes);
    const __m128 scale = _mm_mul_ps(f16x4(b, Bytes), _mm_loadu_ps(x.d + i));
    c.acc[0] = _mm256_fmadd_ps(lane<0>(scale), _mm256_cvtepi32_ps(lanes(i)), c.acc[0]);
    c.acc[1] = _mm256_fmadd_ps(lane<1>(scale), _mm256_cvtepi32_ps(lanes(i + 1)), c.acc[1]);
    c.acc[2] = _mm256_fmadd_ps(lane<2>(scale), _mm256_cvtepi32_ps(lanes(i + 2)), c.acc[2]);
    c.acc[3] = _mm256_fmadd_ps(lane<3>(scale), _mm256_cvtepi32_ps(lanes(i + 3)), c.acc[3]);
    if constexpr (Offset) off = _mm_fmadd_ps(f16x4(b + 2, Bytes), _mm_loadu_ps(x.sum + i), off);
  }
  // The last nb % 4 blocks: chains 0.., offsets only into their own lanes (constant chain
  // indices keep the accumulators in registers).
  float m[4] = {}, sx[4] = {};
  const auto tail = [&](std::size_t k, __m256& acc) {
    if (i + k >= nb) return;
    const std::uint8_t* b = base + (i + k) * Bytes;
    acc = fold(acc, f16_at(b) * x.d[i + k], lanes(i + k));
    if constexpr (Offset) {
      m[k] = f16_at(b + 2);
      sx[k] = x.sum[i + k];
    }
  };
  tail(0, c.acc[0]);
  tail(1, c.acc[1]);
  tail(2, c.acc[2]);
  if constexpr (Offset) {
    const auto rem = static_cast<int>(nb - i);
    const __m128 valid =
        _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(rem), _mm_setr_epi32(0, 1, 2, 3)));
    off = _mm_blendv_ps(off, _mm_fmadd_ps(_mm_loadu_ps(m), _mm_loadu_ps(sx), off), valid);
    const __m128 pairs = _mm_add_ps(off, _mm_movehdup_ps(off));  // lanes 0, 2: o0+o1, o2+o3
    return c.sum() + _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehl_ps(pairs, pairs)));
  }
  return c.sum();
}

}  // namespace

void quantize_q8_avx2(const float* x, std::size_t n, std::int8_t* q, float* d, float* sum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (std::size_t b = 0; b < n / 32; ++b, x += 32, q += 32) {
    __m256 v[4], amax8 = _mm256_setzero_ps();
    int bad = 0;
    for (int g = 0; g < 4; ++g) {
      v[g] = _mm256_loadu_ps(x + 8 * g);
      const __m256 a = _mm256_andnot_ps(sign, v[g]);
      bad |= _mm256_movemask_ps(_mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_NLE_UQ));
      amax8 = _mm256_max_ps(amax8, a);
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float db = _mm_cvtss_f32(m4) / 127.0f;
    if (bad != 0 || db < FLT_MIN) {
      std::memset(q, 0, 32);
      d[b] = sum[b] = bad != 0 ? __builtin_nanf("") : 0.0f;
      continue;
    }
    const __m256 id = _mm256_set1_ps(1.0f / db);
    __m256i qi[4];
    for (int g = 0; g < 4; ++g) {
      qi[g] = _mm256_cvtps_epi32(
          _mm256_round_ps(_mm256_mul_ps(v[g], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i s =
        _mm256_add_epi32(_mm256_add_epi32(qi[0], qi[1]), _mm256_add_epi32(qi[2], qi[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    // The packs interleave 128-bit lanes; the permute puts the 8 dword groups back in order.
    const __m256i p16a = _mm256_packs_epi32(qi[0], qi[1]);
    const __m256i p16b = _mm256_packs_epi32(qi[2], qi[3]);
    const __m256i p8 = _mm256_packs_epi16(p16a, p16b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    d[b] = db;
    sum[b] = db * static_cast<float>(_mm_cvtsi128_si32(s4));
  }
}

float q8_dot_q4_0_avx2(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<q4_0_bytes, true, false>(row, x, n, [](const std::uint8_t* b) {
    return _mm256_sub_epi8(nibbles(b + 2), _mm256_set1_epi8(8));
  });
}

float q8_dot_q4_1_avx2(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<q4_1_bytes, false, true>(
      row, x, n, [](const std::uint8_t* b) { return nibbles(b + 4); });
}

float q8_dot_q5_0_avx2(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<q5_0_bytes, true, false>(row, x, n, [](const std::uint8_t* b) {
    return _mm256_sub_epi8(_mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)),
                           _mm256_set1_epi8(16));
  });
}

float q8_dot_q5_1_avx2(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<q5_1_bytes, false, true>(row, x, n, [](const std::uint8_t* b) {
    return _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4));
  });
}

float q8_dot_q8_0_avx2(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<q8_0_bytes, true, false>(row, x, n,
                                               [](const std::uint8_t* b) { return load32(b + 2); });
}

// Q4_K (see quant_q8.cpp): run c of 32 bytes holds sub-block 2c in its low nibbles and 2c + 1
// in its high nibbles; the min terms go to their own 8 lanes (lane s).
float q8_dot_q4_k_avx2(const void* row, Q8View x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  const __m256i m4 = _mm256_set1_epi8(0x0F);
  Chains ch;
  __m256 mins = _mm256_setzero_ps();
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q4_k_bytes) {
    prefetch_ahead(b, q4_k_bytes);
    const float d = f16_at(b), dmin = f16_at(b + 2);
    std::uint8_t sc[8], mn[8];
    q4_k_scales_mins(b + 4, sc, mn);
    const std::size_t xb = 8 * i;
    // Sub-blocks s = 2c, 2c + 1 fold into chains s % 4.
    const auto run = [&](std::size_t c, __m256& acc_lo, __m256& acc_hi) {
      const __m256i v = load32(b + 16 + 32 * c);
      const __m256i lo = _mm256_and_si256(v, m4);
      const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      const std::size_t s = 2 * c;
      acc_lo = fold(acc_lo, d * x.d[xb + s],
                    dot_us(lo, load32(x.q + 32 * (xb + s)), _mm256_set1_epi16(sc[s])));
      acc_hi = fold(acc_hi, d * x.d[xb + s + 1],
                    dot_us(hi, load32(x.q + 32 * (xb + s + 1)), _mm256_set1_epi16(sc[s + 1])));
    };
    run(0, ch.acc[0], ch.acc[1]);
    run(1, ch.acc[2], ch.acc[3]);
    run(2, ch.acc[0], ch.acc[1]);
    run(3, ch.acc[2], ch.acc[3]);
    std::uint64_t mn8;
    std::memcpy(&mn8, mn, 8);
    const __m256 mnf =
        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(mn8))));
    mins = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(dmin), mnf), _mm256_loadu_ps(x.sum + xb),
                           mins);
  }
  return ch.sum() - hsum(mins);
}

// Q6_K (see quant_q8.cpp): per half, 32 bytes of ql at 0 and 32 and 32 bytes of qh give the
// four quarters; the 2 high bits go to bits 4-5 of each byte, then minus 32. Quarter k folds
// into chain k.
float q8_dot_q6_k_avx2(const void* row, Q8View x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
  const __m256i bias = _mm256_set1_epi8(32);
  Chains ch;
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q6_k_bytes) {
    prefetch_ahead(b, q6_k_bytes);
    const float d = f16_at(b + 208);
    for (std::size_t h = 0; h < 2; ++h) {
      const __m256i a = load32(b + 64 * h), c = load32(b + 64 * h + 32);
      const __m256i hb = load32(b + 128 + 32 * h);
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192 + 8 * h);
      const auto quarter = [&](std::size_t k, __m256i q, __m256& acc) {
        const std::size_t xb = 8 * i + 4 * h + k;
        const __m256i g =
            _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
        acc = fold(acc, d * x.d[xb], dot_ss(_mm256_sub_epi8(q, bias), load32(x.q + 32 * xb), g));
      };
      // 16-bit shifts move bits across the byte boundary; the masks keep each byte's own.
      quarter(
          0,
          _mm256_or_si256(_mm256_and_si256(a, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), m30)),
          ch.acc[0]);
      quarter(
          1,
          _mm256_or_si256(_mm256_and_si256(c, m4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), m30)),
          ch.acc[1]);
      quarter(
          2,
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a, 4), m4), _mm256_and_si256(hb, m30)),
          ch.acc[2]);
      quarter(3,
              _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(c, 4), m4),
                              _mm256_and_si256(_mm256_srli_epi16(hb, 2), m30)),
              ch.acc[3]);
    }
  }
  return ch.sum();
}

}  // namespace masskv::model::kernels
