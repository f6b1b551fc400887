// The §2.4 Gaussian page model of the entmax threshold, evaluated for many pages at once:
// tau_hat solving sum_j n_j E_j(tau) = 1 and the per-page masses n_j E_j(tau_hat).
// E_j(tau) = E[(Y_j - tau)_+^r], Y_j ~ N(a_j, b_j²), a_j = (alpha-1) m_j, b_j = (alpha-1)
// sqrt(v_j), r = 1/(alpha-1) (closed forms for alpha 2 and 1.5, quadrature otherwise).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "select/gaussian_kernels.hpp"

namespace masskv::select::detail {

class GaussianPages {
 public:
  // Throws Error naming "m" (shapes) or "alpha", or "n" when no page has a positive count
  // and finite statistics.
  void assign(std::span<const double> m, std::span<const double> v, std::span<const double> n,
              double alpha);
  // tau_hat by Newton steps on the convex, decreasing f(tau) = sum_j n_j E_j(tau), kept in
  // the bracket [max_j a_j - 1, max_j (a_j + 40 b_j + 1)] (bisection when a step leaves it).
  double solve();
  // out[j] = n_j E_j(tau) for every page given to assign() (0 where n_j <= 0).
  void masses(double tau, std::span<double> out) const;
  int evaluations() const { return evaluations_; }

 private:
  // f and f' at tau over the live pages.
  void evaluate(double tau, double& f, double& df);
  // Drops pages whose every term is exactly 0 at all tau >= lo.
  void cull(double lo);

  double alpha_ = 1.5, lo_ = 0, hi_ = 0, culled_at_ = 0;
  int kind_ = 0;  // 2: alpha = 2, 1: alpha = 1.5, 0: quadrature
  int evaluations_ = 0;
  std::size_t size_ = 0;
  // Live pages with b > 0, and with b == 0 (point masses), with their indices in assign().
  std::vector<double> a_, b_, n_, pa_, pn_;
  std::vector<std::int32_t> idx_, pidx_;
};

}  // namespace masskv::select::detail
