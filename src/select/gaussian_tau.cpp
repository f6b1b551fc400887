// Gaussian page model of the entmax threshold (DESIGN.md §2.4).
#include <algorithm>
#include <cmath>
#include <limits>

#include "masskv/error.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::select {

namespace {

constexpr double kInvSqrt2 = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;

double Phi(double t) { return 0.5 * std::erfc(-t * kInvSqrt2); }
double phi(double t) { return kInvSqrt2Pi * std::exp(-0.5 * t * t); }

// E[(a + bZ - tau)_+^r] for r = 1/(alpha-1) not 1 or 2, by composite Simpson. Above the kink
// z = t0 = (tau-a)/b the substitution z = t0 + u^2 makes the integrand (b u^2)^r φ(t0 + u^2) 2u
// smooth, so Simpson keeps its h^4 order; the range ends 14 sd out (tail weight < 1e-40).
double quadrature_mass(double a, double b, double tau, double r) {
  const double t0 = (tau - a) / b;
  constexpr int kIntervals = 256;  // even
  if (t0 >= 14.0) return 0.0;
  const bool substitute = t0 > -14.0;
  const double lo = substitute ? 0.0 : -14.0, hi = substitute ? std::sqrt(14.0 - t0) : 14.0;
  const double h = (hi - lo) / kIntervals;
  double sum = 0;
  for (int i = 0; i <= kIntervals; ++i) {
    const double x = lo + i * h;
    double f = 0;
    if (substitute) {
      f = x > 0 ? std::pow(b * x * x, r) * phi(t0 + x * x) * 2.0 * x : 0.0;
    } else {
      f = std::pow(b * (x - t0), r) * phi(x);
    }
    sum += f * (i == 0 || i == kIntervals ? 1.0 : (i % 2 ? 4.0 : 2.0));
  }
  return sum * h / 3.0;
}

}  // namespace

double gaussian_entmax_mass(double m, double v, double alpha, double tau) {
  // Y = (alpha-1) X ~ N(a, b^2): a = (alpha-1) m, b = (alpha-1) sqrt(v) (§2.4).
  const double am1 = alpha - 1.0;
  const double a = am1 * m, b = am1 * std::sqrt(std::max(v, 0.0));
  const double r = 1.0 / am1;
  const double d = a - tau;
  if (b <= 0 || b < 1e-12 * std::fabs(d)) return d > 0 ? std::pow(d, r) : 0.0;
  const double t = d / b;
  if (alpha == 2.0) return d * Phi(t) + b * phi(t);
  if (alpha == 1.5) return (d * d + b * b) * Phi(t) + d * b * phi(t);
  return quadrature_mass(a, b, tau, r);
}

double gaussian_tau_hat(std::span<const double> m, std::span<const double> v,
                        std::span<const double> n, double alpha) {
  using enum ErrorCode;
  require(!m.empty() && m.size() == v.size() && m.size() == n.size(), shape_mismatch, "m",
          "page means, variances and counts must be non-empty and of one length");
  require(alpha > 1.0 && alpha <= 2.0, invalid_argument, "alpha", "must be in (1, 2], got ", alpha);
  auto total = [&](double tau) {
    double s = 0;
    for (std::size_t j = 0; j < m.size(); ++j) {
      if (n[j] > 0) s += n[j] * gaussian_entmax_mass(m[j], v[j], alpha, tau);
    }
    return s;
  };
  // Lower end: by Jensen (r >= 1) E[(Y - tau)_+^r] >= (a - tau)_+^r, so at tau = max a - 1 the
  // page with the largest mean alone has mass >= n_j >= 1. Upper end: beyond every mean by
  // 40 sd (and by 1) the total is negligible.
  double lo = -std::numeric_limits<double>::infinity(), hi = lo;
  for (std::size_t j = 0; j < m.size(); ++j) {
    if (n[j] <= 0) continue;
    const double a = (alpha - 1.0) * m[j], b = (alpha - 1.0) * std::sqrt(std::max(v[j], 0.0));
    lo = std::max(lo, a - 1.0);
    hi = std::max(hi, a + 40.0 * b + 1.0);
  }
  require(std::isfinite(lo) && std::isfinite(hi), invalid_argument, "n",
          "no page with a positive count and finite statistics");
  for (int it = 0; it < 200 && hi - lo > 1e-8 * std::max(1.0, std::fabs(lo)); ++it) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) >= 1.0 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

}  // namespace masskv::select
