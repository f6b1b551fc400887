// Rule "top_p" (Twilight-style, docs/design.md §2.4, §2.8): each q head ranks by the scorer's
// mass estimate and the fill stops once every head holds >= p (a fixed budget fills to its
// cap). An adaptive budget with a cap first restricts each head to its top-cap pages by the
// §2.3 bound, which this rule scans itself: the candidates are the rule's, the masses the
// scorer's. Its estimate is the selected mass. top_p.
#include <algorithm>

#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

bool twilight(const SelectorConfig& c) {
  return c.budget.kind == Budget::Kind::adaptive && c.budget.tokens > 0;
}

int select(const Context& X, const Group& G, Scratch& S, const Limits& L, double* estimate,
           std::uint8_t&) {
  const int n = G.n, g = G.g;
  X.scorer->score(X, G, S, Want{.mass = true});
  const bool cands = twilight(X.c);
  if (cands) {  // candidates: the head's top-cap pages by bound, then ranked by mass
    S.eligible.assign(static_cast<std::size_t>(g) * static_cast<std::size_t>(n), 0);
    for (int i = 0; i < g; ++i) {
      order_by(bound_row(X, G, i), n, nullptr, L.cap, S.picked);
      for (std::int32_t j : S.picked) S.eligible[static_cast<std::size_t>(i) * n + j] = 1;
    }
  }
  const Ranked r{.rank = S.mass.data(),
                 .mass = S.mass.data(),
                 .eligible = cands ? S.eligible.data() : nullptr,
                 .rows = g,
                 .aggregate = pool_heads(X),
                 .log_prob = pool_log_prob(X),
                 .rank_is_mass = true};
  const double p = X.c.budget.kind == Budget::Kind::fixed ? kInf : X.c.budget.p;
  const int count = fill_ranked(G, S, r, L.count, L.cap, p, L.floor);
  selected_mass(G, S, g, estimate);
  return count;
}

}  // namespace

extern const Rule rule_top_p;
const Rule rule_top_p{
    .name = "top_p",
    .needs = [](const SelectorConfig&) { return unsigned{kHeads | kMass}; },
    .scans = [](const SelectArgs&, const SelectorConfig& c) {
      return twilight(c) ? unsigned{kBoundScan} : 0u;
    },
    .select = select,
};

}  // namespace masskv::select::detail
