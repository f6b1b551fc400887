// Softmax and its natural-log LSE (docs/design.md §2.6) against a plain long double reference.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "masskv/error.hpp"
#include "masskv/mapping.hpp"

namespace masskv {
namespace {

using masskv::test::expect_error;

struct Ref {
  std::vector<long double> p;
  long double lse;
};

Ref ref_softmax(const std::vector<double>& s) {
  long double m = s[0];
  for (const double x : s) m = std::max<long double>(m, x);
  long double sum = 0;
  for (const double x : s) sum += std::exp(static_cast<long double>(x) - m);
  Ref r{{}, m + std::log(sum)};
  for (const double x : s) r.p.push_back(std::exp(static_cast<long double>(x) - m) / sum);
  return r;
}

// Relative error of p_i: exp amplifies the rounding of s_i - max by |s_i - max|, and the sum
// of n positive terms adds up to ~n ulps; both are allowed for, nothing more.
double p_tol(double rel, double s, double m, std::size_t n) {
  return rel * (4.0 + std::abs(s - m) + std::sqrt(static_cast<double>(n)));
}

TEST(Softmax, MatchesLongDoubleReferenceOnRandomInputs) {
  std::mt19937_64 rng(5);
  std::normal_distribution<double> normal;
  for (const int n : {1, 2, 15, 16, 17, 113, 1000, 4097, 65537}) {
    for (const double scale : {1e-3, 1.0, 30.0}) {
      for (const double offset : {0.0, 1e4, -1e4}) {
        if (n == 65537 && offset != 0.0) continue;
        std::vector<float> sf(n);
        for (float& x : sf) x = static_cast<float>(offset + scale * normal(rng));
        const std::vector<double> s(sf.begin(), sf.end());
        const Ref ref = ref_softmax(s);
        const double m = static_cast<double>(*std::max_element(s.begin(), s.end()));
        std::vector<double> pd(n);
        const double lse_d = softmax(std::span<const double>(s), std::span<double>(pd));
        std::vector<float> pf(n);
        const double lse_f = softmax(std::span<const float>(sf), std::span<float>(pf));
        const std::string where = "n=" + std::to_string(n) + " scale=" + std::to_string(scale) +
                                  " offset=" + std::to_string(offset);
        const double lse_tol = 1e-15 * (std::abs(static_cast<double>(ref.lse)) + n);
        EXPECT_NEAR(lse_d, static_cast<double>(ref.lse), lse_tol) << where;
        EXPECT_EQ(lse_f, lse_d) << where;  // same arithmetic in double
        double sum_d = 0, sum_f = 0;
        for (int i = 0; i < n; ++i) {
          const double r = static_cast<double>(ref.p[i]);
          ASSERT_NEAR(pd[i], r, r * p_tol(4e-16, s[i], m, n)) << where << " i=" << i;
          ASSERT_NEAR(pf[i], r, r * p_tol(1.2e-7, 0.0, 0.0, 1) + 3e-45) << where << " i=" << i;
          sum_d += pd[i];
          sum_f += pf[i];
        }
        EXPECT_NEAR(sum_d, 1.0, 1e-12) << where;
        EXPECT_NEAR(sum_f, 1.0, 1e-6) << where;
      }
    }
  }
}

TEST(Softmax, HugeScoresDoNotOverflow) {
  const std::vector<float> s = {1e30f, -1e30f, 0.0f, 1e30f};
  std::vector<float> p(4);
  const double lse = softmax(std::span<const float>(s), std::span<float>(p));
  EXPECT_EQ(p[0], 0.5f);
  EXPECT_EQ(p[1], 0.0f);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_EQ(p[3], 0.5f);
  EXPECT_DOUBLE_EQ(lse, static_cast<double>(1e30f));
}

TEST(Softmax, TinyScoresDoNotUnderflowToNaN) {
  const std::vector<double> s = {-1e30, -1e30};
  std::vector<double> p(2);
  const double lse = softmax(std::span<const double>(s), std::span<double>(p));
  EXPECT_EQ(p[0], 0.5);
  EXPECT_EQ(p[1], 0.5);
  EXPECT_EQ(lse, -1e30 + std::log(2.0));
}

TEST(Softmax, SingleScoreIsCertain) {
  const std::vector<double> s = {-7.25};
  std::vector<double> p(1);
  EXPECT_EQ(softmax(std::span<const double>(s), std::span<double>(p)), -7.25);
  EXPECT_EQ(p[0], 1.0);
}

TEST(Softmax, AllEqualScoresAreUniform) {
  const std::vector<double> s(1000, 3.0);
  std::vector<double> p(s.size());
  EXPECT_NEAR(softmax(std::span<const double>(s), std::span<double>(p)), 3.0 + std::log(1000.0),
              1e-15);
  for (const double x : p) ASSERT_EQ(x, p[0]);
  EXPECT_NEAR(p[0], 1e-3, 1e-18);
}

TEST(SoftmaxErrors, EmptyScoresNameScores) {
  expect_error([] { softmax(std::span<const double>(), std::span<double>()); },
               ErrorCode::invalid_argument, "scores");
}
TEST(SoftmaxErrors, NaNScoreNamesScores) {
  const std::vector<float> s = {0.0f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> p(2);
  expect_error([&] { softmax(std::span<const float>(s), std::span<float>(p)); },
               ErrorCode::non_finite, "scores");
}
TEST(SoftmaxErrors, PositiveInfinityNamesScores) {
  const std::vector<double> s = {0.0, std::numeric_limits<double>::infinity()};
  std::vector<double> p(2);
  expect_error([&] { softmax(std::span<const double>(s), std::span<double>(p)); },
               ErrorCode::non_finite, "scores");
}
TEST(SoftmaxErrors, NegativeInfinityNamesScores) {
  const std::vector<float> s = {-std::numeric_limits<float>::infinity()};
  std::vector<float> p(1);
  expect_error([&] { softmax(std::span<const float>(s), std::span<float>(p)); },
               ErrorCode::non_finite, "scores");
}
TEST(SoftmaxErrors, OutputSizeMismatchNamesP) {
  const std::vector<double> s = {0.0, 1.0};
  std::vector<double> p(3);
  expect_error([&] { softmax(std::span<const double>(s), std::span<double>(p)); },
               ErrorCode::shape_mismatch, "p");
}

}  // namespace
}  // namespace masskv
