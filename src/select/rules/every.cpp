// Rule "every": every item, no budget, no scorer (dense). Estimate 1 per head.
#include <algorithm>

#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

int select(const Context&, const Group& G, Scratch& S, const Limits&, double* estimate,
           std::uint8_t&) {
  std::fill(S.in.begin(), S.in.end(), 1);
  std::fill(estimate, estimate + G.g, 1.0);
  return G.n;
}

}  // namespace

extern const Rule rule_every;
const Rule rule_every{
    .name = "every",
    .uses_budget = false,
    .needs = [](const SelectorConfig&) { return 0u; },
    .select = select,
};

}  // namespace masskv::select::detail
