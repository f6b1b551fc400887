// Q8 activations (quant.hpp): the quantiser and the portable integer dot kernels.
//
// The scalar kernels are written to give the AVX2 kernels' bits (quant_q8_avx2.cpp), so a test
// can hold the two sets to equality: per block of 32 activations they form the same 8 exact
// integer partial sums (lane l: values 4l..4l+3, times the group scale where the weight type
// has one), fold each into lane l of one of kQ8Chains f32 accumulators with one fused
// multiply-add by (weight scale * activation scale), and reduce them in the same order.
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "masskv/dtype.hpp"
#include "model/quant_kernels.hpp"

namespace masskv::model::kernels {
namespace {

float f16_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(f16{bits});
}

// The AVX2 kernels' f32 accumulators: kQ8Chains of 8 lanes, plus one offset chain each.
struct Lanes {
  float v[kQ8Chains][8] = {};
  float off[kQ8Chains] = {};

  // Lane l of chain xb % kQ8Chains += scale * group_l * sum_{j=4l}^{4l+3} w_j q_j, with
  // group_l = lo for lanes 0-3 (values 0-15) and hi for lanes 4-7 (Q6_K's scales cover 16).
  void add_block(std::size_t xb, const int* w, const std::int8_t* q, float scale, int lo = 1,
                 int hi = 1) {
    float* acc = v[xb % kQ8Chains];
    for (int l = 0; l < 8; ++l) {
      int p = 0;
      for (int j = 4 * l; j < 4 * l + 4; ++j) p += w[j] * q[j];
      p *= l < 4 ? lo : hi;
      acc[l] = std::fma(scale, static_cast<float>(p), acc[l]);
    }
  }
  void add_offset(std::size_t xb, float m, float sum_x) {
    off[xb % kQ8Chains] = std::fma(m, sum_x, off[xb % kQ8Chains]);
  }

  float sum() const {  // (c0 + c1) + (c2 + c3) per lane, then simd::hsum's tree
    float a[8];
    for (int l = 0; l < 8; ++l) a[l] = (v[0][l] + v[1][l]) + (v[2][l] + v[3][l]);
    const float s4[4] = {a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]};
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
  }
  float offsets() const { return (off[0] + off[1]) + (off[2] + off[3]); }
};
static_assert(kQ8Chains == 4);

// ---- integer values of one weight block, in value order -----------------------------------

void nibbles(const std::uint8_t* qs, int w[32]) {  // low nibbles are values 0-15
  for (int j = 0; j < 16; ++j) {
    w[j] = qs[j] & 0x0F;
    w[j + 16] = qs[j] >> 4;
  }
}

void add_fifth_bits(const std::uint8_t* qh, int w[32]) {  // bit j of qh belongs to value j
  for (int j = 0; j < 32; ++j) w[j] |= ((qh[j / 8] >> (j % 8)) & 1) << 4;
}

void offset(int w[32], int c) {
  for (int j = 0; j < 32; ++j) w[j] -= c;
}

// One 32-value block of a Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 row: its integers, scale and offset (0 for
// the types without one).
struct Block32 {
  int w[32];
  float d, m = 0.0f;
};

void unpack_q4_0(const std::uint8_t* b, Block32& o) {
  o.d = f16_at(b);
  nibbles(b + 2, o.w);
  offset(o.w, 8);
}
void unpack_q4_1(const std::uint8_t* b, Block32& o) {
  o.d = f16_at(b);
  o.m = f16_at(b + 2);
  nibbles(b + 4, o.w);
}
void unpack_q5_0(const std::uint8_t* b, Block32& o) {
  o.d = f16_at(b);
  nibbles(b + 6, o.w);
  add_fifth_bits(b + 2, o.w);
  offset(o.w, 16);
}
void unpack_q5_1(const std::uint8_t* b, Block32& o) {
  o.d = f16_at(b);
  o.m = f16_at(b + 2);
  nibbles(b + 8, o.w);
  add_fifth_bits(b + 4, o.w);
}
void unpack_q8_0(const std::uint8_t* b, Block32& o) {
  o.d = f16_at(b);
  for (int j = 0; j < 32; ++j) o.w[j] = static_cast<std::int8_t>(b[2 + j]);
}

// Types with blocks of 32: sum_b d_b dx_b sum_j w_j q_j (+ sum_b m_b * sum_x_b).
template <void (*Unpack)(const std::uint8_t*, Block32&), std::size_t Bytes, bool Offset>
float dot_blocks32(const void* row, Q8View x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  Lanes acc;
  Block32 blk;
  for (std::size_t i = 0; i < n / 32; ++i, b += Bytes) {
    Unpack(b, blk);
    acc.add_block(i, blk.w, x.q + 32 * i, blk.d * x.d[i]);
    if constexpr (Offset) acc.add_offset(i, blk.m, x.sum[i]);
  }
  if constexpr (Offset) return acc.sum() + acc.offsets();
  return acc.sum();
}

}  // namespace

// ---- the quantiser --------------------------------------------------------------------------

void quantize_q8_scalar(const float* x, std::size_t n, std::int8_t* q, float* d, float* sum) {
  for (std::size_t b = 0; b < n / 32; ++b, x += 32, q += 32) {
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < 32; ++j) {
      const float a = std::fabs(x[j]);
      finite = finite && a <= FLT_MAX;
      amax = a > amax ? a : amax;
    }
    const float db = amax / 127.0f;
    if (!finite || db < FLT_MIN) {
      std::memset(q, 0, 32);
      d[b] = sum[b] = finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const float id = 1.0f / db;
    int s = 0;
    for (int j = 0; j < 32; ++j) {
      const int v = static_cast<int>(std::nearbyint(x[j] * id));
      q[j] = static_cast<std::int8_t>(v);
      s += v;
    }
    d[b] = db;
    sum[b] = db * static_cast<float>(s);
  }
}

// ---- integer dot kernels ----------------------------------------------------------------------

float q8_dot_q4_0_scalar(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<unpack_q4_0, q4_0_bytes, false>(row, x, n);
}
float q8_dot_q4_1_scalar(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<unpack_q4_1, q4_1_bytes, true>(row, x, n);
}
float q8_dot_q5_0_scalar(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<unpack_q5_0, q5_0_bytes, false>(row, x, n);
}
float q8_dot_q5_1_scalar(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<unpack_q5_1, q5_1_bytes, true>(row, x, n);
}
float q8_dot_q8_0_scalar(const void* row, Q8View x, std::size_t n) {
  return dot_blocks32<unpack_q8_0, q8_0_bytes, false>(row, x, n);
}

// Q4_K: sub-block s of a super-block holds values d*sc_s*q - dmin*mn_s, so its dot with the
// activation block is d*dx*sc_s*sum(q qx) - dmin*mn_s*sum_x. The min terms go to 8 lanes of
// their own (lane s), as in the AVX2 kernel.
float q8_dot_q4_k_scalar(const void* row, Q8View x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  Lanes acc;
  float mins[8] = {};
  int w[32];
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q4_k_bytes) {
    const float d = f16_at(b), dmin = f16_at(b + 2);
    std::uint8_t sc[8], mn[8];
    q4_k_scales_mins(b + 4, sc, mn);
    for (int s = 0; s < 8; ++s) {
      const std::uint8_t* run = b + 16 + 32 * (s / 2);  // sub-block 2c: low nibbles of run c
      for (int l = 0; l < 32; ++l) w[l] = s % 2 == 0 ? run[l] & 0x0F : run[l] >> 4;
      const std::size_t xb = 8 * i + static_cast<std::size_t>(s);
      acc.add_block(xb, w, x.q + 32 * xb, d * x.d[xb], sc[s], sc[s]);
      mins[s] = std::fma(dmin * static_cast<float>(mn[s]), x.sum[xb], mins[s]);
    }
  }
  const float m4[4] = {mins[0] + mins[4], mins[1] + mins[5], mins[2] + mins[6], mins[3] + mins[7]};
  return acc.sum() - ((m4[0] + m4[2]) + (m4[1] + m4[3]));  // simd::hsum's tree
}

// Q6_K: quarter k of half h (values 128h + 32k + l) takes the low bits from ql (nibble k / 2 of
// byte l + 32 (k % 2)) and 2 high bits from qh[l] >> 2k, minus 32; its two 16-value groups
// have int8 scales sc[8h + 2k] and sc[8h + 2k + 1].
float q8_dot_q6_k_scalar(const void* row, Q8View x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(row);
  Lanes acc;
  int w[32];
  for (std::size_t i = 0; i < n / qk_k; ++i, b += q6_k_bytes) {
    const float d = f16_at(b + 208);
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* ql = b + 64 * h;
      const std::uint8_t* qh = b + 128 + 32 * h;
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192 + 8 * h);
      for (int k = 0; k < 4; ++k) {
        for (int l = 0; l < 32; ++l) {
          const std::uint8_t low = ql[l + 32 * (k % 2)];
          const int low4 = k < 2 ? low & 0x0F : low >> 4;
          w[l] = (low4 | ((qh[l] >> (2 * k)) & 3) << 4) - 32;
        }
        const std::size_t xb =
            8 * i + 4 * static_cast<std::size_t>(h) + static_cast<std::size_t>(k);
        acc.add_block(xb, w, x.q + 32 * xb, d * x.d[xb], sc[2 * k], sc[2 * k + 1]);
      }
    }
  }
  return acc.sum();
}

}  // namespace masskv::model::kernels
