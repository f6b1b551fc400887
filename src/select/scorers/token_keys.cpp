// Scorer "token_keys": tokens ranked per q head by their exact score scale·q·k (f64) on the
// stored keys. It ranks the tokens of a given list only (kListed), reading their keys: with
// two_stage's rule it is the reference token stage (what the 2-bit codes approximate), and
// the rule's rescoring stage (SelectorConfig::rescore_factor) scores its shortlist with it.
#include "select/scorer.hpp"
#include "select/scores.hpp"

namespace masskv::select::detail {
namespace {

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  thread_local std::vector<double> s;
  thread_local std::vector<std::int32_t> all;
  S.mass.clear();
  if (!want.rank) return;
  std::span<const std::int32_t> items = want.items;
  if (items.empty()) {  // every token of the sequence
    all.resize(static_cast<std::size_t>(G.n));
    for (int k = 0; k < G.n; ++k) all[static_cast<std::size_t>(k)] = k;
    items = all;
  }
  const std::size_t K = items.size();
  S.rank.resize(static_cast<std::size_t>(G.g) * K);
  for (int i = 0; i < G.g; ++i) {
    s.clear();
    append_scores(X.a.cache, G.b, G.h, qrow(X, G.b, G.h * X.gsize + i), X.scale,
                  SelectionView::Unit::token, items, s);
    std::copy(s.begin(), s.end(), rank_row(S, static_cast<int>(K), i));
  }
}

}  // namespace

extern const Scorer scorer_token_keys;
const Scorer scorer_token_keys{
    .name = "token_keys",
    .provides = kRank | kHeads | kListed,
    .tokens = [](const SelectorConfig&) { return true; },
    .score = score,
};

}  // namespace masskv::select::detail
