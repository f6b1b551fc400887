// The minifloat selector key formats, MXFP4, NVFP4 and MXFP8 (E4M3), and the minifloats they are
// made of (E2M1 and E4M3 values, E8M0 and E4M3 scales): masskv/kv/key_formats.hpp defines them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "kv/key_format_rows.hpp"
#include "kv/key_kernels.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/key_formats.hpp"

namespace masskv::kv {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// 2^e by exact halvings and doublings (constexpr, unlike std::ldexp); e >= -149.
constexpr float pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}

constexpr std::array<float, 256> e4m3_table() {
  std::array<float, 256> t{};
  for (unsigned c = 0; c < 256; ++c) {
    const unsigned e = (c >> 3) & 15u, m = c & 7u;
    float v = e == 15 && m == 7 ? kNaN
              : e == 0          ? static_cast<float>(m) * pow2(-9)
                                : static_cast<float>(8 + m) * pow2(static_cast<int>(e) - 10);
    t[c] = (c & 0x80u) ? -v : v;
  }
  return t;
}

constexpr std::array<float, 256> e8m0_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) t[static_cast<std::size_t>(c)] = c == 255 ? kNaN : pow2(c - 127);
  return t;
}

constexpr std::array<float, 256> kE4M3Table = e4m3_table();
constexpr std::array<float, 256> kE8M0Table = e8m0_table();
constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                             -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

// Magnitude code of a (finite, >= 0, at most the format's largest value) in a minifloat with
// `mbits` mantissa bits and smallest normal exponent `emin` (bias 1 - emin), RNE. The scaled
// value a 2^(mbits - e) is exact, so nearbyint (ties to even in the default rounding mode) is
// the only rounding; a mantissa that rounds up to 2^(mbits + 1) carries into the exponent field,
// and subnormals (e = emin, integer part < 2^mbits) carry into the first normal likewise.
unsigned minifloat_code(float a, int mbits, int emin) {
  const int e = a < pow2(emin) ? emin : std::ilogb(a);
  const auto q = static_cast<unsigned>(std::nearbyint(std::ldexp(a, mbits - e)));
  return (static_cast<unsigned>(e - emin) << mbits) + q;
}

void require_finite(float x) {
  require(std::isfinite(x), ErrorCode::non_finite, "x", "x = ", x, " is not finite");
}

// E2M1 code of x / S (S > 0): RNE with saturation, by comparing |x| with S times the grid
// midpoints (exact products for the scales of both formats, key_formats.hpp), so no rounded
// quotient enters. Midpoint k lies between codes k and k + 1; a tie goes to the even code.
// S = 0 (an NVFP4 block scale that underflowed) encodes every value as a signed zero.
std::uint8_t e2m1_code(float x, float S) {
  static constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float a = std::fabs(x);
  unsigned c = 0;
  if (S > 0) {
    for (unsigned k = 0; k < 7; ++k) {
      const float t = S * kMid[k];
      if (a > t || (a == t && (k & 1u))) c = k + 1;
    }
  }
  return static_cast<std::uint8_t>(c | (std::signbit(x) ? 8u : 0u));
}

// Packs E2M1 codes of x[0..n) / S into n / 2 bytes, value 2i in the low nibble.
void encode_e2m1(const float* x, int n, float S, std::uint8_t* codes) {
  for (int i = 0; i < n; i += 2) {
    codes[i / 2] = static_cast<std::uint8_t>(e2m1_code(x[i], S) | (e2m1_code(x[i + 1], S) << 4));
  }
}

void decode_e2m1(const std::uint8_t* codes, int n, float S, float* out) {
  for (int i = 0; i < n; i += 2) {
    out[i] = S * kE2M1[codes[i / 2] & 0x0f];
    out[i + 1] = S * kE2M1[codes[i / 2] >> 4];
  }
}

float max_abs(const float* x, int n) {
  float m = 0;
  for (int i = 0; i < n; ++i) m = std::fmax(m, std::fabs(x[i]));
  return m;
}

}  // namespace

namespace fp {

std::uint8_t f32_to_e2m1(float x) {
  require_finite(x);
  return e2m1_code(x, 1.0f);
}

float e2m1_to_f32(std::uint8_t code) { return kE2M1[code & 0x0f]; }

std::uint8_t f32_to_e4m3(float x) {
  require_finite(x);
  const float a = std::fmin(std::fabs(x), 448.0f);  // satfinite
  return static_cast<std::uint8_t>(minifloat_code(a, 3, -6) | (std::signbit(x) ? 0x80u : 0u));
}

float e4m3_to_f32(std::uint8_t code) { return kE4M3Table[code]; }

std::uint8_t e8m0_of_exponent(int e) {
  return static_cast<std::uint8_t>(std::clamp(e, -127, 127) + 127);
}

std::uint8_t f32_to_e8m0(float x) {
  require_finite(x);
  require(x >= 0, ErrorCode::invalid_argument, "x", "x = ", x, " is negative: E8M0 has no sign");
  return x > 0 ? e8m0_of_exponent(std::ilogb(x)) : std::uint8_t{0};
}

float e8m0_to_f32(std::uint8_t code) { return kE8M0Table[code]; }

}  // namespace fp

namespace detail {

const float* const kE4M3Value = kE4M3Table.data();
const float* const kE8M0Value = kE8M0Table.data();
extern const signed char kE2M1Twice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

namespace {

// sum_i q_i 2 v_i over the n E2M1 values packed in n / 2 bytes (the table holds 2 v, exact
// small integers; the callers halve the block scale).
float dot_e2m1_twice(const float* q, const std::uint8_t* codes, int n) {
  float acc = 0;
  for (int i = 0; i < n; i += 2) {
    acc += q[i] * static_cast<float>(kE2M1Twice[codes[i / 2] & 0x0f]);
    acc += q[i + 1] * static_cast<float>(kE2M1Twice[codes[i / 2] >> 4]);
  }
  return acc;
}

}  // namespace

void quantize_mxfp4(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales) {
  for (int b0 = 0; b0 < d; b0 += 32) {
    const float a = max_abs(x + b0, 32);
    // X = floor(log2 max) - 2 (E2M1's largest power of two is 2^2), clamped to E8M0.
    const std::uint8_t s = fp::e8m0_of_exponent(a > 0 ? std::ilogb(a) - 2 : -127);
    scales[b0 / 32] = s;
    encode_e2m1(x + b0, 32, kE8M0Table[s], codes + b0 / 2);
  }
}

void dequantize_mxfp4(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out) {
  for (int b0 = 0; b0 < d; b0 += 32) {
    decode_e2m1(codes + b0 / 2, 32, kE8M0Table[scales[b0 / 32]], out + b0);
  }
}

void quantize_nvfp4(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales) {
  const float a = max_abs(x, d);
  require(a <= kNvfp4Max, ErrorCode::out_of_range, "k", "max |k| = ", a,
          " exceeds the nvfp4 selector key range (6 * 448 = 2688 at tensor scale 1)");
  for (int b0 = 0; b0 < d; b0 += 16) {
    // <= 448 since max_b <= 2688: the E4M3 scale never saturates.
    const std::uint8_t s = fp::f32_to_e4m3(max_abs(x + b0, 16) / 6.0f);
    scales[b0 / 16] = s;
    encode_e2m1(x + b0, 16, kE4M3Table[s], codes + b0 / 2);
  }
}

void dequantize_nvfp4(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out) {
  for (int b0 = 0; b0 < d; b0 += 16) {
    decode_e2m1(codes + b0 / 2, 16, kE4M3Table[scales[b0 / 16]], out + b0);
  }
}

void quantize_mxfp8(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales) {
  for (int b0 = 0; b0 < d; b0 += 32) {
    const float a = max_abs(x + b0, 32);
    // X = floor(log2 max) - 8 (E4M3's largest power of two is 2^8), clamped to E8M0.
    const std::uint8_t s = fp::e8m0_of_exponent(a > 0 ? std::ilogb(a) - 8 : -127);
    scales[b0 / 32] = s;
    const float S = kE8M0Table[s];
    // x / S is exact (S a power of two, the quotient a normal f32 for every block this rule
    // gives), so E4M3's RNE is the only rounding; beyond 448 it saturates.
    for (int i = 0; i < 32; ++i) codes[b0 + i] = fp::f32_to_e4m3(x[b0 + i] / S);
  }
}

void dequantize_mxfp8(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out) {
  for (int b0 = 0; b0 < d; b0 += 32) {
    const float S = kE8M0Table[scales[b0 / 32]];
    for (int i = 0; i < 32; ++i) out[b0 + i] = S * kE4M3Table[codes[b0 + i]];
  }
}

float dot_mxfp8_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                         int d) {
  float total = 0;
  for (int b0 = 0; b0 < d; b0 += 32) {
    float acc = 0;
    for (int i = 0; i < 32; ++i) acc += q[b0 + i] * kE4M3Table[codes[b0 + i]];
    total += acc * kE8M0Table[scales[b0 / 32]];
  }
  return total;
}

float dot_mxfp4_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                         int d) {
  float total = 0;
  for (int b0 = 0; b0 < d; b0 += 32) {
    total += dot_e2m1_twice(q + b0, codes + b0 / 2, 32) * (0.5f * kE8M0Table[scales[b0 / 32]]);
  }
  return total;
}

float dot_nvfp4_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                         int d) {
  float total = 0;
  for (int b0 = 0; b0 < d; b0 += 16) {
    total += dot_e2m1_twice(q + b0, codes + b0 / 2, 16) * kE4M3Table[scales[b0 / 16]];
  }
  return 0.5f * total;
}

}  // namespace detail

}  // namespace masskv::kv
