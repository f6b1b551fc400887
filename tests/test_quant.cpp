// ggml tensor types: dequantize_row vs a plain fp64 reference written from the block layouts
// (bit-exact: every kernel value is the exact block formula rounded once to f32), dot_row
// (scalar and AVX2) vs fp64 dot products (tolerance 1e-5 * sum|w_i x_i|), and errors for
// unsupported types and partial blocks. Q8 activations: the quantiser (scalar and AVX2 bit-equal,
// within half a step), the integer dot kernels against fp64 on the dequantised Q8 activations
// (a priori f32 bound) and on the original f32 ones (plus the Q8 rounding bound), scalar and
// AVX2 bit-equal; matvec equal to them and independent of the thread count. The prefill
// matmul: AVX2 dequantisers bit-equal to the scalar ones, scalar and AVX2 panel kernels vs fp64
// (same tolerance) on ragged shapes, independence of thread count and token block.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/cpu_features.hpp"
#include "core/gemm.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/model/quant.hpp"
#include "model/quant_kernels.hpp"

using masskv::Error;
using masskv::ErrorCode;
using namespace masskv::model;
namespace linalg = masskv::linalg;

namespace {

constexpr double kDotRelTol = 1e-5;  // of sum_i |w_i x_i|; f32 accumulation is far below it

const GgmlType kComputeTypes[] = {GgmlType::f32,  GgmlType::f16,  GgmlType::bf16, GgmlType::q4_0,
                                  GgmlType::q4_1, GgmlType::q5_0, GgmlType::q5_1, GgmlType::q8_0,
                                  GgmlType::q4_k, GgmlType::q6_k};

double f16d(const std::uint8_t* p) {
  std::uint16_t b;
  std::memcpy(&b, p, 2);
  return masskv::f16_to_f32(masskv::f16{b});
}

// ---- fp64 reference: value i of a row, straight from the block layout ------------------------
double ref_value(GgmlType type, const std::uint8_t* row, std::size_t i) {
  const TypeTraits& t = type_traits(type);
  const std::uint8_t* b = row + (i / t.block_elems) * t.block_bytes;
  const std::size_t j = i % t.block_elems;
  const auto nibble32 = [&](const std::uint8_t* qs) {  // value j of 32: low nibbles first
    return j < 16 ? (qs[j] & 15) : (qs[j - 16] >> 4);
  };
  const auto bit = [&](const std::uint8_t* qh) { return (qh[j / 8] >> (j % 8)) & 1; };
  switch (type) {
    case GgmlType::f32: {
      float f;
      std::memcpy(&f, b, 4);
      return f;
    }
    case GgmlType::f16:
      return f16d(b);
    case GgmlType::bf16: {
      std::uint16_t h;
      std::memcpy(&h, b, 2);
      return masskv::bf16_to_f32(masskv::bf16{h});
    }
    case GgmlType::q4_0:
      return f16d(b) * (nibble32(b + 2) - 8);
    case GgmlType::q4_1:
      return f16d(b) * nibble32(b + 4) + f16d(b + 2);
    case GgmlType::q5_0:
      return f16d(b) * ((nibble32(b + 6) | bit(b + 2) << 4) - 16);
    case GgmlType::q5_1:
      return f16d(b) * (nibble32(b + 8) | bit(b + 4) << 4) + f16d(b + 2);
    case GgmlType::q8_0:
      return f16d(b) * static_cast<std::int8_t>(b[2 + j]);
    case GgmlType::q4_k: {
      const std::uint8_t* s = b + 4;
      const std::size_t sub = j / 32;  // 8 sub-blocks of 32
      int sc, mn;
      if (sub < 4) {
        sc = s[sub] & 63;
        mn = s[sub + 4] & 63;
      } else {
        sc = (s[sub + 4] & 15) | (s[sub - 4] >> 6) << 4;
        mn = (s[sub + 4] >> 4) | (s[sub] >> 6) << 4;
      }
      const std::uint8_t byte = b[16 + 32 * (j / 64) + j % 32];
      const int q = sub % 2 == 0 ? (byte & 15) : (byte >> 4);
      return f16d(b) * sc * q - f16d(b + 2) * mn;
    }
    case GgmlType::q6_k: {
      const std::size_t h = j / 128, k = (j % 128) / 32, l = j % 32;
      const std::uint8_t lo = b[64 * h + l + 32 * (k % 2)];
      const int low4 = k < 2 ? (lo & 15) : (lo >> 4);
      const int high2 = (b[128 + 32 * h + l] >> (2 * k)) & 3;
      const int scale = static_cast<std::int8_t>(b[192 + 8 * h + l / 16 + 2 * k]);
      return f16d(b + 208) * scale * ((low4 | high2 << 4) - 32);
    }
    default:
      break;
  }
  ADD_FAILURE() << "no reference for " << to_string(type);
  return 0;
}

void put_f16(std::uint8_t* p, float v) {
  const std::uint16_t bits = masskv::f32_to_f16(v).bits;
  std::memcpy(p, &bits, 2);
}

// A random row: random bytes for quants and scale bytes, finite random f16 scales/mins, finite
// random values for the plain float types.
std::vector<std::uint8_t> random_row(GgmlType type, std::size_t n, std::mt19937& rng) {
  const TypeTraits& t = type_traits(type);
  std::vector<std::uint8_t> row(n / t.block_elems * t.block_bytes);
  for (auto& c : row) c = static_cast<std::uint8_t>(rng());
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const auto scale = [&] { return nd(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 12) - 10); };
  for (std::size_t blk = 0; blk < n / t.block_elems; ++blk) {
    std::uint8_t* b = row.data() + blk * t.block_bytes;
    switch (type) {
      case GgmlType::f32: {
        const float v = scale();
        std::memcpy(b, &v, 4);
        break;
      }
      case GgmlType::f16:
        put_f16(b, scale());
        break;
      case GgmlType::bf16: {
        const std::uint16_t bits = masskv::f32_to_bf16(scale()).bits;
        std::memcpy(b, &bits, 2);
        break;
      }
      case GgmlType::q4_1:
      case GgmlType::q5_1:
      case GgmlType::q4_k:  // d and dmin
        put_f16(b, scale());
        put_f16(b + 2, scale());
        break;
      case GgmlType::q6_k:
        put_f16(b + 208, scale());
        break;
      default:
        put_f16(b, scale());
        break;  // q4_0, q5_0, q8_0: d
    }
  }
  return row;
}

std::vector<std::size_t> widths(GgmlType type) {
  switch (type_traits(type).block_elems) {
    case 1:
      return {1, 7, 17, 64, 576, 1000};
    case 32:
      return {32, 64, 96, 576, 1536};
    default:
      return {256, 512, 1024, 2048};
  }
}

struct RefDot {
  double value = 0, magnitude = 0;  // sum w x, sum |w x|
};
RefDot ref_dot(GgmlType type, const std::uint8_t* row, const float* x, std::size_t n) {
  RefDot r;
  for (std::size_t i = 0; i < n; ++i) {
    const double p = ref_value(type, row, i) * x[i];
    r.value += p;
    r.magnitude += std::abs(p);
  }
  return r;
}

std::vector<float> random_x(std::size_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

}  // namespace

TEST(Dequant, BitExactVsFp64ReferenceOnRandomBlocks) {
  std::mt19937 rng(42);
  for (GgmlType type : kComputeTypes) {
    for (std::size_t n : widths(type)) {
      SCOPED_TRACE(testing::Message() << to_string(type) << " n=" << n);
      for (int trial = 0; trial < 3; ++trial) {
        const auto row = random_row(type, n, rng);
        std::vector<float> y(n, -1.0f);
        dequantize_row(type, row.data(), y.data(), n);
        int bad = 0;
        for (std::size_t i = 0; i < n && bad < 5; ++i) {
          const float want = static_cast<float>(ref_value(type, row.data(), i));
          if (std::memcmp(&want, &y[i], 4) != 0) {
            ADD_FAILURE() << "value " << i << ": got " << y[i] << " want " << want;
            ++bad;
          }
        }
      }
    }
  }
}

// Values fixed by hand from the layouts, so the fp64 reference is itself pinned down.
TEST(Dequant, HandBuiltBlocksGiveKnownValues) {
  std::vector<std::uint8_t> q40(q4_0_bytes, 0x88);  // every nibble 8 -> 0
  put_f16(q40.data(), 0.5f);
  q40[2] = 0x9F;  // value 0: (15-8)*0.5, value 16: (9-8)*0.5
  float y[256];
  dequantize_row(GgmlType::q4_0, q40.data(), y, 32);
  EXPECT_EQ(y[0], 3.5f);
  EXPECT_EQ(y[16], 0.5f);
  EXPECT_EQ(y[1], 0.0f);

  std::vector<std::uint8_t> q6(q6_k_bytes, 0);
  put_f16(q6.data() + 208, 1.0f);
  q6[192] = 2;     // scale of values 0-15
  q6[0] = 0x05;    // low 4 bits of value 0 (and of value 64 in the high nibble: 0)
  q6[128] = 0x02;  // high 2 bits of value 0 -> q = 5 | 2<<4 = 37, minus 32 = 5
  dequantize_row(GgmlType::q6_k, q6.data(), y, 256);
  EXPECT_EQ(y[0], 10.0f);
  EXPECT_EQ(y[1], -64.0f);  // all-zero bits are q = -32, times scale 2
  EXPECT_EQ(y[16], 0.0f);   // scale 1 (values 16-31) is 0

  std::vector<std::uint8_t> q4k(q4_k_bytes, 0);
  put_f16(q4k.data(), 1.0f);      // d
  put_f16(q4k.data() + 2, 1.0f);  // dmin
  q4k[4 + 0] = 3 | 1 << 6;        // scale 0 = 3; top bits feed scale 4
  q4k[4 + 4] = 1;                 // min 0 = 1
  q4k[4 + 8] = 0x21;              // scale 4 = 1 | 1<<4 = 17, min 4 = 2
  q4k[16 + 0] = 0x75;             // value 0: q=5 (sub-block 0); value 32: q=7 (sub-block 1)
  q4k[16 + 64] = 0x03;            // value 128: q=3 (sub-block 4)
  dequantize_row(GgmlType::q4_k, q4k.data(), y, 256);
  EXPECT_EQ(y[0], 3.0f * 5 - 1);
  EXPECT_EQ(y[32], 0.0f);  // scale 1 and min 1 are 0
  EXPECT_EQ(y[128], 17.0f * 3 - 2);
}

TEST(DotRow, ScalarAndAvx2MatchFp64Reference) {
  std::mt19937 rng(7);
  const bool avx2 = masskv::cpu::has_avx2();
  for (GgmlType type : kComputeTypes) {
    for (std::size_t n : widths(type)) {
      SCOPED_TRACE(testing::Message() << to_string(type) << " n=" << n);
      for (int trial = 0; trial < 3; ++trial) {
        const auto row = random_row(type, n, rng);
        const auto x = random_x(n, rng);
        const RefDot ref = ref_dot(type, row.data(), x.data(), n);
        const double tol = kDotRelTol * ref.magnitude;
        EXPECT_NEAR(kernels::scalar_dot(type)(row.data(), x.data(), n), ref.value, tol);
        EXPECT_NEAR(dot_row(type, row.data(), x.data(), n), ref.value, tol);
        if (avx2) {
          ASSERT_NE(kernels::avx2_dot(type), nullptr);
          EXPECT_NEAR(kernels::avx2_dot(type)(row.data(), x.data(), n), ref.value, tol);
        }
      }
    }
  }
}

// ---- Q8 activations ----------------------------------------------------------------------

namespace {

constexpr double kU = 0x1p-24;  // unit roundoff of f32

bool q8_type(GgmlType type) { return type_traits(type).block_elems != 1; }

// Activations shaped like a model's: per block of 32 a random power-of-two magnitude (2^-8 to
// 2^8) and now and then an outlier 100x the rest, so block scales differ widely.
std::vector<float> random_activations(std::size_t n, std::mt19937& rng) {
  auto x = random_x(n, rng);
  for (std::size_t b = 0; b < n; b += 32) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 17) - 8);
    for (std::size_t j = 0; j < 32; ++j) x[b + j] *= scale;
    if (rng() % 4 == 0) x[b + rng() % 32] *= 100.0f;
  }
  return x;
}

// The offset part of value i (m for Q4_1/Q5_1, -dmin * min for Q4_K, else 0): the Q8 kernels
// take it against the block's activation sum, so their rounding scales with |d q x| + |m x|.
double ref_offset(GgmlType type, const std::uint8_t* row, std::size_t i) {
  const TypeTraits& t = type_traits(type);
  const std::uint8_t* b = row + (i / t.block_elems) * t.block_bytes;
  switch (type) {
    case GgmlType::q4_1:
    case GgmlType::q5_1:
      return f16d(b + 2);
    case GgmlType::q4_k: {
      std::uint8_t sc[8], mn[8];
      kernels::q4_k_scales_mins(b + 4, sc, mn);
      return -f16d(b + 2) * mn[(i % 256) / 32];
    }
    default:
      return 0;
  }
}

struct Q8Case {
  std::vector<float> x;
  Q8Activations xq;
  std::vector<double> xd;  // d[i/32] * q[i] in fp64: the values the kernels multiply
};

Q8Case random_q8(std::size_t n, std::mt19937& rng) {
  Q8Case c;
  c.x = random_activations(n, rng);
  quantize_q8(c.x.data(), n, c.xq);
  for (std::size_t i = 0; i < n; ++i)
    c.xd.push_back(static_cast<double>(c.xq.d[i / 32]) * c.xq.q[i]);
  return c;
}

kernels::Q8View view(const Q8Activations& a) { return {a.q.data(), a.d.data(), a.sum.data()}; }

}  // namespace

// Both quantisers give the same bits; d = max|x| / 127 and |x - d q| <= d (1/2 + 1e-4) (x is
// multiplied by 1/d rounded to f32, which can move x/d by a few ulp of 127); sum = d * sum q.
TEST(QuantizeQ8, Avx2BitEqualsScalarAndWithinHalfAStep) {
  std::mt19937 rng(21);
  const bool avx2 = masskv::cpu::has_avx2();
  for (std::size_t n : {32, 64, 96, 576, 640, 2048}) {
    for (int trial = 0; trial < 5; ++trial) {
      const auto x = random_activations(n, rng);
      std::vector<std::int8_t> q(n, 99);
      std::vector<float> d(n / 32, -1), sum(n / 32, -1);
      kernels::quantize_q8_scalar(x.data(), n, q.data(), d.data(), sum.data());
      for (std::size_t b = 0; b < n / 32; ++b) {
        float amax = 0;
        int s = 0;
        for (std::size_t j = 0; j < 32; ++j) {
          amax = std::max(amax, std::abs(x[32 * b + j]));
          s += q[32 * b + j];
        }
        ASSERT_EQ(d[b], amax / 127.0f) << "block " << b;
        EXPECT_EQ(sum[b], d[b] * static_cast<float>(s)) << "block " << b;
        for (std::size_t j = 0; j < 32; ++j) {
          const std::size_t i = 32 * b + j;
          ASSERT_LE(std::abs(q[i]), 127);
          ASSERT_LE(std::abs(x[i] - static_cast<double>(d[b]) * q[i]), d[b] * (0.5 + 1e-4)) << i;
        }
      }
      if (avx2) {
        std::vector<std::int8_t> q2(n, 99);
        std::vector<float> d2(n / 32, -2), sum2(n / 32, -2);
        kernels::quantize_q8_avx2(x.data(), n, q2.data(), d2.data(), sum2.data());
        EXPECT_EQ(q, q2) << "n=" << n;
        EXPECT_EQ(std::memcmp(d.data(), d2.data(), d.size() * 4), 0) << "n=" << n;
        EXPECT_EQ(std::memcmp(sum.data(), sum2.data(), sum.size() * 4), 0) << "n=" << n;
      }
    }
  }
}

// Blocks that are all zero or too small for a normal d read as zeros; a block holding an inf or
// a NaN gets d = sum = NaN, so every dot product that touches it is NaN, not a silent number.
TEST(QuantizeQ8, ZeroTinyAndNonFiniteBlocks) {
  std::vector<float> x(5 * 32, 0.5f);
  std::fill(x.begin(), x.begin() + 32, 0.0f);
  std::fill(x.begin() + 32, x.begin() + 64, 1e-37f);
  x[64 + 3] = std::numeric_limits<float>::infinity();
  x[96 + 31] = std::numeric_limits<float>::quiet_NaN();
  using Fn = kernels::QuantizeQ8Fn;
  std::vector<Fn> fns{kernels::quantize_q8_scalar};
  if (masskv::cpu::has_avx2()) fns.push_back(kernels::quantize_q8_avx2);
  for (const Fn fn : fns) {
    std::vector<std::int8_t> q(x.size(), 7);
    std::vector<float> d(5), sum(5);
    fn(x.data(), x.size(), q.data(), d.data(), sum.data());
    EXPECT_EQ(d[0], 0.0f);
    EXPECT_EQ(d[1], 0.0f);
    EXPECT_TRUE(std::isnan(d[2]) && std::isnan(sum[2]));
    EXPECT_TRUE(std::isnan(d[3]) && std::isnan(sum[3]));
    EXPECT_EQ(d[4], 0.5f / 127.0f);
    EXPECT_EQ(sum[4], d[4] * 127 * 32);
    for (std::size_t i = 0; i < 128; ++i) ASSERT_EQ(q[i], 0) << i;
    for (std::size_t i = 128; i < 160; ++i) ASSERT_EQ(q[i], 127) << i;
  }
  Q8Activations xq;
  quantize_q8(x.data(), x.size(), xq);
  const auto row = std::vector<std::uint8_t>(5 * q8_0_bytes, 1);
  EXPECT_TRUE(std::isnan(dot_row_q8(GgmlType::q8_0, row.data(), xq, x.size())));
  EXPECT_FALSE(std::isnan(dot_row_q8(GgmlType::q8_0, row.data(), xq, 64)));
}

// Against fp64 on the dequantised Q8 activations x~ = d q: only f32 rounding is left. Each of
// the 8 lanes sums one exact integer term per block of 32 with an FMA, the scale d_w * d_x is
// rounded once, the lanes are added in 3 levels (and the Q4_1/Q5_1/Q4_K offset terms likewise),
// so |error| <= (n/32 + 5) u sum_i (|w_i - o_i| + |o_i|) |x~_i| (o_i: the offset part of w_i).
// Against fp64 on the original x: that plus the Q8 rounding, sum_b d_b (1/2 + 1e-4) sum |w_i|.
TEST(DotRowQ8, MatchesFp64OnQuantisedAndOnOriginalActivations) {
  std::mt19937 rng(17);
  const bool avx2 = masskv::cpu::has_avx2();
  for (GgmlType type : kComputeTypes) {
    if (!q8_type(type)) {
      EXPECT_FALSE(uses_q8_activations(type)) << to_string(type);
      continue;
    }
    ASSERT_TRUE(uses_q8_activations(type)) << to_string(type);
    ASSERT_NE(kernels::scalar_q8_dot(type), nullptr);
    for (std::size_t n : widths(type)) {
      SCOPED_TRACE(testing::Message() << to_string(type) << " n=" << n);
      for (int trial = 0; trial < 4; ++trial) {
        const auto row = random_row(type, n, rng);
        const Q8Case c = random_q8(n, rng);
        double want_q = 0, want_x = 0, mag = 0, q8_bound = 0;
        for (std::size_t i = 0; i < n; ++i) {
          const double w = ref_value(type, row.data(), i), o = ref_offset(type, row.data(), i);
          want_q += w * c.xd[i];
          want_x += w * c.x[i];
          mag += (std::abs(w - o) + std::abs(o)) * std::abs(c.xd[i]);
          q8_bound += std::abs(w) * c.xq.d[i / 32] * (0.5 + 1e-4);
        }
        const double tight = (static_cast<double>(n) / 32 + 5) * kU * mag;
        const float got = kernels::scalar_q8_dot(type)(row.data(), view(c.xq), n);
        EXPECT_NEAR(got, want_q, tight) << "scalar vs fp64 on d q";
        EXPECT_NEAR(got, want_x, tight + q8_bound) << "scalar vs fp64 on x";
        const float api = dot_row_q8(type, row.data(), c.xq, n);
        EXPECT_NEAR(api, want_q, tight) << "dot_row_q8 vs fp64 on d q";
        if (avx2) {
          ASSERT_NE(kernels::avx2_q8_dot(type), nullptr);
          const float v = kernels::avx2_q8_dot(type)(row.data(), view(c.xq), n);
          EXPECT_EQ(std::memcmp(&v, &got, 4), 0) << "avx2 " << v << " scalar " << got;
        }
      }
    }
  }
}

// Hand-built extremes the random rows rarely hit: Q8_0 weights of -128 against +-127
// activations (the largest maddubs pairs) and Q6_K scales of -128; the kernels must not
// saturate, so they equal the fp64 product of the dequantised values exactly here (all terms
// are small integers times powers of two).
TEST(DotRowQ8, ExtremeIntegersDoNotSaturate) {
  std::vector<float> x(256);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = i % 3 == 0 ? -1.0f : 1.0f;
  Q8Activations xq;
  quantize_q8(x.data(), x.size(), xq);  // d = 1/127, q = +-127
  std::vector<std::uint8_t> q8(8 * q8_0_bytes);
  for (std::size_t b = 0; b < 8; ++b) {
    put_f16(q8.data() + b * q8_0_bytes, 1.0f);
    std::fill_n(q8.data() + b * q8_0_bytes + 2, 32, std::uint8_t{0x80});  // -128
  }
  std::vector<std::uint8_t> q6(q6_k_bytes, 0);  // every q = -32
  put_f16(q6.data() + 208, 1.0f);
  std::fill_n(q6.data() + 192, 16, std::uint8_t{0x80});  // scales -128
  for (const auto& [type, row] : {std::pair{GgmlType::q8_0, &q8}, std::pair{GgmlType::q6_k, &q6}}) {
    double want = 0;
    for (std::size_t i = 0; i < 256; ++i) {
      want += ref_value(type, row->data(), i) * static_cast<double>(xq.d[0]) * xq.q[i];
    }
    std::vector<kernels::Q8DotFn> fns{kernels::scalar_q8_dot(type)};
    if (masskv::cpu::has_avx2()) fns.push_back(kernels::avx2_q8_dot(type));
    for (const auto fn : fns) {
      EXPECT_NEAR(fn(row->data(), view(xq), 256), want, 1e-6 * std::abs(want)) << to_string(type);
    }
  }
}

// Both activation formats on odd row counts: each y[r] is bit-equal to its row's dot product
// (dot_row_q8 on the quantised x, or dot_row on x), within 1e-5 * sum|w x| of fp64 on the
// values that dot product sees, and the same with 1 and 3 threads.
TEST(Matvec, MatchesFp64AndDoesNotDependOnThreadCount) {
  std::mt19937 rng(3);
  for (GgmlType type : kComputeTypes) {
    const std::size_t cols = type_traits(type).block_elems == 256 ? 512 : 96;
    for (std::size_t rows : {1, 17, 100}) {
      std::vector<std::uint8_t> w;
      for (std::size_t r = 0; r < rows; ++r) {
        const auto row = random_row(type, cols, rng);
        w.insert(w.end(), row.begin(), row.end());
      }
      const auto x = random_activations(cols, rng);
      Q8Activations xq;
      quantize_q8(x.data(), cols, xq);
      for (const Activations act : {Activations::q8, Activations::f32}) {
        const bool q8 = act == Activations::q8 && uses_q8_activations(type);
        SCOPED_TRACE(testing::Message() << to_string(type) << " rows=" << rows << " q8=" << q8);
        std::vector<float> y1(rows), y2(rows);
        const int saved = omp_get_max_threads();
        omp_set_num_threads(1);
        matvec(type, w.data(), rows, cols, x.data(), y1.data(), act);
        omp_set_num_threads(3);
        matvec(type, w.data(), rows, cols, x.data(), y2.data(), act);
        omp_set_num_threads(saved);
        std::vector<float> seen(x);  // the activations the row's dot product multiplies
        if (q8) {
          for (std::size_t i = 0; i < cols; ++i)
            seen[i] = xq.d[i / 32] * static_cast<float>(xq.q[i]);
        }
        const std::size_t stride = row_bytes(type, cols);
        for (std::size_t r = 0; r < rows; ++r) {
          EXPECT_EQ(std::memcmp(&y1[r], &y2[r], 4), 0) << r;
          const std::uint8_t* wr = w.data() + r * stride;
          const float d = q8 ? dot_row_q8(type, wr, xq, cols) : dot_row(type, wr, x.data(), cols);
          EXPECT_EQ(std::memcmp(&y1[r], &d, 4), 0) << r;
          const RefDot ref = ref_dot(type, wr, seen.data(), cols);
          EXPECT_NEAR(y1[r], ref.value, kDotRelTol * ref.magnitude) << r;
        }
      }
    }
  }
}

TEST(Quant, PartialBlocksAndUnsupportedTypesAreErrors) {
  std::vector<std::uint8_t> buf(4096);
  std::vector<float> y(1024);
  const auto code = [](auto&& fn) {
    try {
      fn();
    } catch (const Error& e) {
      return e.code();
    }
    return ErrorCode::out_of_memory;  // "did not throw"
  };
  EXPECT_EQ(code([&] { dequantize_row(GgmlType::q4_k, buf.data(), y.data(), 640); }),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { (void)dot_row(GgmlType::q6_k, buf.data(), y.data(), 320); }),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { matvec(GgmlType::q8_0, buf.data(), 2, 48, y.data(), y.data()); }),
            ErrorCode::invalid_argument);
  EXPECT_EQ(code([&] { dequantize_row(GgmlType::q2_k, buf.data(), y.data(), 256); }),
            ErrorCode::unsupported);
  EXPECT_EQ(code([&] { (void)row_bytes(GgmlType::q4_0, 33); }), ErrorCode::invalid_argument);
  EXPECT_EQ(row_bytes(GgmlType::q4_k, 1024), 4u * 144);
  EXPECT_EQ(row_bytes(GgmlType::q6_k, 2048), 8u * 210);
  EXPECT_EQ(row_bytes(GgmlType::q5_0, 640), 20u * 22);
  Q8Activations xq;
  EXPECT_EQ(code([&] { quantize_q8(y.data(), 48, xq); }), ErrorCode::invalid_argument);
  quantize_q8(y.data(), 64, xq);
  EXPECT_EQ(code([&] { (void)dot_row_q8(GgmlType::f16, buf.data(), xq, 64); }),
            ErrorCode::unsupported);
  EXPECT_EQ(code([&] { (void)dot_row_q8(GgmlType::q8_0, buf.data(), xq, 96); }),
            ErrorCode::invalid_argument);  // x holds only 64 values
  EXPECT_EQ(code([&] { (void)dot_row_q8(GgmlType::q4_k, buf.data(), xq, 64); }),
            ErrorCode::invalid_argument);  // partial Q4_K block
}

// ---- prefill matmul ---------------------------------------------------------------------------

TEST(Dequant, Avx2BitEqualsScalarForEveryType) {
  if (!masskv::cpu::has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(11);
  for (GgmlType type : kComputeTypes) {
    ASSERT_NE(kernels::avx2_dequant(type), nullptr) << to_string(type);
    for (std::size_t n : widths(type)) {
      SCOPED_TRACE(testing::Message() << to_string(type) << " n=" << n);
      for (int trial = 0; trial < 3; ++trial) {
        const auto row = random_row(type, n, rng);
        std::vector<float> a(n, -1.0f), b(n, -2.0f);
        kernels::scalar_dequant(type)(row.data(), a.data(), n);
        kernels::avx2_dequant(type)(row.data(), b.data(), n);
        ASSERT_EQ(std::memcmp(a.data(), b.data(), n * sizeof(float)), 0);
      }
    }
  }
}

namespace {

struct MatmulCase {
  std::vector<std::uint8_t> w;
  std::vector<double> wd;  // fp64 reference values, [rows][cols]
  std::vector<float> x;    // [n][cols]
};

MatmulCase random_matmul(GgmlType type, std::size_t rows, std::size_t cols, std::size_t n,
                         std::mt19937& rng) {
  MatmulCase c;
  for (std::size_t r = 0; r < rows; ++r) {
    const auto row = random_row(type, cols, rng);
    c.w.insert(c.w.end(), row.begin(), row.end());
    for (std::size_t i = 0; i < cols; ++i) c.wd.push_back(ref_value(type, row.data(), i));
  }
  c.x = random_x(n * cols, rng);
  return c;
}

}  // namespace

// Rows around the 8-row panel, tokens around the 8-token vector, the 24-token tile and the
// 128-token block; every output within 1e-5 * sum|w x| of the fp64 product.
TEST(Matmul, ScalarAndAvx2MatchFp64Reference) {
  std::mt19937 rng(5);
  const bool avx2 = masskv::cpu::has_avx2();
  for (GgmlType type : kComputeTypes) {
    const std::size_t cols = type_traits(type).block_elems == 256 ? 512 : 96;
    for (const auto& [rows, n] : {std::pair<std::size_t, std::size_t>{1, 1},
                                  {7, 2},
                                  {8, 8},
                                  {13, 23},
                                  {17, 24},
                                  {24, 25},
                                  {9, 49},
                                  {3, 131}}) {
      SCOPED_TRACE(testing::Message() << to_string(type) << " rows=" << rows << " n=" << n);
      const MatmulCase c = random_matmul(type, rows, cols, n, rng);
      std::vector<std::pair<const char*, std::vector<float>>> results;
      results.emplace_back("scalar", std::vector<float>(n * rows));
      linalg::gemm_with(
          {kernels::scalar_dequant(type), linalg::panel_scalar, linalg::transpose_scalar},
          c.w.data(), row_bytes(type, cols), rows, cols, c.x.data(), n,
          results.back().second.data());
      if (avx2) {
        results.emplace_back("avx2", std::vector<float>(n * rows));
        linalg::gemm_with(
            {kernels::avx2_dequant(type), linalg::panel_avx2, linalg::transpose_avx2},
            c.w.data(), row_bytes(type, cols), rows, cols, c.x.data(), n,
            results.back().second.data());
      }
      results.emplace_back("matmul", std::vector<float>(n * rows));
      matmul(type, c.w.data(), rows, cols, c.x.data(), n, results.back().second.data());
      for (std::size_t t = 0; t < n; ++t) {
        for (std::size_t r = 0; r < rows; ++r) {
          double want = 0, mag = 0;
          for (std::size_t i = 0; i < cols; ++i) {
            const double p = c.wd[r * cols + i] * c.x[t * cols + i];
            want += p;
            mag += std::abs(p);
          }
          for (const auto& [name, y] : results) {
            ASSERT_NEAR(y[t * rows + r], want, kDotRelTol * mag)
                << name << " token " << t << " row " << r;
          }
        }
      }
    }
  }
}

// One output is one f32 chain in a fixed order: neither the thread count nor the token's block
// (how many tokens come with it, where it sits) changes its bits.
TEST(Matmul, ResultDoesNotDependOnThreadCountOrTokenBlock) {
  std::mt19937 rng(9);
  for (GgmlType type : {GgmlType::q4_1, GgmlType::q4_k, GgmlType::q8_0, GgmlType::f16}) {
    const std::size_t cols = type_traits(type).block_elems == 256 ? 256 : 64;
    const std::size_t rows = 37, n = 150;
    SCOPED_TRACE(to_string(type));
    const MatmulCase c = random_matmul(type, rows, cols, n, rng);
    std::vector<float> y1(n * rows), y3(n * rows);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    matmul(type, c.w.data(), rows, cols, c.x.data(), n, y1.data());
    omp_set_num_threads(3);
    matmul(type, c.w.data(), rows, cols, c.x.data(), n, y3.data());
    omp_set_num_threads(saved);
    EXPECT_EQ(std::memcmp(y1.data(), y3.data(), y1.size() * sizeof(float)), 0);
    for (const std::size_t first : {1u, 5u, 30u, 149u}) {
      const std::size_t m = std::min<std::size_t>(n - first, 11);
      std::vector<float> ys(m * rows);
      matmul(type, c.w.data(), rows, cols, c.x.data() + first * cols, m, ys.data());
      EXPECT_EQ(std::memcmp(ys.data(), y1.data() + first * rows, ys.size() * sizeof(float)), 0)
          << "tokens from " << first;
    }
  }
}

TEST(Matmul, Avx2TransposeEqualsScalarOnRaggedShapes) {
  if (!masskv::cpu::has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(13);
  for (const auto& [rows, cols] :
       {std::pair<std::size_t, std::size_t>{1, 1}, {8, 8}, {9, 17}, {64, 576}, {23, 7}, {8, 130}}) {
    const std::size_t lds = cols + 3, ldd = rows + 5;
    const auto src = random_x(rows * lds, rng);
    std::vector<float> a(cols * ldd, -1.0f), b(cols * ldd, -1.0f);
    linalg::transpose_scalar(src.data(), lds, rows, cols, a.data(), ldd);
    linalg::transpose_avx2(src.data(), lds, rows, cols, b.data(), ldd);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << rows << "x" << cols;
    EXPECT_EQ(a[ldd * (cols - 1) + rows - 1], src[(rows - 1) * lds + cols - 1]);
  }
}
