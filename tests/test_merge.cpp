// Split-K merge (docs/design.md §2.6): softmax (o, lse) partials and the entmax two-step scheme,
// against unsplit fp64 computations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "masskv/attn/merge.hpp"
#include "masskv/error.hpp"
#include "masskv/mapping.hpp"

namespace masskv::attn {
namespace {

using masskv::test::expect_error;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Random cut points of [0, n) into `chunks` pieces; empty pieces allowed.
std::vector<int> random_cuts(int n, int chunks, std::mt19937_64& rng) {
  std::uniform_int_distribution<int> u(0, n);
  std::vector<int> cuts = {0, n};
  for (int c = 1; c < chunks; ++c) cuts.push_back(u(rng));
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// fp64 softmax attention over keys [b, e): o (normalised) and natural-log lse.
double ref_softmax_attention(const std::vector<float>& s, const std::vector<float>& v, int d, int b,
                             int e, std::vector<double>& o) {
  o.assign(d, 0.0);
  if (b == e) return -std::numeric_limits<double>::infinity();
  double m = s[b];
  for (int i = b; i < e; ++i) m = std::max(m, static_cast<double>(s[i]));
  double sum = 0;
  for (int i = b; i < e; ++i) {
    const double w = std::exp(s[i] - m);
    sum += w;
    for (int j = 0; j < d; ++j) o[j] += w * v[static_cast<std::size_t>(i) * d + j];
  }
  for (double& x : o) x /= sum;
  return m + std::log(sum);
}

TEST(MergeSoftmax, RandomSplitEqualsUnsplit) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uv(-1.0, 1.0);
  for (const int n : {1, 2, 15, 17, 113, 1000, 4097}) {
    for (const int d : {1, 64, 128}) {
      for (const int chunks : {1, 2, 3, 7, 16}) {
        std::vector<float> s(n), v(static_cast<std::size_t>(n) * d);
        for (float& x : s) x = static_cast<float>(normal(rng));
        for (float& x : v) x = static_cast<float>(uv(rng));
        std::vector<double> o_ref;
        const double lse_ref = ref_softmax_attention(s, v, d, 0, n, o_ref);
        const std::vector<int> cuts = random_cuts(n, chunks, rng);
        std::vector<std::vector<float>> o_parts(chunks);
        std::vector<SoftmaxPartialView> parts;
        std::vector<double> o_c;
        for (int c = 0; c < chunks; ++c) {
          const double lse_c = ref_softmax_attention(s, v, d, cuts[c], cuts[c + 1], o_c);
          o_parts[c].assign(o_c.begin(), o_c.end());
          parts.push_back({o_parts[c].data(), static_cast<float>(lse_c)});
        }
        std::vector<float> o(d, std::nanf(""));
        const float lse = merge_softmax(parts, d, o.data());
        const std::string where = "n=" + std::to_string(n) + " d=" + std::to_string(d) +
                                  " chunks=" + std::to_string(chunks);
        EXPECT_NEAR(lse, lse_ref, 1e-6 * std::max(1.0, std::abs(lse_ref))) << where;
        // f32 partials: o_c and lse_c each carry one float rounding (lse_c < 16 here, so its
        // half-ulp is < 1e-6 and moves the weights by < 1e-6 relative).
        for (int j = 0; j < d; ++j) ASSERT_NEAR(o[j], o_ref[j], 1e-6) << where << " j=" << j;
      }
    }
  }
}

TEST(MergeSoftmax, TwoEmptiesGiveZeroAndMinusInfinityNotNaN) {
  const SoftmaxPartialView parts[] = {{nullptr, kNegInf}, {nullptr, kNegInf}};
  std::vector<float> o(8, std::nanf(""));
  const float lse = merge_softmax(parts, 8, o.data());
  EXPECT_EQ(lse, kNegInf);
  for (const float x : o) EXPECT_EQ(x, 0.0f);
}

TEST(MergeSoftmax, NoPartsIsEmpty) {
  std::vector<float> o(3, 1.0f);
  EXPECT_EQ(merge_softmax({}, 3, o.data()), kNegInf);
  for (const float x : o) EXPECT_EQ(x, 0.0f);
}

TEST(MergeSoftmax, EmptyPartialsAreIgnored) {
  const std::vector<float> a = {1.0f, -2.0f};
  const SoftmaxPartialView parts[] = {{nullptr, kNegInf}, {a.data(), 0.5f}, {nullptr, kNegInf}};
  std::vector<float> o(2);
  EXPECT_EQ(merge_softmax(parts, 2, o.data()), 0.5f);
  EXPECT_EQ(o, a);
}

TEST(MergeSoftmax, EqualLsesAverage) {
  const std::vector<float> a = {1.0f, 0.0f}, b = {0.0f, 3.0f};
  const SoftmaxPartialView parts[] = {{a.data(), 2.0f}, {b.data(), 2.0f}};
  std::vector<float> o(2);
  EXPECT_FLOAT_EQ(merge_softmax(parts, 2, o.data()), 2.0f + std::log(2.0f));
  EXPECT_FLOAT_EQ(o[0], 0.5f);
  EXPECT_FLOAT_EQ(o[1], 1.5f);
}

TEST(MergeSoftmax, Base2ConversionRoundTrips) {
  EXPECT_FLOAT_EQ(lse_to_base2(std::log(2.0f)), 1.0f);
  EXPECT_FLOAT_EQ(lse_from_base2(1.0f), std::log(2.0f));
  EXPECT_FLOAT_EQ(lse_from_base2(lse_to_base2(12.5f)), 12.5f);
  EXPECT_EQ(lse_to_base2(kNegInf), kNegInf);
}

// ---- entmax ------------------------------------------------------------------------------------

std::vector<std::span<const float>> split_views(const std::vector<float>& s,
                                                const std::vector<int>& cuts) {
  std::vector<std::span<const float>> views;
  for (std::size_t c = 0; c + 1 < cuts.size(); ++c)
    views.emplace_back(s.data() + cuts[c], static_cast<std::size_t>(cuts[c + 1] - cuts[c]));
  return views;
}

TEST(EntmaxSplit, ThresholdEqualsUnsplitForRandomSplits) {
  std::mt19937_64 rng(3);
  std::normal_distribution<double> normal;
  for (const int n : {1, 2, 15, 16, 17, 113, 1000, 4097}) {
    for (const double alpha : {1.05, 1.25, 1.5, 1.75, 2.0}) {
      for (const double scale : {0.3, 3.0}) {
        for (const int chunks : {1, 2, 5, 33}) {
          std::vector<float> s(n);
          for (float& x : s) x = static_cast<float>(scale * normal(rng));
          if (n > 4 && chunks == 5) s[n / 2] = s[n / 3];  // a tie across chunks
          const EntmaxThreshold whole = entmax_threshold(std::span<const float>(s), alpha);
          const std::vector<int> cuts = random_cuts(n, chunks, rng);
          const auto views = split_views(s, cuts);
          const EntmaxThreshold split = entmax_threshold_split(views, alpha);
          const std::string where = "n=" + std::to_string(n) + " alpha=" + std::to_string(alpha) +
                                    " chunks=" + std::to_string(chunks);
          const double tol = 1e-12 * std::max(1.0, (alpha - 1.0) * 5.0 * scale);
          EXPECT_NEAR(split.tau, whole.tau, tol) << where;
          EXPECT_EQ(split.support, whole.support) << where;
          // The union's bracket still certifies on the full set.
          const std::vector<double> sd(s.begin(), s.end());
          EXPECT_GE(entmax_mass(sd, alpha, split.tau_lo), 1.0) << where;
          EXPECT_LE(entmax_mass(sd, alpha, split.tau_hi), 1.0) << where;
          // Candidates hold the global support.
          for (const std::span<const float> view : views) {
            std::vector<double> cand;
            append_local_candidates(view, alpha, cand);
            for (const float x : view) {
              if ((alpha - 1.0) * x > whole.tau) {
                ASSERT_NE(std::find(cand.begin(), cand.end(), static_cast<double>(x)), cand.end())
                    << where;
              }
            }
          }
        }
      }
    }
  }
}

// Two-step scheme end to end: global tau from the split, per-chunk (sum p v, sum p), merge.
TEST(MergeEntmax, TwoStepSplitEqualsDense) {
  std::mt19937_64 rng(17);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uv(-1.0, 1.0);
  for (const int n : {1, 17, 113, 1000, 4097}) {
    for (const double alpha : {1.25, 1.5, 2.0}) {
      for (const int chunks : {1, 3, 8}) {
        const int d = 64;
        std::vector<float> s(n), v(static_cast<std::size_t>(n) * d);
        for (float& x : s) x = static_cast<float>(2.0 * normal(rng));
        for (float& x : v) x = static_cast<float>(uv(rng));
        std::vector<double> p(n);
        std::vector<double> sd(s.begin(), s.end());
        entmax(std::span<const double>(sd), alpha, std::span<double>(p));
        std::vector<double> o_ref(d, 0.0);
        for (int i = 0; i < n; ++i)
          for (int j = 0; j < d; ++j) o_ref[j] += p[i] * v[static_cast<std::size_t>(i) * d + j];

        const std::vector<int> cuts = random_cuts(n, chunks, rng);
        const EntmaxThreshold th = entmax_threshold_split(split_views(s, cuts), alpha);
        std::vector<std::vector<float>> sums(chunks, std::vector<float>(d));
        std::vector<EntmaxPartialView> parts;
        for (int c = 0; c < chunks; ++c) {
          std::vector<double> acc(d, 0.0);
          double p_sum = 0;
          for (int i = cuts[c]; i < cuts[c + 1]; ++i) {
            const double t = (alpha - 1.0) * s[i] - th.tau;
            if (t <= 0) continue;
            const double pi = std::pow(t, 1.0 / (alpha - 1.0));
            p_sum += pi;
            for (int j = 0; j < d; ++j) acc[j] += pi * v[static_cast<std::size_t>(i) * d + j];
          }
          sums[c].assign(acc.begin(), acc.end());
          parts.push_back({sums[c].data(), p_sum});
        }
        std::vector<float> o(d, std::nanf(""));
        merge_entmax(parts, d, o.data());
        for (int j = 0; j < d; ++j)
          ASSERT_NEAR(o[j], o_ref[j], 1e-6) << "n=" << n << " alpha=" << alpha << " j=" << j;
      }
    }
  }
}

TEST(MergeEntmax, ZeroMassGivesZero) {
  const std::vector<float> zero(4, 0.0f);
  const EntmaxPartialView parts[] = {{zero.data(), 0.0}, {nullptr, 0.0}};
  std::vector<float> o(4, std::nanf(""));
  merge_entmax(parts, 4, o.data());
  for (const float x : o) EXPECT_EQ(x, 0.0f);
  merge_entmax({}, 4, o.data());
  for (const float x : o) EXPECT_EQ(x, 0.0f);
}

// ---- bad input ---------------------------------------------------------------------------------

TEST(MergeErrors, NonPositiveDNamesD) {
  float o[1];
  expect_error([&] { merge_softmax({}, 0, o); }, ErrorCode::invalid_argument, "d");
  expect_error([&] { merge_entmax({}, -1, o); }, ErrorCode::invalid_argument, "d");
}
TEST(MergeErrors, NullOutputNamesO) {
  expect_error([] { merge_softmax({}, 4, nullptr); }, ErrorCode::invalid_argument, "o");
  expect_error([] { merge_entmax({}, 4, nullptr); }, ErrorCode::invalid_argument, "o");
}
TEST(MergeErrors, NaNLseNamesParts) {
  const float a[1] = {1.0f};
  const SoftmaxPartialView parts[] = {{a, std::nanf("")}};
  float o[1];
  expect_error([&] { merge_softmax(parts, 1, o); }, ErrorCode::non_finite, "parts");
}
TEST(MergeErrors, PositiveInfiniteLseNamesParts) {
  const float a[1] = {1.0f};
  const SoftmaxPartialView parts[] = {{a, std::numeric_limits<float>::infinity()}};
  float o[1];
  expect_error([&] { merge_softmax(parts, 1, o); }, ErrorCode::non_finite, "parts");
}
TEST(MergeErrors, NonEmptySoftmaxPartialWithoutOutputNamesParts) {
  const SoftmaxPartialView parts[] = {{nullptr, 0.0f}};
  float o[1];
  expect_error([&] { merge_softmax(parts, 1, o); }, ErrorCode::invalid_argument, "parts");
}
TEST(MergeErrors, NegativePSumNamesParts) {
  const float a[1] = {1.0f};
  const EntmaxPartialView parts[] = {{a, -0.5}};
  float o[1];
  expect_error([&] { merge_entmax(parts, 1, o); }, ErrorCode::invalid_argument, "parts");
}
TEST(MergeErrors, NaNPSumNamesParts) {
  const float a[1] = {1.0f};
  const EntmaxPartialView parts[] = {{a, std::nan("")}};
  float o[1];
  expect_error([&] { merge_entmax(parts, 1, o); }, ErrorCode::invalid_argument, "parts");
}
TEST(MergeErrors, EntmaxPartialWithMassButNoSumNamesParts) {
  const EntmaxPartialView parts[] = {{nullptr, 0.5}};
  float o[1];
  expect_error([&] { merge_entmax(parts, 1, o); }, ErrorCode::invalid_argument, "parts");
}
TEST(MergeErrors, AllChunksEmptyNamesChunks) {
  const std::vector<std::span<const float>> chunks(3);
  expect_error([&] { entmax_threshold_split(chunks, 1.5); }, ErrorCode::invalid_argument, "chunks");
}
TEST(MergeErrors, SplitBadAlphaNamesAlpha) {
  const std::vector<float> s = {1.0f};
  const std::vector<std::span<const float>> chunks = {s};
  expect_error([&] { entmax_threshold_split(chunks, 0.9); }, ErrorCode::invalid_argument, "alpha");
}
TEST(MergeErrors, SplitNaNScoreNamesScores) {
  const std::vector<float> s = {1.0f, std::nanf("")};
  const std::vector<std::span<const float>> chunks = {s};
  expect_error([&] { entmax_threshold_split(chunks, 1.5); }, ErrorCode::non_finite, "scores");
}

}  // namespace
}  // namespace masskv::attn
