#include "attn/reference_mapping.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace masskv::attn::detail {

double ref_load(const void* row, DType dtype, int c) {
  switch (dtype) {
    case DType::f16:
      return f16_to_f32(static_cast<const f16*>(row)[c]);
    case DType::bf16:
      return bf16_to_f32(static_cast<const bf16*>(row)[c]);
    case DType::f32:
      break;
  }
  return static_cast<const float*>(row)[c];
}

double ref_dot(const double* q, const void* row, DType dtype, int d) {
  double s = 0;
  for (int c = 0; c < d; ++c) s += q[c] * ref_load(row, dtype, c);
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

double ref_attend(std::span<const double> s, std::span<const void* const> v, DType dtype, int d,
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
    for (int c = 0; c < d; ++c) o[c] += w * ref_load(v[i], dtype, c);
  }
  return stat;
}

}  // namespace masskv::attn::detail
