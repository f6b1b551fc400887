// p = [z - tau]_+^{1/(alpha-1)} (docs/design.md §2.1), with the exact powers for alpha = 2, 1.5.
#pragma once

#include <cmath>

namespace masskv::attn::detail {

inline double entmax_weight(double z_minus_tau, double alpha) {
  if (!(z_minus_tau > 0)) return 0;
  if (alpha == 2.0) return z_minus_tau;
  if (alpha == 1.5) return z_minus_tau * z_minus_tau;
  return std::pow(z_minus_tau, 1.0 / (alpha - 1.0));
}

}  // namespace masskv::attn::detail
