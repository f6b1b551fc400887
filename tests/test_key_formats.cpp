// Selector key formats (docs/design.md §2.9, kv/key_formats.hpp): every format's round trip
// against its stated bound in f64, exact codes of the E2M1 / E4M3 / E8M0 conversions and of
// hand-written MXFP4 / NVFP4 blocks, dot products on the codes (SIMD and scalar) against f64
// sums of the decoded values, errors, bytes per token, the cache's key store in every format
// and top_p with MassSource::quant_keys on each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/cpu_features.hpp"
#include "expect_error.hpp"
#include "kv/key_kernels.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/key_formats.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/selector.hpp"
#include "selector_fixture.hpp"

namespace masskv {
namespace {

using kv::KeyFormat;
namespace fp = kv::fp;
using select::Budget;

constexpr KeyFormat kFormats[] = {KeyFormat::bf16, KeyFormat::int4, KeyFormat::mxfp4,
                                  KeyFormat::nvfp4, KeyFormat::mxfp8};
constexpr double kE2M1Grid[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

struct Row {
  std::vector<std::uint8_t> codes, scales;
};

Row encode(KeyFormat f, const std::vector<float>& x) {
  const int d = static_cast<int>(x.size());
  Row r{std::vector<std::uint8_t>(static_cast<std::size_t>(kv::code_bytes(f, d))),
        std::vector<std::uint8_t>(static_cast<std::size_t>(kv::scale_bytes(f, d)))};
  kv::quantize_row(f, x.data(), d, r.codes.data(), r.scales.data());
  return r;
}

std::vector<float> decode(KeyFormat f, const Row& r, int d) {
  std::vector<float> y(static_cast<std::size_t>(d));
  kv::dequantize_row(f, r.codes.data(), r.scales.data(), d, y.data());
  return y;
}

// Random rows of many kinds: Gaussian at `magnitude`, an all-zero block, an outlier channel,
// negative zeros and a value far below the rest.
std::vector<float> random_row(std::mt19937& rng, int d, float magnitude) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(d));
  for (int i = 0; i < d; ++i) x[i] = magnitude * N(rng);
  if (d >= 64) {
    std::fill_n(x.begin() + 32, 32, 0.0f);
    x[40] = -0.0f;
    x[5] = 40.0f * magnitude;
  }
  x[static_cast<std::size_t>(d) - 1] = -0.0f;
  if (d >= 16) x[3] = 1e-5f * magnitude;
  return x;
}

double max_abs(const std::vector<float>& x, int from, int n) {
  double m = 0;
  for (int i = from; i < from + n; ++i) m = std::max(m, std::fabs(static_cast<double>(x[i])));
  return m;
}

// Per value: the stated bound, and for the FP4 formats that x̂ is a nearest point of the
// scaled grid (RNE or saturation), both in f64. Also checks each format's scale rule.
void check_round_trip(KeyFormat f, const std::vector<float>& x, const Row& r,
                      const std::vector<float>& y, const std::string& where) {
  const int d = static_cast<int>(x.size());
  std::vector<double> S(static_cast<std::size_t>(d), 0.0);  // effective scale of each value
  if (f == KeyFormat::int4) {
    for (int b = 0; b < d / 32; ++b) {
      const std::uint16_t bits =
          static_cast<std::uint16_t>(r.scales[2 * b] | r.scales[2 * b + 1] << 8);
      EXPECT_EQ(bits, f32_to_f16(static_cast<float>(max_abs(x, 32 * b, 32)) / 7.0f).bits) << where;
      std::fill_n(S.begin() + 32 * b, 32, static_cast<double>(f16_to_f32(f16{bits})));
    }
  } else if (f == KeyFormat::mxfp4) {
    for (int b = 0; b < d / 32; ++b) {
      const double a = max_abs(x, 32 * b, 32);
      int e = 0;
      std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1): floor(log2 a) = e - 1
      const int X = a > 0 ? std::max(e - 1 - 2, -127) : -127;
      EXPECT_EQ(r.scales[static_cast<std::size_t>(b)], X + 127) << where;
      std::fill_n(S.begin() + 32 * b, 32, std::ldexp(1.0, X));
    }
  } else if (f == KeyFormat::mxfp8) {  // X = floor(log2 max) - 8
    for (int b = 0; b < d / 32; ++b) {
      const double a = max_abs(x, 32 * b, 32);
      int e = 0;
      std::frexp(a, &e);
      const int X = a > 0 ? std::max(e - 1 - 8, -127) : -127;
      EXPECT_EQ(r.scales[static_cast<std::size_t>(b)], X + 127) << where;
      std::fill_n(S.begin() + 32 * b, 32, std::ldexp(1.0, X));
    }
  } else if (f == KeyFormat::nvfp4) {  // tensor scale 1: S = the E4M3 block scale
    for (int b = 0; b < d / 16; ++b) {
      const std::uint8_t s = r.scales[static_cast<std::size_t>(b)];
      EXPECT_EQ(s, fp::f32_to_e4m3(static_cast<float>(max_abs(x, 16 * b, 16)) / 6.0f)) << where;
      std::fill_n(S.begin() + 16 * b, 16, static_cast<double>(fp::e4m3_to_f32(s)));
    }
  }
  for (int i = 0; i < d; ++i) {
    const double xi = x[i], err = std::fabs(xi - static_cast<double>(y[i]));
    const double a = std::fabs(xi), s = S[static_cast<std::size_t>(i)];
    switch (f) {
      case KeyFormat::bf16:
        EXPECT_LE(err, std::max(0x1p-8 * a, 0x1p-134)) << where << " i=" << i;
        break;
      case KeyFormat::int4:
        EXPECT_LE(err, s * (0.5 + 0x1p-20) + 7 * 0x1p-25) << where << " i=" << i;
        break;
      case KeyFormat::mxfp4:
      case KeyFormat::nvfp4: {
        EXPECT_LE(err, std::max(s, a - 6 * s)) << where << " i=" << i;
        const double sign = std::signbit(x[i]) ? -1.0 : 1.0;
        for (double v : kE2M1Grid) EXPECT_LE(err, std::fabs(xi - sign * s * v)) << where;
        if (f == KeyFormat::mxfp4) {
          EXPECT_LT(err, 2 * s) << where;
        } else {  // the consequences stated in key_formats.hpp
          EXPECT_LE(err, std::max(s, s >= 0x1p-6 ? 0.41 * s : 6 * 0x1p-10 * (1 + 0x1p-20)))
              << where;
        }
        EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << where << " i=" << i;
        break;
      }
      case KeyFormat::mxfp8: {  // key_formats.hpp's bound, and x̂ / S is an E4M3 value
        EXPECT_LE(err, a <= 448 * s ? std::max(0x1p-4 * a, 0x1p-10 * s) : a - 448 * s)
            << where << " i=" << i;
        const double v = static_cast<double>(y[i]) / s;
        EXPECT_EQ(static_cast<double>(fp::e4m3_to_f32(fp::f32_to_e4m3(static_cast<float>(v)))),
                  v)
            << where;
        EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << where << " i=" << i;
        break;
      }
    }
  }
}

TEST(KeyFormats, RoundTripIsWithinEachFormatsBound) {
  std::mt19937 rng(11);
  int rows = 0;
  for (KeyFormat f : kFormats) {
    for (int d : {16, 32, 48, 64, 96, 128, 256}) {
      if (d % kv::key_block(f) != 0) continue;
      for (float mag : {1e-6f, 1e-3f, 1.0f, 300.0f, 1e4f}) {
        // nvfp4's range is 2688 (tensor scale 1): the rows with the 40x outlier stay in it.
        if (f == KeyFormat::nvfp4 && mag > 60.0f) mag = mag > 1e3f ? 60.0f : 20.0f;
        for (int rep = 0; rep < 12; ++rep) {
          const std::vector<float> x = random_row(rng, d, mag);
          const Row r = encode(f, x);
          const std::vector<float> y = decode(f, r, d);
          check_round_trip(f, x, r, y,
                           std::string(kv::to_string(f)) + " d=" + std::to_string(d) +
                               " mag=" + std::to_string(mag));
          ++rows;
        }
      }
    }
  }
  EXPECT_EQ(rows, 5 * 12 * (7 + 5 + 5 + 7 + 5));
}

TEST(KeyFormats, ZeroAndNegativeZeroRowsDecodeToSignedZeros) {
  for (KeyFormat f : kFormats) {
    std::vector<float> x(64, 0.0f);
    for (int i = 0; i < 64; i += 3) x[i] = -0.0f;
    const std::vector<float> y = decode(f, encode(f, x), 64);
    for (int i = 0; i < 64; ++i) {
      EXPECT_EQ(y[i], 0.0f) << kv::to_string(f);
      if (f != KeyFormat::int4) {  // int4's zero has no sign
        EXPECT_EQ(std::signbit(y[i]), std::signbit(x[i])) << kv::to_string(f) << " " << i;
      }
    }
  }
}

TEST(KeyFormats, E2M1CodesOfTheMxGrid) {
  // OCP MX v1.0 §5.3.3: codes 0..7 are {0, 0.5, 1, 1.5, 2, 3, 4, 6}, bit 3 the sign.
  for (int c = 0; c < 8; ++c) {
    const auto v = static_cast<float>(kE2M1Grid[c]);
    EXPECT_EQ(fp::f32_to_e2m1(v), c);
    EXPECT_EQ(fp::f32_to_e2m1(-v), c | 8);
    EXPECT_EQ(fp::e2m1_to_f32(static_cast<std::uint8_t>(c)), v);
    EXPECT_EQ(fp::e2m1_to_f32(static_cast<std::uint8_t>(c | 8)), -v);
  }
  EXPECT_TRUE(std::signbit(fp::e2m1_to_f32(8)));
  // Midpoint between codes lo and lo + 1: the even code; just below it lo, just above lo + 1.
  const std::pair<float, int> ties[] = {{0.25f, 0}, {0.75f, 1}, {1.25f, 2}, {1.75f, 3},
                                        {2.5f, 4},  {3.5f, 5},  {5.0f, 6}};
  for (auto [x, lo] : ties) {
    const int even = lo % 2 == 0 ? lo : lo + 1;
    EXPECT_EQ(fp::f32_to_e2m1(x), even) << x;
    EXPECT_EQ(fp::f32_to_e2m1(-x), even | 8) << x;
    EXPECT_EQ(fp::f32_to_e2m1(std::nextafter(x, 0.0f)), lo) << x;
    EXPECT_EQ(fp::f32_to_e2m1(std::nextafter(x, 7.0f)), lo + 1) << x;
  }
  EXPECT_EQ(fp::f32_to_e2m1(6.5f), 7);  // saturation
  EXPECT_EQ(fp::f32_to_e2m1(-1e30f), 15);
  EXPECT_EQ(fp::f32_to_e2m1(-0.0f), 8);
  EXPECT_EQ(fp::f32_to_e2m1(0.2f), 0);
  EXPECT_EQ(fp::f32_to_e2m1(-0.3f), 9);
}

TEST(KeyFormats, E4M3CodesRoundToNearestEvenAndSaturate) {
  // OCP FP8 E4M3: bias 7, 448 = S.1111.110 the largest, S.1111.111 NaN, 2^-9 the smallest.
  const std::pair<float, int> exact[] = {{0.0f, 0x00},        {1.0f, 0x38},    {0.5f, 0x30},
                                         {448.0f, 0x7e},      {240.0f, 0x77},  {0x1p-9f, 0x01},
                                         {7 * 0x1p-9f, 0x07}, {0x1p-6f, 0x08}, {1.75f, 0x3e},
                                         {-2.0f, 0xc0},       {-448.0f, 0xfe}, {-0.0f, 0x80}};
  for (auto [x, c] : exact) {
    EXPECT_EQ(fp::f32_to_e4m3(x), c) << x;
    EXPECT_EQ(fp::e4m3_to_f32(static_cast<std::uint8_t>(c)), x) << c;
  }
  const std::pair<float, int> rounded[] = {
      {1.0625f, 0x38},        // tie between 1 (m 0) and 1.125 (m 1): even
      {1.1875f, 0x3a},        // tie between 1.125 and 1.25: even m 2
      {1.07f, 0x39},          // above the tie
      {0x1p-10f, 0x00},       // tie between 0 and 2^-9
      {3 * 0x1p-10f, 0x02},   // tie between 2^-9 and 2^-8
      {15 * 0x1p-10f, 0x08},  // tie between 7 * 2^-9 and the first normal: even, carries
      {15.5f, 0x58},          // tie between 15 and 16: the mantissa carries into the exponent
      {464.0f, 0x7e},         // saturates (satfinite), as does everything above 448
      {1e30f, 0x7e},         {-1e30f, 0xfe}, {1e-30f, 0x00}};
  for (auto [x, c] : rounded) EXPECT_EQ(fp::f32_to_e4m3(x), c) << x;
  EXPECT_TRUE(std::isnan(fp::e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp::e4m3_to_f32(0xff)));
  for (int c = 0; c < 256; ++c) {  // every finite code round-trips
    if ((c & 0x7f) == 0x7f) continue;
    EXPECT_EQ(fp::f32_to_e4m3(fp::e4m3_to_f32(static_cast<std::uint8_t>(c))), c) << c;
  }
  // RNE against an f64 search of the nearest finite code on random inputs.
  std::mt19937 rng(12);
  std::uniform_real_distribution<double> logu(-12, 9.5);
  for (int rep = 0; rep < 2000; ++rep) {
    const auto x = static_cast<float>(std::exp2(logu(rng)));
    const double got = fp::e4m3_to_f32(fp::f32_to_e4m3(x));
    double best = 1e300;
    for (int c = 0; c < 0x7f; ++c) {
      best = std::min(
          best, std::fabs(x - static_cast<double>(fp::e4m3_to_f32(static_cast<std::uint8_t>(c)))));
    }
    EXPECT_EQ(std::fabs(x - got), x > 448 ? x - 448.0 : best) << x;
  }
}

TEST(KeyFormats, E8M0IsAPowerOfTwoRoundedTowardZero) {
  const std::pair<float, int> cases[] = {
      {1.0f, 127}, {1.5f, 127},    {1.999f, 127},  {2.0f, 128},     {0.75f, 126},   {0.0f, 0},
      {1e-40f, 0}, {0x1p-127f, 0}, {0x1p-126f, 1}, {0x1p127f, 254}, {FLT_MAX, 254}, {6.0f, 129}};
  for (auto [x, c] : cases) EXPECT_EQ(fp::f32_to_e8m0(x), c) << x;
  EXPECT_EQ(fp::e8m0_to_f32(0), 0x1p-127f);
  EXPECT_EQ(fp::e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(fp::e8m0_to_f32(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(fp::e8m0_to_f32(255)));
  EXPECT_EQ(fp::e8m0_of_exponent(-300), 0);
  EXPECT_EQ(fp::e8m0_of_exponent(300), 254);
  EXPECT_EQ(fp::e8m0_of_exponent(-2), 125);
}

TEST(KeyFormats, ConversionsRejectNonFiniteInput) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {inf, -inf, nan}) {
    test::expect_error([&] { fp::f32_to_e2m1(x); }, ErrorCode::non_finite, "x");
    test::expect_error([&] { fp::f32_to_e4m3(x); }, ErrorCode::non_finite, "x");
    test::expect_error([&] { fp::f32_to_e8m0(x); }, ErrorCode::non_finite, "x");
  }
  test::expect_error([&] { fp::f32_to_e8m0(-1.0f); }, ErrorCode::invalid_argument, "x");
}

TEST(KeyFormats, MxBlocksTakeTheSpecScaleAndSaturate) {
  // max 6: X = floor(log2 6) - 2 = 0, S = 1, the values are E2M1 values themselves.
  std::vector<float> x(32, 0.0f);
  const float v[8] = {6, -4, 3, 0.5f, -1.5f, 2, 0.75f, 0.25f};
  for (int i = 0; i < 8; ++i) x[i] = v[i];
  Row r = encode(KeyFormat::mxfp4, x);
  EXPECT_EQ(r.scales[0], 127);
  // Byte i holds value 2i in its low nibble: (6 -> 7, -4 -> 14), (3 -> 5, 0.5 -> 1),
  // (-1.5 -> 11, 2 -> 4), (0.75 -> 2 by the tie rule, 0.25 -> 0).
  EXPECT_EQ(r.codes[0], 0xe7);
  EXPECT_EQ(r.codes[1], 0x15);
  EXPECT_EQ(r.codes[2], 0x4b);
  EXPECT_EQ(r.codes[3], 0x02);
  for (int i = 4; i < 16; ++i) EXPECT_EQ(r.codes[static_cast<std::size_t>(i)], 0);
  // max 7.5: X is still 0 (the spec's floor rule), so 7.5 saturates to 6.
  x[0] = 7.5f;
  r = encode(KeyFormat::mxfp4, x);
  EXPECT_EQ(r.scales[0], 127);
  EXPECT_EQ(r.codes[0] & 0x0f, 7);
  // max 8: X = 1, S = 2; 8 -> 4 (code 6), -4 -> -2 (code 12), 3 -> 1.5 (code 3).
  x[0] = 8.0f;
  r = encode(KeyFormat::mxfp4, x);
  EXPECT_EQ(r.scales[0], 128);
  EXPECT_EQ(r.codes[0], 0xc6);
  EXPECT_EQ(r.codes[1] & 0x0f, 3);
}

TEST(KeyFormats, Mxfp8BlocksTakeThePowerOfTwoScaleAndE4M3Values) {
  // Block max 3: floor(log2 3) = 1, X = -7, S = 2^-7; 3 / S = 384 is E4M3 0x7c (1.5 * 2^8).
  std::vector<float> x(32, 0.0f);
  x[0] = 3.0f;
  x[1] = -1.0f;                 // 128 = 2^7: 0x70 | 0x80
  x[2] = 0x1p-7f * 1.0625f;     // 1.0625: a tie between 1 and 1.125 -> 1 (0x38)
  x[3] = 0x1p-7f * 0x1p-10f;    // 2^-10: half the smallest subnormal 2^-9 -> 0 (ties even)
  x[4] = -0.0f;
  Row r = encode(KeyFormat::mxfp8, x);
  ASSERT_EQ(r.codes.size(), 32u);
  ASSERT_EQ(r.scales.size(), 1u);
  EXPECT_EQ(r.scales[0], 127 - 7);
  EXPECT_EQ(r.codes[0], 0x7c);
  EXPECT_EQ(r.codes[1], 0xf0);
  EXPECT_EQ(r.codes[2], 0x38);
  EXPECT_EQ(r.codes[3], 0x00);
  EXPECT_EQ(r.codes[4], 0x80);
  // Values in (448 S, 512 S) saturate: max 3.9 gives S = 2^-7 and 3.9 / S = 499.2 -> 448.
  x[0] = 3.9f;
  r = encode(KeyFormat::mxfp8, x);
  EXPECT_EQ(r.codes[0], 0x7e);
  EXPECT_EQ(decode(KeyFormat::mxfp8, r, 32)[0], 3.5f);
}

TEST(KeyFormats, Mxfp8DotReadsEveryE4M3CodeExactly) {
  // The AVX2 kernel converts codes through f16 bits (key_kernels_avx2.cpp): every non-NaN code,
  // subnormals included, must give its table value at any scale.
  if (!cpu::has_avx2()) GTEST_SKIP() << "no AVX2";
  std::vector<float> q(32, 0.0f);
  q[5] = 1.0f;
  std::vector<std::uint8_t> codes(32, 0), scales{127 - 20};  // S = 2^-20
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    codes[5] = static_cast<std::uint8_t>(c);
    const float want = fp::e4m3_to_f32(static_cast<std::uint8_t>(c)) * 0x1p-20f;
    EXPECT_EQ(kv::detail::dot_mxfp8_avx2(q.data(), codes.data(), scales.data(), 32), want) << c;
    EXPECT_EQ(kv::detail::dot_mxfp8_portable(q.data(), codes.data(), scales.data(), 32), want)
        << c;
  }
}

TEST(KeyFormats, NvBlocksTakeE4M3BlockScalesAtTensorScaleOne) {
  // Block 0's max 2688 = 6 * 448 gives the scale 448 (0x7e), block 1's max 6 gives 1 (0x38).
  std::vector<float> x(32, 0.0f);
  x[0] = 2688.0f;
  x[1] = -896.0f;  // 2 * 448: code 4 | 8
  x[16] = 6.0f;
  x[17] = 1.25f;  // a tie: 1
  x[18] = -0.0f;
  Row r = encode(KeyFormat::nvfp4, x);
  ASSERT_EQ(r.scales.size(), 2u);  // one E4M3 byte per 16 values, nothing per row
  EXPECT_EQ(r.scales[0], 0x7e);
  EXPECT_EQ(r.scales[1], 0x38);
  EXPECT_EQ(r.codes[0], 0xc7);
  EXPECT_EQ(r.codes[8], 0x27);
  EXPECT_EQ(r.codes[9] & 0x0f, 8);  // -0 keeps its sign
  // Block max 1: 1 / 6 = 0.1667 rounds to the E4M3 0.171875 (0x23: 1.375 * 2^-3, spacing
  // 2^-6 in [0.125, 0.25)); 1 / S = 5.82 rounds to 6: x̂ = 1.03125.
  std::vector<float> one(16, 0.0f);
  one[0] = 1.0f;
  r = encode(KeyFormat::nvfp4, one);
  EXPECT_EQ(r.scales[0], 0x23);
  EXPECT_EQ(r.codes[0], 0x07);
  EXPECT_EQ(decode(KeyFormat::nvfp4, r, 16)[0], 1.03125f);
  // A block max of 0.03 (below 6 * 2^-6): 0.03 / 6 = 2.56 * 2^-9 rounds to the subnormal
  // scale 3 * 2^-9 (0x03); 0.03 / S = 5.12 rounds to 6, an absolute error <= 6 * 2^-10.
  std::vector<float> small(16, 0.0f);
  small[0] = 0.03f;
  r = encode(KeyFormat::nvfp4, small);
  EXPECT_EQ(r.scales[0], 0x03);
  EXPECT_LE(std::fabs(decode(KeyFormat::nvfp4, r, 16)[0] - 0.03f), 6 * 0x1p-10);
  // Beyond 2688: no encoding.
  x[0] = std::nextafter(2688.0f, 3000.0f);
  EXPECT_FALSE(kv::key_encodable(KeyFormat::nvfp4, x[0]));
  EXPECT_TRUE(kv::key_encodable(KeyFormat::nvfp4, 2688.0f));
  test::expect_error([&] { (void)encode(KeyFormat::nvfp4, x); }, ErrorCode::out_of_range, "k");
}

// f64 sum of q times the decoded values, and of the magnitudes (for the tolerance).
std::pair<double, double> f64_dot(const std::vector<float>& q, const std::vector<float>& y) {
  long double s = 0, a = 0;
  for (std::size_t i = 0; i < q.size(); ++i) {
    s += static_cast<long double>(q[i]) * y[i];
    a += std::fabs(static_cast<long double>(q[i]) * y[i]);
  }
  return {static_cast<double>(s), static_cast<double>(a)};
}

TEST(KeyFormats, DotOnTheCodesMatchesF64OfTheDecodedKeys) {
  using Fn = float (*)(const float*, const std::uint8_t*, const std::uint8_t*, int);
  struct Kernels {
    KeyFormat f;
    Fn portable, avx2;
  };
  const Kernels all[] = {
      {KeyFormat::bf16, kv::detail::dot_bf16_portable, kv::detail::dot_bf16_avx2},
      {KeyFormat::int4, kv::detail::dot_int4_portable, kv::detail::dot_int4_avx2},
      {KeyFormat::mxfp4, kv::detail::dot_mxfp4_portable, kv::detail::dot_mxfp4_avx2},
      {KeyFormat::nvfp4, kv::detail::dot_nvfp4_portable, kv::detail::dot_nvfp4_avx2},
      {KeyFormat::mxfp8, kv::detail::dot_mxfp8_portable, kv::detail::dot_mxfp8_avx2}};
  std::mt19937 rng(13);
  std::normal_distribution<float> N(0.0f, 1.0f);
  int checked = 0;
  for (const Kernels& k : all) {
    for (int d : {16, 32, 48, 64, 96, 128, 256}) {
      if (d % kv::key_block(k.f) != 0) continue;
      for (int rep = 0; rep < 40; ++rep) {
        const std::vector<float> x = random_row(rng, d, rep % 3 == 0 ? 1e-3f : 5.0f);
        std::vector<float> q(static_cast<std::size_t>(d));
        for (float& v : q) v = 3.0f * N(rng);
        const Row r = encode(k.f, x);
        const auto [ref, abs] = f64_dot(q, decode(k.f, r, d));
        // f32 block sums of <= 32 products, times the block scale, summed over the blocks:
        // well within (d + 4) roundings of the magnitudes.
        const double tol = (d + 4) * 0x1p-24 * abs;
        const std::string where = std::string(kv::to_string(k.f)) + " d=" + std::to_string(d);
        EXPECT_NEAR(k.portable(q.data(), r.codes.data(), r.scales.data(), d), ref, tol) << where;
        if (cpu::has_avx2()) {
          EXPECT_NEAR(k.avx2(q.data(), r.codes.data(), r.scales.data(), d), ref, tol) << where;
        }
        EXPECT_NEAR(kv::dot_row(k.f, q.data(), r.codes.data(), r.scales.data(), d), ref, tol)
            << where;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 40 * (7 + 5 + 5 + 7 + 5));
}

TEST(KeyFormats, RowsRejectBadDimsNonFiniteAndOutOfRangeKeys) {
  std::vector<std::uint8_t> codes(1024), scales(64);
  std::vector<float> x(64, 1.0f), q(64, 1.0f);
  for (KeyFormat f : kFormats) {
    for (float bad :
         {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      x[7] = bad;
      test::expect_error([&] { kv::quantize_row(f, x.data(), 64, codes.data(), scales.data()); },
                         ErrorCode::non_finite, "k");
    }
    x[7] = 1.0f;
    for (int d : {0, -32, 24}) {
      if (d > 0 && d % kv::key_block(f) == 0) continue;
      test::expect_error([&] { kv::quantize_row(f, x.data(), d, codes.data(), scales.data()); },
                         ErrorCode::invalid_argument, "d");
      test::expect_error([&] { kv::dot_row(f, q.data(), codes.data(), scales.data(), d); },
                         ErrorCode::invalid_argument, "d");
    }
  }
  x[9] = FLT_MAX;  // beyond int4's 7 * 65504, bf16's largest, and nvfp4's 2688; mxfp4 has it
  for (KeyFormat f : {KeyFormat::bf16, KeyFormat::int4, KeyFormat::nvfp4}) {
    EXPECT_FALSE(kv::key_encodable(f, FLT_MAX));
    test::expect_error([&] { kv::quantize_row(f, x.data(), 64, codes.data(), scales.data()); },
                       ErrorCode::out_of_range, "k");
  }
  EXPECT_TRUE(kv::key_encodable(KeyFormat::mxfp4, FLT_MAX));
  const Row r = encode(KeyFormat::mxfp4, x);
  EXPECT_EQ(r.scales[0], 125 + 127);  // X = 127 - 2
  EXPECT_TRUE(kv::key_encodable(KeyFormat::mxfp8, FLT_MAX));
  EXPECT_EQ(encode(KeyFormat::mxfp8, x).scales[0], 119 + 127);  // X = 127 - 8
  EXPECT_EQ(kv::parse_key_format("mxfp8", "--formats"), KeyFormat::mxfp8);
  EXPECT_EQ(kv::parse_key_format("nvfp4", "--formats"), KeyFormat::nvfp4);
  test::expect_error([] { kv::parse_key_format("fp4", "--formats"); }, ErrorCode::invalid_argument,
                     "--formats");
}

TEST(KeyFormats, BytesPerToken) {
  // Per kv head and token: codes + scales.
  const int want64[] = {128, 32 + 4, 32 + 2, 32 + 4, 64 + 2};
  const int want128[] = {256, 64 + 8, 64 + 4, 64 + 8, 128 + 4};
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(kv::row_bytes(kFormats[i], 64), want64[i]);
    EXPECT_EQ(kv::row_bytes(kFormats[i], 128), want128[i]);
  }
  EXPECT_DOUBLE_EQ(8 * kv::bytes_per_value(KeyFormat::int4, 128), 4.5);
  EXPECT_DOUBLE_EQ(8 * kv::bytes_per_value(KeyFormat::mxfp4, 128), 4.25);
  EXPECT_DOUBLE_EQ(8 * kv::bytes_per_value(KeyFormat::nvfp4, 128), 4.5);
  EXPECT_DOUBLE_EQ(8 * kv::bytes_per_value(KeyFormat::nvfp4, 64), 4.5);
  EXPECT_DOUBLE_EQ(8 * kv::bytes_per_value(KeyFormat::nvfp4, 32), 4.5);  // 18 B: 3.56x bf16
  EXPECT_DOUBLE_EQ(8 * kv::bytes_per_value(KeyFormat::mxfp8, 32), 8.25);  // 33 B: 1.94x
  for (KeyFormat f : kFormats) {
    kv::CacheConfig cfg;
    cfg.num_kv_heads = 3;
    cfg.head_dim = 64;
    cfg.capacity_pages = 1;
    cfg.selector_keys = true;
    cfg.selector_key_format = f;
    EXPECT_DOUBLE_EQ(kv::PagedKVCache(cfg).selector_key_bytes_per_token(),
                     3.0 * kv::row_bytes(f, 64));
  }
}

kv::CacheConfig keys_config(KeyFormat f, DType dt, int d) {
  kv::CacheConfig cfg;
  cfg.num_kv_heads = 2;
  cfg.head_dim = d;
  cfg.page_size = 4;
  cfg.dtype = dt;
  cfg.capacity_pages = 16;
  cfg.selector_keys = true;
  cfg.selector_key_format = f;
  return cfg;
}

// Every selector key row is the format's encoding of the stored (converted) key.
void expect_rows_match(const kv::PagedKVCache& c, kv::SeqId s) {
  const kv::PageTableStorage t = c.page_table(std::span<const kv::SeqId>(&s, 1));
  const kv::PagedKVView v = c.view(t);
  const kv::SelectorKeysView K = c.selector_keys();
  const int d = v.head_dim;
  for (std::int64_t tok = 0; tok < c.length(s); ++tok) {
    const std::int32_t page = t.indices[static_cast<std::size_t>(tok / v.page_size)];
    const int slot = static_cast<int>(tok % v.page_size);
    for (int h = 0; h < v.num_kv_heads; ++h) {
      std::vector<float> key(static_cast<std::size_t>(d));
      const f16* k = v.key<f16>(page, h, slot);
      for (int i = 0; i < d; ++i) key[i] = f16_to_f32(k[i]);
      const Row r = encode(K.format, key);
      EXPECT_TRUE(std::equal(r.codes.begin(), r.codes.end(), K.row(page, h, slot)));
      if (!r.scales.empty()) {
        EXPECT_TRUE(std::equal(r.scales.begin(), r.scales.end(), K.row_scales(page, h, slot)));
      }
    }
  }
}

TEST(SelectorKeyStore, QuantisesStoredKeysOnAppendAndCopiesThemOnFork) {
  std::mt19937 rng(14);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (KeyFormat f : kFormats) {
    kv::PagedKVCache c(keys_config(f, DType::f16, 64));
    EXPECT_EQ(c.selector_keys().format, f);
    auto tokens = [&](int n) {
      std::vector<float> x(static_cast<std::size_t>(n) * 2 * 64);
      for (float& v : x) v = 2.0f * N(rng);
      return x;
    };
    const kv::SeqId a = c.create();
    auto k = tokens(6), v = tokens(6);
    c.append(a, k, v, 6);  // 1.5 pages: the last one partial
    const kv::SeqId b = c.fork(a);
    k = tokens(3);
    v = tokens(3);
    c.append(b, k, v, 3);  // copy-on-write of the shared partial page
    k = tokens(1);
    v = tokens(1);
    c.append(a, k, v, 1);
    expect_rows_match(c, a);
    expect_rows_match(c, b);
  }
}

TEST(SelectorKeyStore, ConfigChecksTheFormatAgainstTheHeadDim) {
  test::expect_error([] { kv::PagedKVCache c(keys_config(KeyFormat::mxfp4, DType::f16, 48)); },
                     ErrorCode::invalid_argument, "selector_key_format");
  EXPECT_NO_THROW(kv::PagedKVCache(keys_config(KeyFormat::nvfp4, DType::f16, 48)));
  kv::CacheConfig legacy = keys_config(KeyFormat::nvfp4, DType::f16, 64);
  legacy.selector_keys = false;
  legacy.int4_selector_keys = true;  // the earlier switch is int4 only
  test::expect_error([&] { kv::PagedKVCache c(legacy); }, ErrorCode::invalid_argument,
                     "int4_selector_keys");
  legacy.selector_key_format = KeyFormat::int4;
  EXPECT_EQ(kv::PagedKVCache(legacy).selector_keys().format, KeyFormat::int4);
  // A key beyond nvfp4's range is refused before anything is appended.
  kv::PagedKVCache c(keys_config(KeyFormat::nvfp4, DType::f32, 16));
  const kv::SeqId s = c.create();
  std::vector<float> k(32, 1.0f), v(32, 1.0f);
  k[20] = 3000.0f;  // beyond 6 * 448
  test::expect_error([&] { c.append(s, k, v, 1); }, ErrorCode::out_of_range, "k");
  EXPECT_EQ(c.length(s), 0);
}

// Random case whose cache keeps selector keys in format f (the fixture's keys and values).
test::SelCase keys_case(std::mt19937& rng, KeyFormat f, const std::vector<int>& lengths, int Hq,
                        int Hkv, int d, int P) {
  test::SelCase c = test::random_case(rng, lengths, Hq, Hkv, d, P, DType::bf16, 1.5f);
  kv::CacheConfig cfg = c.cache.config();
  cfg.selector_keys = true;
  cfg.selector_key_format = f;
  kv::PagedKVCache cache(cfg);
  std::vector<kv::SeqId> seqs;
  for (kv::SeqId s : c.seqs) {
    const kv::PageTableStorage t = c.cache.page_table(std::span<const kv::SeqId>(&s, 1));
    const kv::PagedKVView v = c.cache.view(t);
    const std::int64_t L = c.cache.length(s);
    std::vector<float> k(static_cast<std::size_t>(L) * Hkv * d), val(k.size());
    for (std::int64_t tok = 0; tok < L; ++tok) {
      for (int h = 0; h < Hkv; ++h) {
        const std::int32_t page = t.indices[static_cast<std::size_t>(tok / P)];
        const bf16* kr = v.key<bf16>(page, h, static_cast<int>(tok % P));
        const bf16* vr = v.value<bf16>(page, h, static_cast<int>(tok % P));
        for (int x = 0; x < d; ++x) {
          k[(static_cast<std::size_t>(tok) * Hkv + h) * d + x] = bf16_to_f32(kr[x]);
          val[(static_cast<std::size_t>(tok) * Hkv + h) * d + x] = bf16_to_f32(vr[x]);
        }
      }
    }
    seqs.push_back(cache.create());
    cache.append(seqs.back(), k, val, static_cast<int>(L));
  }
  c.cache = std::move(cache);
  c.seqs = seqs;
  c.table = c.cache.page_table(c.seqs);
  return c;
}

// f64 page masses of the mapping on scores of the decoded selector keys: the reference of
// MassSource::quant_keys.
std::vector<double> reference_page_mass(const test::SelCase& c, int b, int qh, const Mapping& map) {
  const auto t = c.table.table();
  const kv::SelectorKeysView K = c.cache.selector_keys();
  const int g = c.Hq / c.Hkv, h = qh / g, n = t.num_pages(b);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> s;
  std::vector<int> page_of;
  for (int j = 0; j < n; ++j) {
    for (int slot = 0; slot < t.page_len(b, j, c.P); ++slot) {
      std::vector<float> y(static_cast<std::size_t>(c.d));
      kv::dequantize_row(K.format, K.row(t.page(b, j), h, slot),
                         K.row_scales(t.page(b, j), h, slot), c.d, y.data());
      double dot = 0;
      for (int x = 0; x < c.d; ++x) dot += static_cast<double>(c.qview().row(b, qh)[x]) * y[x];
      s.push_back(scale * dot);
      page_of.push_back(j);
    }
  }
  std::vector<double> p(s.size()), mass(static_cast<std::size_t>(n), 0.0);
  if (map.is_entmax()) {
    entmax(std::span<const double>(s), map.alpha, std::span<double>(p));
  } else {
    softmax(std::span<const double>(s), std::span<double>(p));
  }
  for (std::size_t i = 0; i < p.size(); ++i) mass[page_of[i]] += p[i];
  return mass;
}

TEST(TopPQuantKeys, ValidSelectionsWithinBudgetsAndTheMassOfTheDecodedKeys) {
  test::OneThread one;
  std::mt19937 rng(4);
  int checked = 0;
  for (KeyFormat f : kFormats) {
    for (int P : {4, 16}) {
      for (int g : {1, 4}) {
        for (int d : {32, 64}) {
          test::SelCase c = keys_case(rng, f, {1, 37, 300}, 2 * g, 2, d, P);
          for (auto kind : {Budget::Kind::fixed, Budget::Kind::top_p, Budget::Kind::adaptive}) {
            for (Mapping map : {Mapping::softmax(), Mapping::entmax(1.5)}) {
              select::SelectorConfig cfg;
              cfg.method = select::Method::top_p;
              cfg.mass_source = select::MassSource::quant_keys;
              cfg.mapping = map;
              cfg.budget = {kind, kind == Budget::Kind::top_p ? 0 : 64, 0.8};
              cfg.sink_pages = 1;
              cfg.window_tokens = 8;
              select::SelectArgs a = c.args();
              a.selector_keys = c.cache.selector_keys();
              select::SelectOutput out;
              select::run_selector(a, cfg, out);
              const SelectionView sel = out.selection.view();
              ASSERT_NO_THROW(select::check_selection(sel, c.table.table(), P, 2));
              for (int b = 0; b < c.B; ++b) {
                const int n = c.table.table().num_pages(b);
                for (int h = 0; h < 2; ++h) {
                  const auto ids = sel.list(b, h);
                  const std::set<int> have(ids.begin(), ids.end());
                  EXPECT_TRUE(have.count(0) && have.count(n - 1));  // sink and last page
                  // The kept pages (sink, 8-token window, last page) fit in 64 tokens here.
                  const int cap = std::min(n, (64 + P - 1) / P);
                  if (kind != Budget::Kind::top_p) {
                    EXPECT_LE(static_cast<int>(ids.size()), cap);
                  }
                  if (kind == Budget::Kind::fixed) {
                    EXPECT_EQ(static_cast<int>(ids.size()), cap);
                  }
                  for (int i = 0; i < g; ++i) {
                    const int qh = h * g + i;
                    const std::vector<double> ref = reference_page_mass(c, b, qh, map);
                    double held = 0;
                    for (int j : ids) held += ref[static_cast<std::size_t>(j)];
                    // The estimate is the selected mass of the same model in f32 scores.
                    EXPECT_NEAR(out.estimate[static_cast<std::size_t>(b) * c.Hq + qh], held, 1e-3)
                        << kv::to_string(f);
                    if (kind == Budget::Kind::top_p) {
                      EXPECT_GE(held, 0.8 - 1e-3);
                    }
                  }
                }
              }
              ++checked;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 5 * 48);
}

TEST(TopPQuantKeys, SelectorKeyScoresAreTheDotsOfTheStoredRows) {
  std::mt19937 rng(15);
  for (KeyFormat f : kFormats) {
    test::SelCase c = keys_case(rng, f, {45}, 2, 1, 64, 16);
    const kv::SelectorKeysView K = c.cache.selector_keys();
    std::vector<double> s;
    const float* q = c.qview().row(0, 1);
    select::selector_key_scores(K, c.table.table(), 0, 0, q, 0.125f, s);
    ASSERT_EQ(s.size(), 45u);
    const auto t = c.table.table();
    for (int tok = 0; tok < 45; ++tok) {
      const std::int32_t page = t.page(0, tok / 16);
      EXPECT_EQ(
          s[static_cast<std::size_t>(tok)],
          0.125 * kv::dot_row(f, q, K.row(page, 0, tok % 16), K.row_scales(page, 0, tok % 16), 64));
    }
    if (f == KeyFormat::bf16) {  // bf16 selector keys of a bf16 cache are the keys themselves
      std::vector<double> exact;
      std::vector<std::int32_t> ids(45);
      for (int i = 0; i < 45; ++i) ids[static_cast<std::size_t>(i)] = i;
      select::exact_scores(c.cache.view(c.table), 0, 0, q, 0.125f, SelectionView::Unit::token, ids,
                           exact);
      for (int i = 0; i < 45; ++i) EXPECT_NEAR(s[i], exact[i], 1e-5 * (1 + std::fabs(exact[i])));
    }
    test::expect_error([&] { select::selector_key_scores(K, t, 0, 1, q, 1.0f, s); },
                       ErrorCode::out_of_range, "kv_head");
    test::expect_error(
        [&] { select::selector_key_scores(kv::SelectorKeysView{}, t, 0, 0, q, 1.0f, s); },
        ErrorCode::invalid_argument, "keys");
  }
}

TEST(TopPQuantKeys, NeedsTheSelectorKeys) {
  std::mt19937 rng(5);
  test::SelCase c = test::random_case(rng, {40}, 2, 1, 32, 4, DType::f32);
  select::SelectorConfig cfg;
  cfg.method = select::Method::top_p;
  cfg.mass_source = select::MassSource::quant_keys;
  cfg.budget = {Budget::Kind::adaptive, 16, 0.9};
  select::SelectOutput out;
  test::expect_error([&] { select::run_selector(c.args(), cfg, out); }, ErrorCode::invalid_argument,
                     "selector_keys");
}

}  // namespace
}  // namespace masskv
