// A test-only scorer, written the way the library writes its own (src/select/scorers/*.cpp):
// "oldest_first" ranks every page by its age, oldest first, and estimates a page's mass as its
// share of the sequence's tokens. It exists to show that a scorer is one file plus one
// registration (docs/design.md §3, "Adding a scorer"); test_scorer_registry.cpp runs it.
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

void score(const Context&, const Group& G, Scratch& S, const Want& want) {
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * static_cast<std::size_t>(n);
  if (want.rank) S.rank.resize(ng);
  S.mass.resize(want.mass ? ng : 0);
  for (int i = 0; i < g; ++i) {
    for (int j = 0; j < n; ++j) {
      const std::int64_t first = static_cast<std::int64_t>(j) * G.page_size;
      const std::int64_t tokens = std::min<std::int64_t>(G.page_size, G.length - first);
      if (want.rank) rank_row(S, n, i)[j] = -j;
      if (want.mass) {
        mass_row(S, n, i)[j] = static_cast<double>(tokens) / static_cast<double>(G.length);
      }
    }
  }
}

}  // namespace

extern const Scorer scorer_oldest_first;
const Scorer scorer_oldest_first{
    .name = "oldest_first",
    .provides = kRank | kHeads | kMass,
    .score = score,
};

}  // namespace masskv::select::detail
