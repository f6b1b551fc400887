// Gaussian page model of the entmax threshold (docs/design.md §2.4).
//
// Cost: tau_hat needs f(tau) = sum_j n_j E_j(tau) over every page at each step of the solve.
// f is convex and decreasing (each (y - tau)_+^r with r >= 1 is), so Newton steps from the
// bracket's lower end stay below the root and converge quadratically: 5-12 evaluations of f
// instead of the ~35 a bisection to the same tolerance takes. Each evaluation is one
// vectorised pass (AVX2, glibc's libmvec erfc/exp) over the pages still able to contribute.
#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "core/cpu_features.hpp"
#include "masskv/error.hpp"
#include "masskv/select/selector.hpp"
#include "select/gaussian_model.hpp"
#include "select/vec_math.hpp"

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

// Pages whose standardised distance below tau exceeds this contribute exactly 0: the closed
// forms' erfc(t/√2) and exp(-t²/2) underflow to 0 beyond t = 38.6, the quadrature stops at 14.
constexpr double kClosedCull = 40.0;
constexpr double kQuadratureCull = 14.0;

bool closed_form_avx2() {
#ifdef MASSKV_HAVE_LIBMVEC
  return cpu::has_avx2() && cpu::simd_allowed();
#else
  return false;
#endif
}

// E[(Y - tau)_+^r] of Y ~ N(a, b²), r = 1/(alpha-1).
double mass_ab(double a, double b, double alpha, double tau) {
  const double r = 1.0 / (alpha - 1.0);
  const double d = a - tau;
  if (b <= 0 || b < 1e-12 * std::fabs(d)) return d > 0 ? std::pow(d, r) : 0.0;
  const double t = d / b;
  if (alpha == 2.0) return d * Phi(t) + b * phi(t);
  if (alpha == 1.5) return (d * d + b * b) * Phi(t) + d * b * phi(t);
  return quadrature_mass(a, b, tau, r);
}

}  // namespace

double gaussian_entmax_mass(double m, double v, double alpha, double tau) {
  // Y = (alpha-1) X ~ N(a, b^2): a = (alpha-1) m, b = (alpha-1) sqrt(v) (§2.4).
  const double am1 = alpha - 1.0;
  return mass_ab(am1 * m, am1 * std::sqrt(std::max(v, 0.0)), alpha, tau);
}

namespace detail {

void exp_inplace(double* x, std::size_t n) {
  std::size_t vec = 0;
  if (closed_form_avx2()) {
    vec = n - n % 4;
    exp_inplace_avx2(x, vec);
  }
  for (std::size_t j = vec; j < n; ++j) x[j] = std::exp(x[j]);
}

void gaussian_sums_portable(const double* a, const double* b, const double* n, std::size_t count,
                            int kind, double tau, double& f, double& df) {
  for (std::size_t j = 0; j < count; ++j) {
    const double d = a[j] - tau, t = d / b[j];
    const double P = Phi(t), p = phi(t);
    const double first = d * P + b[j] * p;  // E[(Y - tau)_+]
    if (kind == 2) {
      f += n[j] * first;
      df -= n[j] * P;
    } else {
      f += n[j] * ((d * d + b[j] * b[j]) * P + d * b[j] * p);
      df -= n[j] * 2.0 * first;
    }
  }
}

void gaussian_masses_portable(const double* a, const double* b, const double* n,
                              std::size_t count, int kind, double tau, double* out) {
  for (std::size_t j = 0; j < count; ++j) {
    const double d = a[j] - tau, t = d / b[j];
    const double P = Phi(t), p = phi(t);
    out[j] = n[j] * (kind == 2 ? d * P + b[j] * p : (d * d + b[j] * b[j]) * P + d * b[j] * p);
  }
}

void GaussianPages::assign(std::span<const double> m, std::span<const double> v,
                           std::span<const double> n, double alpha) {
  using enum ErrorCode;
  require(!m.empty() && m.size() == v.size() && m.size() == n.size(), shape_mismatch, "m",
          "page means, variances and counts must be non-empty and of one length");
  require(alpha > 1.0 && alpha <= 2.0, invalid_argument, "alpha", "must be in (1, 2], got ", alpha);
  alpha_ = alpha;
  kind_ = alpha == 2.0 ? 2 : (alpha == 1.5 ? 1 : 0);
  evaluations_ = 0;
  size_ = m.size();
  a_.clear();
  b_.clear();
  n_.clear();
  idx_.clear();
  pa_.clear();
  pn_.clear();
  pidx_.clear();
  // Lower end: by Jensen (r >= 1) E[(Y - tau)_+^r] >= (a - tau)_+^r, so at tau = max a - 1 the
  // page with the largest mean alone has mass >= n_j >= 1. Upper end: beyond every mean by
  // 40 sd (and by 1) the total is negligible.
  double lo = -std::numeric_limits<double>::infinity(), hi = lo;
  const double am1 = alpha - 1.0;
  for (std::size_t j = 0; j < m.size(); ++j) {
    if (!(n[j] > 0)) continue;
    const double a = am1 * m[j], b = am1 * std::sqrt(std::max(v[j], 0.0));
    lo = std::max(lo, a - 1.0);
    hi = std::max(hi, a + 40.0 * b + 1.0);
    if (b > 0) {
      a_.push_back(a);
      b_.push_back(b);
      n_.push_back(n[j]);
      idx_.push_back(static_cast<std::int32_t>(j));
    } else {
      pa_.push_back(a);
      pn_.push_back(n[j]);
      pidx_.push_back(static_cast<std::int32_t>(j));
    }
  }
  require(std::isfinite(lo) && std::isfinite(hi), invalid_argument, "n",
          "no page with a positive count and finite statistics");
  lo_ = lo;
  hi_ = hi;
  cull(lo_);
}

namespace {

// Keeps, in order, the entries j of every array for which keep(j) holds.
template <class Keep, class... Arrays>
void keep_if(Keep keep, Arrays&... arrays) {
  const std::size_t n = std::get<0>(std::tie(arrays...)).size();
  std::size_t k = 0;
  for (std::size_t j = 0; j < n; ++j) {
    if (keep(j)) {
      ((arrays[k] = arrays[j]), ...);
      ++k;
    }
  }
  (arrays.resize(k), ...);
}

}  // namespace

void GaussianPages::cull(double lo) {
  culled_at_ = lo;
  const double limit = kind_ == 0 ? kQuadratureCull : kClosedCull;
  keep_if([&](std::size_t j) { return a_[j] - lo >= -limit * b_[j]; }, a_, b_, n_, idx_);
  keep_if([&](std::size_t j) { return pa_[j] > lo; }, pa_, pn_, pidx_);
}

void GaussianPages::evaluate(double tau, double& f, double& df) {
  ++evaluations_;
  f = 0;
  df = 0;
  const double r = 1.0 / (alpha_ - 1.0);
  // Point masses (b = 0): (a - tau)_+^r, slope -r (a - tau)_+^(r-1).
  for (std::size_t j = 0; j < pa_.size(); ++j) {
    const double d = pa_[j] - tau;
    if (d > 0) {
      f += pn_[j] * std::pow(d, r);
      df -= pn_[j] * r * std::pow(d, r - 1.0);
    }
  }
  const std::size_t count = a_.size();
  if (kind_ == 0) {  // quadrature: the slope is -r E[(Y - tau)_+^(r-1)]
    for (std::size_t j = 0; j < count; ++j) {
      const double d = a_[j] - tau;
      if (b_[j] < 1e-12 * std::fabs(d)) {
        if (d > 0) {
          f += n_[j] * std::pow(d, r);
          df -= n_[j] * r * std::pow(d, r - 1.0);
        }
        continue;
      }
      f += n_[j] * quadrature_mass(a_[j], b_[j], tau, r);
      df -= n_[j] * r * quadrature_mass(a_[j], b_[j], tau, r - 1.0);
    }
    return;
  }
  std::size_t vec = 0;
  if (closed_form_avx2()) {
    vec = count - count % 4;
    gaussian_sums_avx2(a_.data(), b_.data(), n_.data(), vec, kind_, tau, f, df);
  }
  gaussian_sums_portable(a_.data() + vec, b_.data() + vec, n_.data() + vec, count - vec, kind_,
                         tau, f, df);
}

double GaussianPages::solve() {
  // Newton on h = f^(1/r) - 1 rather than on f - 1: h is the L_r norm of (Y - tau)_+ over the
  // page mixture, still convex and decreasing in tau (so steps from the left stay left of the
  // root), and close to linear: one step is exact for a single point mass, where Newton on f
  // itself only halves the distance per step while far from the root (r = 2).
  const double r = 1.0 / (alpha_ - 1.0);
  double lo = lo_, hi = hi_, x = lo_;
  const auto tol = [](double at) { return 1e-10 * std::max(1.0, std::fabs(at)); };
  for (int it = 0; it < 200; ++it) {
    double f = 0, df = 0;
    evaluate(x, f, df);
    if (f >= 1.0) {
      lo = x;
      // Culling is a pass of its own: worth it while lo still moves by whole units.
      if (lo - culled_at_ > 0.25) cull(lo);
    } else {
      hi = x;
    }
    if (f == 1.0) return x;
    double step = std::numeric_limits<double>::quiet_NaN();
    if (f > 0 && df < 0) {
      const double h = r == 1.0 ? f : std::pow(f, 1.0 / r);
      step = -(h - 1.0) / (h / (r * f) * df);  // h' = h f' / (r f)
    }
    if (std::fabs(step) <= tol(x)) return x + step;
    double next = x + step;
    if (!(next > lo && next < hi)) next = 0.5 * (lo + hi);
    if (hi - lo <= tol(lo)) return next;
    x = next;
  }
  return 0.5 * (lo + hi);
}

void GaussianPages::masses(double tau, std::span<double> out) const {
  std::fill(out.begin(), out.end(), 0.0);
  const double r = 1.0 / (alpha_ - 1.0);
  for (std::size_t j = 0; j < pa_.size(); ++j) {
    const double d = pa_[j] - tau;
    out[static_cast<std::size_t>(pidx_[j])] = d > 0 ? pn_[j] * std::pow(d, r) : 0.0;
  }
  const std::size_t count = a_.size();
  if (kind_ == 0) {
    for (std::size_t j = 0; j < count; ++j) {
      out[static_cast<std::size_t>(idx_[j])] = n_[j] * mass_ab(a_[j], b_[j], alpha_, tau);
    }
    return;
  }
  thread_local std::vector<double> w;
  w.resize(count);
  std::size_t vec = 0;
  if (closed_form_avx2()) {
    vec = count - count % 4;
    gaussian_masses_avx2(a_.data(), b_.data(), n_.data(), vec, kind_, tau, w.data());
  }
  gaussian_masses_portable(a_.data() + vec, b_.data() + vec, n_.data() + vec, count - vec, kind_,
                           tau, w.data() + vec);
  for (std::size_t j = 0; j < count; ++j) out[static_cast<std::size_t>(idx_[j])] = w[j];
}

}  // namespace detail

double gaussian_tau_hat(std::span<const double> m, std::span<const double> v,
                        std::span<const double> n, double alpha) {
  thread_local detail::GaussianPages pages;
  pages.assign(m, v, n, alpha);
  return pages.solve();
}

}  // namespace masskv::select
