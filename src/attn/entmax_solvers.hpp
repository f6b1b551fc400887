// Internal: choose the entmax threshold solver explicitly (tests run every solver on every
// reference case; the public API in masskv/mapping.hpp picks automatically).
#pragma once

#include <span>

#include "masskv/mapping.hpp"

namespace masskv::attn {

enum class EntmaxSolver {
  automatic,   // exact_sort for alpha in {1.5, 2}, halley otherwise
  exact_sort,  // sort-based closed form; only alpha == 2 or alpha == 1.5
  halley,      // safeguarded Halley inside a bisection bracket; any alpha in (1, 2]
};

EntmaxThreshold entmax_threshold_using(std::span<const float> scores, double alpha,
                                       EntmaxSolver solver);
EntmaxThreshold entmax_threshold_using(std::span<const double> scores, double alpha,
                                       EntmaxSolver solver);
EntmaxThreshold entmax_using(std::span<const float> scores, double alpha, EntmaxSolver solver,
                             std::span<float> p);
EntmaxThreshold entmax_using(std::span<const double> scores, double alpha, EntmaxSolver solver,
                             std::span<double> p);

}  // namespace masskv::attn
