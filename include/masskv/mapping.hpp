// Probability mappings: softmax and alpha-entmax (docs/design.md §2.1).
#pragma once

#include <span>

namespace masskv {

struct Mapping {
  enum class Kind { softmax, entmax };
  Kind kind = Kind::softmax;
  double alpha = 1.0;  // entmax: in (1, 2]; 2 is sparsemax. Ignored for softmax.

  static Mapping softmax() { return {Kind::softmax, 1.0}; }
  static Mapping entmax(double alpha) { return {Kind::entmax, alpha}; }
  bool is_entmax() const { return kind == Kind::entmax; }
  // Throws Error(invalid_argument, "alpha") when alpha is not in (1, 2] (entmax) or not finite.
  void validate() const;
};

// Threshold of alpha-entmax on z = (alpha-1)*s (docs/design.md §2.1):
// p_i = [z_i - tau]_+^{1/(alpha-1)}, sum p = 1.
struct EntmaxThreshold {
  double tau = 0;     // best estimate of the root
  double tau_lo = 0;  // f(tau_lo) >= 1 is guaranteed: certificates (§2.2) use this end
  double tau_hi = 0;  // f(tau_hi) <= 1
  int support = 0;    // #{i : z_i > tau}
};

// Solvers. alpha == 2 and alpha == 1.5 use exact sort-based solvers; any other alpha in
// (1, 2] uses safeguarded Halley steps inside a bisection bracket. Inputs must be finite and
// non-empty; violations throw masskv::Error naming `scores` / `alpha`.
EntmaxThreshold entmax_threshold(std::span<const float> scores, double alpha);
EntmaxThreshold entmax_threshold(std::span<const double> scores, double alpha);

// Writes p (same length as scores) normalised by its own sum (absorbs the residual of tau);
// entries outside the support are exactly 0.
EntmaxThreshold entmax(std::span<const float> scores, double alpha, std::span<float> p);
EntmaxThreshold entmax(std::span<const double> scores, double alpha, std::span<double> p);

// Writes p = softmax(scores); returns log-sum-exp of scores (natural log). Stable for huge
// and tiny scores.
double softmax(std::span<const float> scores, std::span<float> p);
double softmax(std::span<const double> scores, std::span<double> p);

// Sort-free evaluation of f(tau) = sum_i [z_i - tau]_+^{1/(alpha-1)} on z = (alpha-1)*s.
double entmax_mass(std::span<const double> scores, double alpha, double tau);

}  // namespace masskv
