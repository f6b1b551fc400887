// INT4 selector keys through their typed interface (kv/int4_keys.hpp; the format is
// KeyFormat::int4 of kv/key_formats.hpp): the error bound, scores on the nibbles against f64
// sums of the decoded values, and the cache's earlier int4_selector_keys switch. The other
// formats, the key store and top_p with MassSource::quant_keys: test_key_formats.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/cpu_features.hpp"
#include "kv/key_kernels.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/int4_keys.hpp"

namespace masskv {
namespace {

using kv::int4::kBlock;

std::vector<float> random_row(std::mt19937& rng, int d, float magnitude) {
  std::normal_distribution<float> N(0.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(d));
  for (int i = 0; i < d; ++i) x[i] = magnitude * N(rng);
  if (d >= 64) {
    std::fill_n(x.begin() + kBlock, kBlock, 0.0f);  // an all-zero block: scale 0
    x[5] = 40.0f * magnitude;                       // an outlier channel
  }
  return x;
}

TEST(Int4Keys, RoundTripIsWithinTheFormatBound) {
  std::mt19937 rng(1);
  int rows = 0;
  for (int d : {32, 64, 96, 128, 256}) {
    for (float mag : {1e-9f, 1e-3f, 1.0f, 300.0f, 9000.0f}) {
      for (int rep = 0; rep < 20; ++rep) {
        const std::vector<float> x = random_row(rng, d, mag);
        std::vector<std::uint8_t> packed(static_cast<std::size_t>(kv::int4::row_bytes(d)));
        std::vector<f16> scales(static_cast<std::size_t>(kv::int4::row_scales(d)));
        kv::int4::quantize_row(x.data(), d, packed.data(), scales.data());
        std::vector<float> y(static_cast<std::size_t>(d));
        kv::int4::dequantize_row(packed.data(), scales.data(), d, y.data());
        for (int b = 0; b < d / kBlock; ++b) {
          float mx = 0;
          for (int i = 0; i < kBlock; ++i) mx = std::max(mx, std::fabs(x[b * kBlock + i]));
          EXPECT_EQ(scales[b].bits, f32_to_f16(mx / 7.0f).bits);  // s = f16(max / 7)
          const double s = f16_to_f32(scales[b]);
          const double bound = s * (0.5 + 0x1p-20) + 7 * 0x1p-25;
          for (int i = 0; i < kBlock; ++i) {
            const int at = b * kBlock + i;
            EXPECT_LE(std::fabs(static_cast<double>(x[at]) - y[at]), bound) << d << " " << mag;
          }
        }
        for (std::uint8_t byte : packed) {  // symmetric: the nibble 0 (q = -8) never occurs
          EXPECT_NE(byte & 0x0f, 0);
          EXPECT_NE(byte >> 4, 0);
        }
        ++rows;
      }
    }
  }
  EXPECT_EQ(rows, 500);
}

TEST(Int4Keys, ScoresOnTheNibblesMatchF64OfTheDecodedKeys) {
  std::mt19937 rng(2);
  std::normal_distribution<float> N(0.0f, 1.0f);
  for (int d : {32, 64, 128, 256}) {
    for (int rep = 0; rep < 50; ++rep) {
      const std::vector<float> x = random_row(rng, d, rep % 2 ? 0.01f : 5.0f);
      std::vector<float> q(static_cast<std::size_t>(d));
      for (float& v : q) v = 3.0f * N(rng);
      std::vector<std::uint8_t> packed(static_cast<std::size_t>(d / 2));
      std::vector<f16> scales(static_cast<std::size_t>(d / kBlock));
      kv::int4::quantize_row(x.data(), d, packed.data(), scales.data());
      std::vector<float> y(static_cast<std::size_t>(d));
      kv::int4::dequantize_row(packed.data(), scales.data(), d, y.data());
      long double ref = 0, abs = 0;
      for (int i = 0; i < d; ++i) {
        ref += static_cast<long double>(q[i]) * y[i];
        abs += std::fabs(static_cast<long double>(q[i]) * y[i]);
      }
      // f32 sums of d terms (exact products of small integers and f32 q, then the scale).
      const double tol = (d + 4) * 0x1p-24 * static_cast<double>(abs);
      const auto* s8 = reinterpret_cast<const std::uint8_t*>(scales.data());
      EXPECT_NEAR(kv::detail::dot_int4_portable(q.data(), packed.data(), s8, d),
                  static_cast<double>(ref), tol);
      if (cpu::has_avx2()) {
        EXPECT_NEAR(kv::detail::dot_int4_avx2(q.data(), packed.data(), s8, d),
                    static_cast<double>(ref), tol);
      }
      EXPECT_NEAR(kv::int4::dot_row(q.data(), packed.data(), scales.data(), d),
                  static_cast<double>(ref), tol);
    }
  }
}

kv::CacheConfig int4_config(DType dt, int d) {
  kv::CacheConfig cfg;
  cfg.num_kv_heads = 2;
  cfg.head_dim = d;
  cfg.page_size = 4;
  cfg.dtype = dt;
  cfg.capacity_pages = 16;
  cfg.int4_selector_keys = true;  // the earlier switch of the selector key store
  return cfg;
}

TEST(Int4Keys, RejectsKeysBeyondTheRangeAndHeadDimsOffTheBlock) {
  kv::PagedKVCache c(int4_config(DType::f32, 32));
  const kv::SeqId s = c.create();
  std::vector<float> k(64, 1.0f), v(64, 1.0f);
  k[40] = 7.0f * 70000.0f;
  try {
    c.append(s, k, v, 1);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "k");
  }
  EXPECT_EQ(c.length(s), 0);  // nothing appended
  try {
    kv::PagedKVCache bad(int4_config(DType::f16, 24));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.argument(), "int4_selector_keys");
  }
}

}  // namespace
}  // namespace masskv
