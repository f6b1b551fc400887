// Rule "top_k": fill by the scorer's ranking (docs/design.md §3's GQA rule: each q head's own
// ranking taken in turn, or one pooled ranking) up to the budget's cap; under a top-p or
// adaptive budget, stop once every head holds >= p of the scorer's mass estimate (§2.8's
// top-K ∧ top-p). Its estimate is the selected mass when the scorer has one, else NaN.
// quest, oracle, learned, sink_recent.
#include <algorithm>
#include <limits>

#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

int select(const Context& X, const Group& G, Scratch& S, const Limits& L, double* estimate,
           std::uint8_t&) {
  const bool mass = (X.scorer->provides & kMass) != 0 &&
                    !(X.scorer->mass_when_stopping && X.c.budget.kind == Budget::Kind::fixed);
  X.scorer->score(X, G, S, Want{.rank = true, .mass = mass, .cap = L.cap});
  const int rows = score_rows(X, G);
  const Ranked r{.rank = S.rank.data(),
                 .items = S.listed,
                 .mass = mass ? S.mass.data() : nullptr,
                 .rows = rows,
                 .aggregate = pool_heads(X),
                 .log_prob = pool_log_prob(X),
                 .rank_is_mass = X.scorer->rank_is_mass};
  const double p = X.c.budget.kind == Budget::Kind::fixed ? kInf : X.c.budget.p;
  const int count = fill_ranked(G, S, r, L.count, L.cap, p, L.floor);
  if (mass) {
    selected_mass(G, S, rows, estimate, S.listed);
  } else {
    std::fill(estimate, estimate + G.g, std::numeric_limits<double>::quiet_NaN());
  }
  return count;
}

}  // namespace

extern const Rule rule_top_k;
const Rule rule_top_k{
    .name = "top_k",
    .needs = [](const SelectorConfig&) { return unsigned{kRank}; },
    .select = select,
};

}  // namespace masskv::select::detail
