#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "masskv/dtype.hpp"
#include "masskv/error.hpp"

namespace masskv {
namespace {

TEST(DType, F16RoundTripsEveryFiniteHalf) {
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const f16 h{static_cast<std::uint16_t>(b)};
    const float f = f16_to_f32(h);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_f16(f).bits, h.bits) << b;
  }
}

TEST(DType, F16RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even gives 1.
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 0x1p-11f)), 1.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3 * 0x1p-11f)), 1.0f + 0x1p-9f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(70000.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(65504.0f)), 65504.0f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(0x1p-24f)), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(0x1p-26f)), 0.0f);
}

TEST(DType, F16MatchesDoubleRoundingOnRandomFloats) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = u(rng) * (i % 2 ? 1e-4f : 1.0f);
    const float y = f16_to_f32(f32_to_f16(x));
    if (std::isinf(y)) continue;
    // No other half is closer to x.
    const f16 h = f32_to_f16(x);
    const float up = f16_to_f32(f16{static_cast<std::uint16_t>(h.bits + 1)});
    const float dn = f16_to_f32(f16{static_cast<std::uint16_t>(h.bits - 1)});
    EXPECT_LE(std::fabs(y - x), std::fabs(up - x)) << x;
    EXPECT_LE(std::fabs(y - x), std::fabs(dn - x)) << x;
  }
}

TEST(DType, Bf16DirectedRoundingBracketsTheValue) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.0f, 10.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = n(rng);
    const float lo = bf16_to_f32(f32_to_bf16_down(x));
    const float hi = bf16_to_f32(f32_to_bf16_up(x));
    ASSERT_LE(lo, x);
    ASSERT_GE(hi, x);
    const float nearest = bf16_to_f32(f32_to_bf16(x));
    ASSERT_TRUE(nearest == lo || nearest == hi);
  }
  EXPECT_EQ(bf16_to_f32(f32_to_bf16_up(3.4e38f)), bf16_to_f32(f32_to_bf16_up(3.4e38f)));
  EXPECT_LE(bf16_to_f32(f32_to_bf16_down(3.4e38f)), 3.4e38f);
}

TEST(DType, ParseRejectsUnknownNamesNamingTheArgument) {
  EXPECT_EQ(parse_dtype("bf16"), DType::bf16);
  try {
    parse_dtype("fp8", "kv-dtype");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_EQ(e.argument(), "kv-dtype");
  }
}

}  // namespace
}  // namespace masskv
