// Scorer "recency": the most recent item first (StreamingLLM-style, with the always-kept sink
// and window items of docs/design.md §3). Every head would rank alike, so it gives one ranking
// for the group; it has no mass estimate (its estimate is NaN). sink_recent.
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

void score(const Context&, const Group& G, Scratch& S, const Want& want) {
  S.mass.clear();
  if (!want.rank) return;
  S.rank.resize(static_cast<std::size_t>(G.n));
  for (int j = 0; j < G.n; ++j) S.rank[static_cast<std::size_t>(j)] = j;
}

}  // namespace

extern const Scorer scorer_recency;
const Scorer scorer_recency{
    .name = "recency",
    .provides = kRank,
    .score = score,
};

}  // namespace masskv::select::detail
