// Scorer "learned": page masses of softmax(ŝ) of a learned selector (§2.8, docs/design.md):
// ŝ_t = q_g · k_{g,t} of SelectArgs::learned_q against the pool's key rows
// (SelectArgs::learned_keys), summed per page (select/learned.hpp). One ranking per kv group
// (head-collapsed selectors: group 0 for every kv head), so the GQA rule does not apply. Its
// ranking is its mass. learned.
#include "select/learned.hpp"

#include <algorithm>

#include "masskv/error.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

void check(const SelectArgs& a, const SelectorConfig& c) {
  check_learned_args(a);
  require(c.budget.kind != Budget::Kind::adaptive, ErrorCode::invalid_argument, "budget",
          "learned takes a fixed or a top-p budget, not adaptive");
}

void prepare(Context& X) { prepare_learned(X, LearnedItems::page_masses); }

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  const int n = G.n;
  const double* m = learned_row(X, G);
  S.mass.resize(want.mass ? static_cast<std::size_t>(n) : 0);
  if (want.mass) std::copy_n(m, n, S.mass.data());
  if (want.rank) {
    S.rank.resize(static_cast<std::size_t>(n));
    std::copy_n(m, n, S.rank.data());
  }
}

}  // namespace

extern const Scorer scorer_learned;
const Scorer scorer_learned{
    .name = "learned",
    .provides = kRank | kMass,
    .rank_is_mass = true,
    .check = check,
    .prepare = prepare,
    .score = score,
};

}  // namespace masskv::select::detail
