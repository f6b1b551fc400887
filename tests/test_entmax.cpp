// alpha-entmax thresholds and probabilities (docs/design.md §2.1) against the entmax authors'
// reference data and against a plain fp64 bisection written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "attn/entmax_solvers.hpp"
#include "expect_error.hpp"
#include "masskv/error.hpp"
#include "masskv/mapping.hpp"

namespace masskv {
namespace {

using masskv::test::expect_error;

using attn::EntmaxSolver;

// ---- plain fp64 reference ------------------------------------------------------------------

double ref_mass(const std::vector<double>& z, double tau, double alpha) {
  double f = 0;
  for (const double zi : z) f += zi > tau ? std::pow(zi - tau, 1.0 / (alpha - 1.0)) : 0.0;
  return f;
}

// 200 rounds of bisection on z - max z over [-1, 0] (docs/design.md §2.1).
double ref_tau(const std::vector<double>& scores, double alpha) {
  std::vector<double> y(scores.size());
  const double z_max = (alpha - 1.0) * *std::max_element(scores.begin(), scores.end());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = (alpha - 1.0) * scores[i] - z_max;
  double lo = -1.0, hi = 0.0;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (ref_mass(y, mid, alpha) >= 1.0 ? lo : hi) = mid;
  }
  return z_max + 0.5 * (lo + hi);
}

double tau_scale(const std::vector<double>& scores, double alpha) {
  double m = 0;
  for (const double s : scores) m = std::max(m, std::abs((alpha - 1.0) * s));
  return std::max(1.0, m);
}

const char* name(EntmaxSolver s) {
  switch (s) {
    case EntmaxSolver::automatic:
      return "automatic";
    case EntmaxSolver::exact_sort:
      return "exact_sort";
    case EntmaxSolver::halley:
      return "halley";
  }
  return "?";
}

// Checks every contract of one solve: bracket certificate, support, zeros, normalisation, tau
// against the reference. `sum_tol`: 1e-12 for double p, 1e-6 for float p.
template <class T>
void check_solution(const std::vector<double>& scores, double alpha, const EntmaxThreshold& th,
                    std::span<const T> p, double tau_ref, double sum_tol,
                    const std::string& where) {
  SCOPED_TRACE(where);
  const double scale = tau_scale(scores, alpha);
  EXPECT_NEAR(th.tau, tau_ref, 1e-12 * scale);
  EXPECT_LE(th.tau_lo, th.tau);
  EXPECT_LE(th.tau, th.tau_hi);
  EXPECT_LE(th.tau_hi - th.tau_lo, 1e-12 * scale) << "bracket too wide for certificates";
  EXPECT_GE(entmax_mass(scores, alpha, th.tau_lo), 1.0);
  EXPECT_LE(entmax_mass(scores, alpha, th.tau_hi), 1.0);
  int support = 0;
  double sum = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const bool in = (alpha - 1.0) * scores[i] > th.tau;
    support += in ? 1 : 0;
    if (!in) {
      ASSERT_EQ(p[i], T(0)) << "outside the support at " << i;
    }
    ASSERT_GE(p[i], T(0));
    sum += static_cast<double>(p[i]);
  }
  EXPECT_EQ(th.support, support);
  EXPECT_GE(th.support, 1);
  EXPECT_NEAR(sum, 1.0, sum_tol);
}

// ---- reference data from the entmax authors -------------------------------------------------

struct RefCase {
  std::string kind;
  double alpha;
  std::vector<double> scores, p;
  double tau;
  int support;
};

const std::vector<RefCase>& reference_cases() {
  static const std::vector<RefCase> cases = [] {
    std::ifstream in(std::string(MASSKV_TEST_DATA) + "/entmax_reference.json");
    EXPECT_TRUE(in.good()) << "missing tests/data/entmax_reference.json";
    const nlohmann::json j = nlohmann::json::parse(in);
    std::vector<RefCase> out;
    for (const auto& c : j.at("cases")) {
      out.push_back({c.at("kind").get<std::string>(), c.at("alpha").get<double>(),
                     c.at("scores").get<std::vector<double>>(),
                     c.at("p").get<std::vector<double>>(), c.at("tau").get<double>(),
                     c.at("support").get<int>()});
    }
    return out;
  }();
  return cases;
}

void check_against_reference(EntmaxSolver solver, bool exact_alphas_only) {
  const auto& cases = reference_cases();
  ASSERT_EQ(cases.size(), 256u);
  int checked = 0;
  for (const RefCase& c : cases) {
    if (exact_alphas_only && c.alpha != 1.5 && c.alpha != 2.0) continue;
    const std::string where = c.kind + " alpha=" + std::to_string(c.alpha) + " " + name(solver);
    std::vector<double> p(c.scores.size(), -1.0);
    const EntmaxThreshold th = attn::entmax_using(std::span<const double>(c.scores), c.alpha,
                                                  solver, std::span<double>(p));
    check_solution<double>(c.scores, c.alpha, th, p, c.tau, 1e-12, where);
    EXPECT_EQ(th.support, c.support) << where;
    for (std::size_t i = 0; i < p.size(); ++i)
      ASSERT_NEAR(p[i], c.p[i], 1e-10) << where << " i=" << i;
    ++checked;
  }
  EXPECT_EQ(checked, exact_alphas_only ? 128 : 256);
}

TEST(EntmaxReference, ExactSortSolversMatchAuthorsCode) {
  check_against_reference(EntmaxSolver::exact_sort, true);
}

TEST(EntmaxReference, HalleySolverMatchesAuthorsCodeForEveryAlpha) {
  check_against_reference(EntmaxSolver::halley, false);
}

TEST(EntmaxReference, AutomaticSolverMatchesAuthorsCode) {
  check_against_reference(EntmaxSolver::automatic, false);
}

// ---- random inputs ---------------------------------------------------------------------------

enum class Dist { gauss_small, gauss_wide, offset_pos, offset_neg, ties, heavy, all_equal };

std::vector<float> make_scores(Dist dist, int n, std::mt19937_64& rng) {
  std::normal_distribution<double> normal;
  std::vector<float> s(n);
  for (int i = 0; i < n; ++i) {
    const double g = normal(rng);
    switch (dist) {
      case Dist::gauss_small:
        s[i] = static_cast<float>(0.3 * g);
        break;
      case Dist::gauss_wide:
        s[i] = static_cast<float>(6.0 * g);
        break;
      case Dist::offset_pos:
        s[i] = static_cast<float>(1e4 + 2.0 * g);
        break;
      case Dist::offset_neg:
        s[i] = static_cast<float>(-1e4 + 2.0 * g);
        break;
      case Dist::ties:
        s[i] = static_cast<float>(std::floor(2.0 * g) * 0.5);
        break;
      case Dist::heavy:
        s[i] = static_cast<float>(g / std::max(1e-3, std::abs(normal(rng))));
        break;
      case Dist::all_equal:
        s[i] = 1.25f;
        break;
    }
  }
  return s;
}

std::string dist_name(Dist d) {
  const char* names[] = {"gauss_small", "gauss_wide", "offset_pos", "offset_neg",
                         "ties",        "heavy",      "all_equal"};
  return names[static_cast<int>(d)];
}

// Every solver, double and float, on one input.
void check_all_solvers(const std::vector<float>& scores_f, double alpha, const std::string& tag) {
  const std::vector<double> scores(scores_f.begin(), scores_f.end());
  const double tau_ref = ref_tau(scores, alpha);
  for (EntmaxSolver solver :
       {EntmaxSolver::automatic, EntmaxSolver::exact_sort, EntmaxSolver::halley}) {
    if (solver == EntmaxSolver::exact_sort && alpha != 1.5 && alpha != 2.0) continue;
    const std::string where = tag + " alpha=" + std::to_string(alpha) + " " + name(solver);
    std::vector<double> pd(scores.size(), -1.0);
    const EntmaxThreshold td =
        attn::entmax_using(std::span<const double>(scores), alpha, solver, std::span<double>(pd));
    check_solution<double>(scores, alpha, td, pd, tau_ref, 1e-12, where + " f64");
    std::vector<float> pf(scores.size(), -1.0f);
    const EntmaxThreshold tf =
        attn::entmax_using(std::span<const float>(scores_f), alpha, solver, std::span<float>(pf));
    check_solution<float>(scores, alpha, tf, pf, tau_ref, 1e-6, where + " f32");
    EXPECT_EQ(tf.tau, td.tau) << where << ": float input widened to double must agree";
    // The threshold-only entry point returns the same result.
    const EntmaxThreshold t_only =
        attn::entmax_threshold_using(std::span<const double>(scores), alpha, solver);
    EXPECT_EQ(t_only.tau, td.tau) << where;
    EXPECT_EQ(t_only.support, td.support) << where;
  }
}

TEST(EntmaxProperty, EverySolverMeetsContractsOnRandomInputs) {
  std::mt19937_64 rng(2024);
  const Dist dists[] = {Dist::gauss_small, Dist::gauss_wide, Dist::offset_pos, Dist::offset_neg,
                        Dist::ties,        Dist::heavy,      Dist::all_equal};
  for (const int n : {1, 2, 15, 16, 17, 113, 1000, 4097}) {
    for (const double alpha : {1.05, 1.25, 1.5, 1.75, 2.0}) {
      for (const Dist dist : dists) {
        if (n == 4097 && dist != Dist::gauss_small && dist != Dist::heavy) continue;
        check_all_solvers(make_scores(dist, n, rng), alpha,
                          dist_name(dist) + " n=" + std::to_string(n));
      }
    }
  }
}

TEST(EntmaxProperty, EverySolverMeetsContractsOnLargeInputs) {
  std::mt19937_64 rng(65537);
  check_all_solvers(make_scores(Dist::gauss_small, 65537, rng), 1.5, "gauss_small n=65537");
  check_all_solvers(make_scores(Dist::gauss_wide, 65537, rng), 1.25, "gauss_wide n=65537");
  check_all_solvers(make_scores(Dist::all_equal, 65537, rng), 2.0, "all_equal n=65537");
}

TEST(EntmaxProperty, RandomAlphasMeetContracts) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> u(1.0, 2.0);
  for (int rep = 0; rep < 40; ++rep) {
    double alpha = u(rng);
    if (alpha == 1.0) alpha = 1.5;
    check_all_solvers(make_scores(rep % 2 ? Dist::gauss_wide : Dist::heavy, 17 + 31 * rep, rng),
                      alpha, "random alpha rep=" + std::to_string(rep));
  }
}

// ---- closed-form cases -----------------------------------------------------------------------

TEST(Entmax, SparsemaxKnownExample) {
  // z = s; tau = (1 + 0.5 - 1) / 2 = 0.25, p = (0.75, 0.25, 0, 0). The last score sits exactly
  // on tau: not in the support.
  const std::vector<double> s = {1.0, 0.5, -1.0, 0.25};
  std::vector<double> p(4);
  for (const EntmaxSolver solver : {EntmaxSolver::exact_sort, EntmaxSolver::halley}) {
    const EntmaxThreshold th =
        attn::entmax_using(std::span<const double>(s), 2.0, solver, std::span<double>(p));
    EXPECT_EQ(th.tau, 0.25) << name(solver);
    EXPECT_EQ(th.support, 2) << name(solver);
    EXPECT_EQ(p[0], 0.75) << name(solver);
    EXPECT_EQ(p[1], 0.25) << name(solver);
    EXPECT_EQ(p[2], 0.0) << name(solver);
    EXPECT_EQ(p[3], 0.0) << name(solver);
  }
}

TEST(Entmax, Entmax15KnownExample) {
  // z = (0.5, 0): (0.5 - tau)^2 + tau^2 = 1 gives tau = (1 - sqrt 7) / 4.
  const std::vector<double> s = {1.0, 0.0};
  std::vector<double> p(2);
  const EntmaxThreshold th = entmax(std::span<const double>(s), 1.5, std::span<double>(p));
  const double tau = (1.0 - std::sqrt(7.0)) / 4.0;
  EXPECT_NEAR(th.tau, tau, 1e-15);
  EXPECT_NEAR(p[0], (0.5 - tau) * (0.5 - tau), 1e-15);
  EXPECT_NEAR(p[1], tau * tau, 1e-15);
}

TEST(Entmax, SingleScoreGetsAllMass) {
  for (const double alpha : {1.1, 1.5, 2.0}) {
    const std::vector<float> s = {-3.5f};
    std::vector<float> p(1);
    const EntmaxThreshold th = entmax(std::span<const float>(s), alpha, std::span<float>(p));
    EXPECT_EQ(p[0], 1.0f);
    EXPECT_EQ(th.support, 1);
    EXPECT_NEAR(th.tau, (alpha - 1.0) * -3.5 - 1.0, 1e-15);
  }
}

TEST(Entmax, AllEqualScoresAreUniform) {
  for (const double alpha : {1.3, 1.5, 2.0}) {
    const std::vector<double> s(1000, 7.0);
    std::vector<double> p(s.size());
    const EntmaxThreshold th = entmax(std::span<const double>(s), alpha, std::span<double>(p));
    EXPECT_EQ(th.support, 1000);
    for (const double x : p) ASSERT_NEAR(x, 1e-3, 1e-15);
  }
}

TEST(Entmax, MassIsZeroAtMaxAndAtLeastOneAtMaxMinusOne) {
  const std::vector<double> s = {0.5, -2.0, 1.5, 1.0};
  for (const double alpha : {1.2, 1.5, 2.0}) {
    const double z_max = (alpha - 1.0) * 1.5;
    EXPECT_EQ(entmax_mass(s, alpha, z_max), 0.0);
    EXPECT_GE(entmax_mass(s, alpha, z_max - 1.0), 1.0);
  }
}

// ---- bad input ---------------------------------------------------------------------------------

const std::vector<double> kGood = {0.1, 0.2, 0.3};

TEST(EntmaxErrors, EmptyScoresNameScores) {
  expect_error([] { entmax_threshold(std::span<const double>(), 1.5); },
               ErrorCode::invalid_argument, "scores");
}
TEST(EntmaxErrors, NaNScoreNamesScores) {
  const std::vector<float> s = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  expect_error([&] { entmax_threshold(std::span<const float>(s), 1.5); }, ErrorCode::non_finite,
               "scores");
}
TEST(EntmaxErrors, InfiniteScoreNamesScores) {
  const std::vector<double> s = {1.0, -std::numeric_limits<double>::infinity()};
  expect_error([&] { entmax_threshold(std::span<const double>(s), 1.25); }, ErrorCode::non_finite,
               "scores");
}
TEST(EntmaxErrors, AlphaOneNamesAlpha) {
  expect_error([] { entmax_threshold(std::span<const double>(kGood), 1.0); },
               ErrorCode::invalid_argument, "alpha");
}
TEST(EntmaxErrors, AlphaAboveTwoNamesAlpha) {
  expect_error([] { entmax_threshold(std::span<const double>(kGood), 2.0000001); },
               ErrorCode::invalid_argument, "alpha");
}
TEST(EntmaxErrors, AlphaNaNNamesAlpha) {
  expect_error([] { entmax_threshold(std::span<const double>(kGood), std::nan("")); },
               ErrorCode::invalid_argument, "alpha");
}
TEST(EntmaxErrors, AlphaInfNamesAlpha) {
  expect_error([] { entmax_mass(kGood, std::numeric_limits<double>::infinity(), 0.0); },
               ErrorCode::invalid_argument, "alpha");
}
TEST(EntmaxErrors, OutputSizeMismatchNamesP) {
  std::vector<double> p(2);
  expect_error([&] { entmax(std::span<const double>(kGood), 1.5, std::span<double>(p)); },
               ErrorCode::shape_mismatch, "p");
}
TEST(EntmaxErrors, FloatOutputSizeMismatchNamesP) {
  const std::vector<float> s = {1.0f, 2.0f};
  std::vector<float> p(3);
  expect_error([&] { entmax(std::span<const float>(s), 2.0, std::span<float>(p)); },
               ErrorCode::shape_mismatch, "p");
}
TEST(EntmaxErrors, ExactSolverRejectsOtherAlphas) {
  expect_error(
      [] {
        attn::entmax_threshold_using(std::span<const double>(kGood), 1.25,
                                     EntmaxSolver::exact_sort);
      },
      ErrorCode::unsupported, "alpha");
}
TEST(EntmaxErrors, MassNaNTauNamesTau) {
  expect_error([] { entmax_mass(kGood, 1.5, std::nan("")); }, ErrorCode::non_finite, "tau");
}
TEST(EntmaxErrors, MassEmptyScoresNamesScores) {
  expect_error([] { entmax_mass({}, 1.5, 0.0); }, ErrorCode::invalid_argument, "scores");
}

TEST(MappingValidate, RejectsAlphaOutsideOneToTwo) {
  for (const double alpha :
       {1.0, 0.5, 2.5, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    expect_error([&] { Mapping::entmax(alpha).validate(); }, ErrorCode::invalid_argument, "alpha");
  }
}
TEST(MappingValidate, AcceptsEntmaxAlphasAndIgnoresAlphaForSoftmax) {
  EXPECT_NO_THROW(Mapping::entmax(2.0).validate());
  EXPECT_NO_THROW(Mapping::entmax(1.0000001).validate());
  EXPECT_NO_THROW(Mapping::entmax(1.5).validate());
  EXPECT_NO_THROW(Mapping::softmax().validate());
  EXPECT_NO_THROW((Mapping{Mapping::Kind::softmax, std::nan("")}.validate()));
}

}  // namespace
}  // namespace masskv
