#include "attn/reference_mapping.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace masskv::attn::detail {

std::vector<double> ref_rows(std::span<const void* const> rows, DType dtype, int d) {
  std::vector<double> out(rows.size() * d);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    double* o = out.data() + r * d;
    for (int c = 0; c < d; ++c) {
      switch (dtype) {
        case DType::f16:
          o[c] = f16_to_f32(static_cast<const f16*>(rows[r])[c]);
          break;
        case DType::bf16:
          o[c] = bf16_to_f32(static_cast<const bf16*>(rows[r])[c]);
          break;
        case DType::f32:
          o[c] = static_cast<const float*>(rows[r])[c];
          break;
      }
    }
  }
  return out;
}

double ref_dot(const double* q, const double* k, int d) {
  double s = 0;
  for (int c = 0; c < d; ++c) s += q[c] * k[c];
  return s;
}

namespace {
double power(double t, double alpha) { return t > 0 ? std::pow(t, 1.0 / (alpha - 1.0)) : 0.0; }
}  // namespace

double ref_entmax_tau(std::span<const double> s, double alpha) {
  double zmax = -std::numeric_limits<double>::infinity();
  std::size_t n = 0;
  for (double x : s) {
    if (x == -std::numeric_limits<double>::infinity()) continue;
    zmax = std::max(zmax, (alpha - 1) * x);
    ++n;
  }
  // Root bracket of §2.1: f(zmax - 1) >= 1 >= f(zmax - n^{1-alpha}).
  double lo = zmax - 1, hi = zmax - std::pow(static_cast<double>(n), 1 - alpha);
  for (int it = 0; it < 200 && hi - lo > 0; ++it) {
    const double mid = 0.5 * (lo + hi);
    if (mid <= lo || mid >= hi) break;
    double f = 0;
    for (double x : s) f += power((alpha - 1) * x - mid, alpha);
    (f >= 1 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double ref_attend(std::span<const double> s, std::span<const double* const> v, int d,
                  const Mapping& mapping, double* o) {
  std::fill_n(o, d, 0.0);
  double smax = -std::numeric_limits<double>::infinity();
  for (double x : s) smax = std::max(smax, x);
  if (smax == -std::numeric_limits<double>::infinity()) {
    return mapping.is_entmax() ? std::numeric_limits<double>::quiet_NaN() : smax;
  }
  std::vector<double> p(s.size());
  double stat = 0;
  if (mapping.is_entmax()) {
    stat = ref_entmax_tau(s, mapping.alpha);
    for (std::size_t i = 0; i < s.size(); ++i) {
      p[i] = power((mapping.alpha - 1) * s[i] - stat, mapping.alpha);
    }
  } else {
    for (std::size_t i = 0; i < s.size(); ++i) p[i] = std::exp(s[i] - smax);
  }
  double sum = 0;
  for (double x : p) sum += x;
  if (!mapping.is_entmax()) stat = smax + std::log(sum);
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (p[i] == 0) continue;
    const double w = p[i] / sum;
    for (int c = 0; c < d; ++c) o[c] += w * v[i][c];
  }
  return stat;
}

}  // namespace masskv::attn::detail
