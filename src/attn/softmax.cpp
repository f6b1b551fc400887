// Softmax with its natural-log log-sum-exp (docs/design.md §1, §2.6).
#include <cmath>
#include <span>

#include "masskv/error.hpp"
#include "masskv/mapping.hpp"

namespace masskv {
namespace {

template <class T>
double softmax_impl(std::span<const T> scores, std::span<T> p) {
  require(!scores.empty(), ErrorCode::invalid_argument, "scores", "must not be empty");
  require(p.size() == scores.size(), ErrorCode::shape_mismatch, "p", "has ", p.size(),
          " entries but scores has ", scores.size());
  bool finite = true;
  T m = scores[0];
  for (const T s : scores) {
    finite &= std::isfinite(s);
    m = s > m ? s : m;
  }
  require(finite, ErrorCode::non_finite, "scores", "contains NaN or inf");
  // Shift by the max in double: s - m is exact enough even for |s| ~ 1e30, and every exp
  // argument is <= 0, so nothing overflows and the max term is exactly 1.
  const double shift = static_cast<double>(m);
  double sum = 0;
  for (std::size_t i = 0; i < scores.size(); ++i) {
    const double e = std::exp(static_cast<double>(scores[i]) - shift);
    sum += e;
    p[i] = static_cast<T>(e);
  }
  const double inv = 1.0 / sum;  // sum >= 1
  for (T& x : p) x = static_cast<T>(static_cast<double>(x) * inv);
  return shift + std::log(sum);
}

}  // namespace

double softmax(std::span<const float> scores, std::span<float> p) {
  return softmax_impl(scores, p);
}
double softmax(std::span<const double> scores, std::span<double> p) {
  return softmax_impl(scores, p);
}

}  // namespace masskv
