// alpha-entmax threshold solvers (docs/design.md §2.1).
//
// Pipeline, all in double on z = (alpha-1)*s:
//  1. validate, find z_max; gather the candidates z_i > c with c <= z_max - 1 (tau >= z_max - 1,
//     so nothing else can be in the support). The working set keeps index order.
//  2. solve on y = z - z_max (values in (-1, 0], so no cancellation against large offsets):
//     safeguarded Halley for any alpha; every lower bracket end it finds cuts the working set.
//     For alpha = 2 and 1.5 the exact sort-based closed form then runs on what is left (about
//     the support), so the sort is short.
//  3. finalize: tau_lo / tau_hi are checked with the same floating point evaluation of f that
//     entmax_mass() performs, and moved outwards until f(tau_lo) >= 1 >= f(tau_hi) holds.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "attn/entmax_solvers.hpp"
#include "masskv/error.hpp"
#include "masskv/mapping.hpp"

namespace masskv {
namespace {

using attn::EntmaxSolver;

// Solver lower bounds are lowered by this much (in z units, where the bracket is [-1, 0])
// before the working set is cut, so floating point overshoot of a Newton step can never drop
// a support element.
constexpr double kCutSlack = 1e-9;
// Halley stops once a step is this small (z - z_max lies in [-1, 0]).
constexpr double kStepTol = 4e-16;

// t^{1/(alpha-1)} for t > 0. Sparsemax, 1.5-entmax and alpha = 1 + 1/k (integer exponents up
// to 8, e.g. alpha = 1.25) use products instead of std::pow, which dominates the solver's cost.
class Power {
 public:
  explicit Power(double alpha) : exponent_(1.0 / (alpha - 1.0)) {
    if (exponent_ == std::floor(exponent_) && exponent_ <= 8.0) {
      integer_ = static_cast<int>(exponent_);
    }
  }
  double operator()(double t) const {
    return integer_ > 0 ? ipow(t, integer_) : std::pow(t, exponent_);
  }
  // t^{exponent - 1}, for derivatives.
  double lowered(double t) const {
    return integer_ > 0 ? ipow(t, integer_ - 1) : std::pow(t, exponent_ - 1.0);
  }
  double exponent() const { return exponent_; }

 private:
  static double ipow(double t, int k) {
    double r = 1.0;
    for (int i = 0; i < k; ++i) r *= t;
    return r;
  }
  double exponent_;
  int integer_ = 0;  // > 0: the exponent is this integer
};

// The one floating point evaluation of f(tau) (docs/design.md §2.1). Terms with z <= tau are
// exactly 0, so summing only a subset that holds every z > tau, in index order, gives the same bits
// as summing all of them.
double mass_of(const double* z, std::size_t n, double tau, const Power& power) {
  double f = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const double t = z[i] - tau;
    if (t > 0) f += power(t);
  }
  return f;
}

void check_alpha(double alpha) { Mapping::entmax(alpha).validate(); }

// Integer images of IEEE floats that order like the floats (sign-magnitude to two's
// complement). Integer max and exponent tests vectorise without fast-math flags, which the
// float compare-select forms do not.
template <class T>
struct OrderedBits;
template <>
struct OrderedBits<float> {
  using U = std::uint32_t;
  using S = std::int32_t;
  static constexpr U kExponent = 0x7f800000u;
  static constexpr U kMagnitude = 0x7fffffffu;
  static constexpr int kSignShift = 31;
};
template <>
struct OrderedBits<double> {
  using U = std::uint64_t;
  using S = std::int64_t;
  static constexpr U kExponent = 0x7ff0000000000000ull;
  static constexpr U kMagnitude = 0x7fffffffffffffffull;
  static constexpr int kSignShift = 63;
};

// Max of the scores, rejecting NaN / inf (exponent field all ones).
template <class T>
double checked_max(std::span<const T> scores) {
  using B = OrderedBits<T>;
  using U = typename B::U;
  using S = typename B::S;
  require(!scores.empty(), ErrorCode::invalid_argument, "scores", "must not be empty");
  require(scores.size() <= static_cast<std::size_t>(std::numeric_limits<int>::max()),
          ErrorCode::invalid_argument, "scores", "has more than 2^31-1 entries");
  S key_max = std::numeric_limits<S>::min();
  U non_finite = 0;
  for (const T x : scores) {
    const U bits = std::bit_cast<U>(x);
    non_finite += (bits & B::kExponent) == B::kExponent ? 1 : 0;
    const U flip = static_cast<U>(static_cast<S>(bits) >> B::kSignShift) & B::kMagnitude;
    const S key = static_cast<S>(bits ^ flip);
    key_max = key > key_max ? key : key_max;
  }
  require(non_finite == 0, ErrorCode::non_finite, "scores", "contains NaN or inf");
  const U flip = static_cast<U>(key_max >> B::kSignShift) & B::kMagnitude;
  return static_cast<double>(std::bit_cast<T>(static_cast<U>(static_cast<U>(key_max) ^ flip)));
}

// The largest T not above x (x finite or -inf), for screening in the scores' own type.
template <class T>
T round_down(double x) {
  if (x < static_cast<double>(std::numeric_limits<T>::lowest())) {
    return -std::numeric_limits<T>::infinity();
  }
  T t = static_cast<T>(x);
  if (static_cast<double>(t) > x) t = std::nextafter(t, -std::numeric_limits<T>::infinity());
  return t;
}

// Candidates z_i > cut, in index order, with their indices (to write p).
struct WorkingSet {
  std::vector<double> z;
  std::vector<std::uint32_t> index;
  std::vector<double> sorted;  // scratch for the exact solvers
  double floor = 0;            // every dropped z_i is <= floor

  template <class T>
  void gather(std::span<const T> scores, double alpha_minus_1, double cut) {
    z.clear();
    index.clear();
    floor = cut;
    // Most scores are far below the cut: screen blocks in score units with a margin that
    // cannot reject any z_i > cut, and test exactly only inside blocks that pass.
    const double cut_s = cut / alpha_minus_1;
    const T screen = round_down<T>(cut_s - (std::abs(cut_s) * 1e-12 + 1e-300));
    constexpr std::size_t kBlock = 64;
    const std::size_t n = scores.size();
    for (std::size_t b = 0; b < n; b += kBlock) {
      const std::size_t e = std::min(n, b + kBlock);
      int hits = 0;
      for (std::size_t i = b; i < e; ++i) hits += scores[i] > screen ? 1 : 0;
      if (hits == 0) continue;
      for (std::size_t i = b; i < e; ++i) {
        const double zi = alpha_minus_1 * static_cast<double>(scores[i]);
        if (zi > cut) {
          z.push_back(zi);
          index.push_back(static_cast<std::uint32_t>(i));
        }
      }
    }
  }
  // Drops z_i <= cut (stable, so index order is kept).
  void shrink(double cut) {
    if (cut <= floor) return;
    std::size_t k = 0;
    for (std::size_t i = 0; i < z.size(); ++i) {
      if (z[i] > cut) {
        z[k] = z[i];
        index[k] = index[i];
        ++k;
      }
    }
    z.resize(k);
    index.resize(k);
    floor = cut;
  }
  double mass(double tau, const Power& power) const {
    return mass_of(z.data(), z.size(), tau, power);
  }
};

thread_local WorkingSet tls_work;

// Largest c <= z_max - 1 with z_max - c >= 1 in floating point: the top score alone then gives
// f(c) >= 1 in the evaluation of mass_of, which makes c a proven lower end of the bracket.
double proven_floor(double z_max) {
  double c = z_max - 1.0;
  while (!(z_max - c >= 1.0)) c = std::nextafter(c, -std::numeric_limits<double>::infinity());
  return c;
}

// Exact thresholds on sorted prefixes; returns tau on y = z - z_max.
double solve_sorted(WorkingSet& w, double z_max, double alpha) {
  std::vector<double>& y = w.sorted;
  y.resize(w.z.size());
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = w.z[i] - z_max;
  std::sort(y.begin(), y.end(), std::greater<double>());
  double tau = y[0] - 1.0;
  if (alpha == 2.0) {
    // Sparsemax: support is the largest k with y_k > (S_k - 1) / k, tau = (S_k - 1) / k.
    double sum = 0;
    for (std::size_t k = 1; k <= y.size(); ++k) {
      sum += y[k - 1];
      const double t = (sum - 1.0) / static_cast<double>(k);
      if (y[k - 1] > t) tau = t;
    }
    return tau;
  }
  // 1.5-entmax (Peters, Niculae & Martins 2019): on the top-k prefix sum (y_j - tau)^2 = 1
  // gives tau_k = mean_k - sqrt((1 - M2_k) / k), M2_k = sum (y_j - mean_k)^2 (Welford, so no
  // cancellation); support is the largest k with tau_k < y_k. M2 only grows with k, so once
  // it passes 1 no larger prefix has a root.
  double mean = 0, m2 = 0;
  for (std::size_t k = 1; k <= y.size(); ++k) {
    const double x = y[k - 1];
    const double delta = x - mean;
    mean += delta / static_cast<double>(k);
    m2 += delta * (x - mean);
    if (m2 > 1.0) break;
    const double t = mean - std::sqrt((1.0 - m2) / static_cast<double>(k));
    if (t < x) tau = t;
  }
  return tau;
}

struct Estimate {
  double tau;     // on y = z - z_max
  double spread;  // how far from the root tau may be (for the first probe)
};

// Safeguarded Halley on g(tau) = f(tau) - 1 inside the bracket [lo, hi] on y = z - z_max
// (docs/design.md §2.1). Every evaluation narrows the bracket; a step that leaves it or fails to
// halve the previous step is replaced by bisection.
Estimate solve_halley(WorkingSet& w, double z_max, double alpha) {
  const Power power(alpha);
  const double p = power.exponent();
  double lo = -1.0;
  double hi = -std::pow(static_cast<double>(w.z.size()), 1.0 - alpha);
  if (!(hi > lo)) return {lo, 0.0};
  double tau = lo;
  double prev_step = hi - lo;
  bool bisect_next = false;
  for (int iter = 0; iter < 400; ++iter) {
    double g = -1.0, d1 = 0, d2 = 0;
    for (const double z : w.z) {
      const double t = (z - z_max) - tau;
      if (t > 0) {
        const double tp = power.lowered(t);
        g += tp * t;
        d1 -= p * tp;
        d2 += p * (p - 1.0) * (tp / t);
      }
    }
    if (g == 0) return {tau, 0.0};
    if (g > 0) {
      lo = tau;
      w.shrink(z_max + (lo - kCutSlack));
    } else {
      hi = tau;
    }
    if (!(hi - lo > kStepTol)) return {tau, hi - lo};
    const double newton = d1 < 0 ? -g / d1 : std::numeric_limits<double>::infinity();
    if (std::abs(newton) <= kStepTol) return {tau + newton, 2.0 * std::abs(newton)};
    double next = 0.5 * (lo + hi);
    if (!bisect_next && std::isfinite(newton)) {
      const double denom = 1.0 - g * d2 / (2.0 * d1 * d1);
      const double candidate = tau + (denom > 0.5 && denom < 2.0 ? newton / denom : newton);
      if (candidate > lo && candidate <= hi) next = candidate;
    }
    const double step = std::abs(next - tau);
    bisect_next = step > 0.5 * prev_step;
    prev_step = step;
    tau = next;
  }
  return {tau, hi - lo};
}

double ulp_of(double x) {
  x = std::abs(x);
  return std::nextafter(x, std::numeric_limits<double>::infinity()) - x;
}

// Moves tau_lo down / tau_hi up from the estimate until f(tau_lo) >= 1 >= f(tau_hi) holds in
// mass_of's evaluation. Should a probe go below the working set's floor, the set is rebuilt
// from all scores down to the proven floor c, where f(c) >= 1 always holds.
template <class T>
EntmaxThreshold finalize(WorkingSet& w, std::span<const T> scores, double alpha, double z_max,
                         double c, Estimate est) {
  const Power power(alpha);
  const double tau = std::clamp(z_max + est.tau, w.floor, z_max);
  const double first_probe = std::max({est.spread, 4.0 * ulp_of(tau), 4.0 * ulp_of(z_max), 1e-300});
  const double f_tau = w.mass(tau, power);

  double lo = tau;
  for (double step = first_probe; !(f_tau >= 1.0); step *= 8.0) {
    const double probe = tau - step;
    if (probe <= w.floor) {
      if (w.floor > c) {
        w.gather(scores, alpha - 1.0, c);
        step /= 8.0;  // retry this probe on the full candidate set
        continue;
      }
      lo = c;  // f(c) >= 1 by construction of c
      break;
    }
    if (w.mass(probe, power) >= 1.0) {
      lo = probe;
      break;
    }
  }
  double hi = tau;
  for (double step = first_probe; !(f_tau <= 1.0); step *= 8.0) {
    const double probe = tau + step;
    if (probe >= z_max) {
      hi = z_max;  // f(z_max) = 0
      break;
    }
    if (w.mass(probe, power) <= 1.0) {
      hi = probe;
      break;
    }
  }
  int support = 0;
  for (const double z : w.z) support += z > tau ? 1 : 0;
  return {tau, lo, hi, support};
}

template <class T>
EntmaxThreshold solve(std::span<const T> scores, double alpha, EntmaxSolver solver) {
  check_alpha(alpha);
  const bool exact_alpha = alpha == 2.0 || alpha == 1.5;
  require(solver != EntmaxSolver::exact_sort || exact_alpha, ErrorCode::unsupported, "alpha",
          "the exact sort-based solver exists only for alpha = 1.5 and 2, got ", alpha);
  const double alpha_minus_1 = alpha - 1.0;
  const double z_max = alpha_minus_1 * checked_max(scores);
  const double c = proven_floor(z_max);
  WorkingSet& w = tls_work;
  w.gather(scores, alpha_minus_1, c);
  Estimate est{};
  if (solver == EntmaxSolver::halley || !exact_alpha) {
    est = solve_halley(w, z_max, alpha);
  } else {
    // Halley first: it cuts the working set down to about the support, so the sort is short;
    // then the closed form on sorted prefixes gives the exact threshold.
    solve_halley(w, z_max, alpha);
    est = {solve_sorted(w, z_max, alpha), 0.0};
  }
  return finalize(w, scores, alpha, z_max, c, est);
}

template <class T>
EntmaxThreshold solve_and_write(std::span<const T> scores, double alpha, EntmaxSolver solver,
                                std::span<T> p) {
  require(p.size() == scores.size(), ErrorCode::shape_mismatch, "p", "has ", p.size(),
          " entries but scores has ", scores.size());
  const EntmaxThreshold th = solve(scores, alpha, solver);
  // The working set holds every z_i > tau in index order (finalize keeps it so).
  const WorkingSet& w = tls_work;
  const Power power(alpha);
  const double sum = w.mass(th.tau, power);
  std::fill(p.begin(), p.end(), T(0));
  for (std::size_t k = 0; k < w.z.size(); ++k) {
    const double t = w.z[k] - th.tau;
    if (t > 0) p[w.index[k]] = static_cast<T>(power(t) / sum);  // normalise: §2.1
  }
  return th;
}

}  // namespace

EntmaxThreshold entmax_threshold(std::span<const float> scores, double alpha) {
  return solve(scores, alpha, EntmaxSolver::automatic);
}
EntmaxThreshold entmax_threshold(std::span<const double> scores, double alpha) {
  return solve(scores, alpha, EntmaxSolver::automatic);
}
EntmaxThreshold entmax(std::span<const float> scores, double alpha, std::span<float> p) {
  return solve_and_write(scores, alpha, EntmaxSolver::automatic, p);
}
EntmaxThreshold entmax(std::span<const double> scores, double alpha, std::span<double> p) {
  return solve_and_write(scores, alpha, EntmaxSolver::automatic, p);
}

double entmax_mass(std::span<const double> scores, double alpha, double tau) {
  check_alpha(alpha);
  checked_max(scores);
  require(std::isfinite(tau), ErrorCode::non_finite, "tau", "must be finite, got ", tau);
  const Power power(alpha);
  double f = 0;
  for (const double s : scores) {
    const double z = (alpha - 1.0) * s;
    f += mass_of(&z, 1, tau, power);
  }
  return f;
}

namespace attn {
EntmaxThreshold entmax_threshold_using(std::span<const float> scores, double alpha,
                                       EntmaxSolver solver) {
  return solve(scores, alpha, solver);
}
EntmaxThreshold entmax_threshold_using(std::span<const double> scores, double alpha,
                                       EntmaxSolver solver) {
  return solve(scores, alpha, solver);
}
EntmaxThreshold entmax_using(std::span<const float> scores, double alpha, EntmaxSolver solver,
                             std::span<float> p) {
  return solve_and_write(scores, alpha, solver, p);
}
EntmaxThreshold entmax_using(std::span<const double> scores, double alpha, EntmaxSolver solver,
                             std::span<double> p) {
  return solve_and_write(scores, alpha, solver, p);
}
}  // namespace attn

}  // namespace masskv
