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

// Context::prepared[b]: [groups][pages], one task per (sequence, selector group), sequential
// inside, so the result does not depend on the thread count.
void prepare(Context& X) {
  const auto& t = X.a.cache.table;
  const kv::KeyRowsView& keys = X.a.learned_keys;
  const int B = t.batch(), G = keys.groups;
  X.prepared.resize(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    X.prepared[static_cast<std::size_t>(b)].assign(
        static_cast<std::size_t>(G) * static_cast<std::size_t>(t.num_pages(b)), 0.0);
  }
  const int tasks = B * G;
#pragma omp parallel if (tasks > 1)
  {
    std::vector<double> scores;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / G, g = task % G;
      const auto pages = static_cast<std::size_t>(t.num_pages(b));
      std::span<double> out(
          X.prepared[static_cast<std::size_t>(b)].data() + static_cast<std::size_t>(g) * pages,
          pages);
      learned_page_masses(keys, t, b, g, X.a.learned_q.row(b, g), scores, out);
    }
  }
}

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  const int n = G.n;
  const int groups = X.a.learned_keys.groups;
  const double* m = X.prepared[static_cast<std::size_t>(G.b)].data() +
                    static_cast<std::size_t>(groups == 1 ? 0 : G.h) * static_cast<std::size_t>(n);
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
