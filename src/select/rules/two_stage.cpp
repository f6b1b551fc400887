// Rule "two_stage": the group's token selection (S.in holds the kept tokens; `cap` tokens at
// most). Stage 1 merges the q heads' §2.3 bound rankings (docs/design.md) of the pages that
// hold no kept token, up to candidate_factor × ceil(cap / page_size) pages; stage 2 ranks
// those pages' tokens per q head by the scorer (a kListed scorer: it reads the candidates'
// tokens only) and merges those rankings (the same round robin) to the cap. The bound scan is
// the rule's own. Estimate NaN. two_stage.
#include <algorithm>
#include <limits>

#include "masskv/error.hpp"
#include "select/kept.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

void check(const SelectArgs&, const SelectorConfig& c) {
  using enum ErrorCode;
  require(c.candidate_factor >= 1, invalid_argument, "candidate_factor", "must be >= 1, got ",
          c.candidate_factor);
  require(c.budget.kind == Budget::Kind::fixed, invalid_argument, "budget",
          "two_stage takes a fixed budget");
}

int select(const Context& X, const Group& G, Scratch& S, const Limits& L, double* estimate,
           std::uint8_t&) {
  thread_local std::vector<std::uint8_t> page_in;      // candidate (or kept) pages
  thread_local std::vector<std::int32_t> cand_tokens;  // the candidates' tokens, in order
  const int P = G.page_size, g = G.g, cap = L.cap;
  // Pages holding a kept token (the kept rule in pages) are read anyway: never candidates.
  const KeptRanges<int> kept =
      kept_pages(G.pages, G.length, P, X.c.sink_pages, X.c.window_tokens);
  const int held = kept.count(G.pages);
  page_in.assign(static_cast<std::size_t>(G.pages), 0);
  for (int j = 0; j < G.pages; ++j) {
    page_in[static_cast<std::size_t>(j)] = j < kept.first_end || j >= kept.last_begin ? 1 : 0;
  }
  const int want = held + static_cast<int>(two_stage_candidates(G.pages, held, cap, P,
                                                                X.c.candidate_factor));
  if (S.voters.size() < static_cast<std::size_t>(g)) S.voters.resize(static_cast<std::size_t>(g));
  // Eligible pages: those holding no kept token.
  S.eligible.resize(static_cast<std::size_t>(G.pages));
  for (int j = 0; j < G.pages; ++j) {
    S.eligible[static_cast<std::size_t>(j)] = page_in[static_cast<std::size_t>(j)] ? 0 : 1;
  }
  for (int i = 0; i < g; ++i) {
    order_by(bound_row(X, G, i), G.pages, S.eligible.data(), want, S.voters[i].order);
    S.voters[i].mass = nullptr;
  }
  fill(S.voters, static_cast<std::size_t>(g), page_in, {}, held, want, kInf, 0);
  // Candidates: the eligible pages stage 1 took, their tokens in order.
  cand_tokens.clear();
  for (int j = 0; j < G.pages; ++j) {
    if (!page_in[static_cast<std::size_t>(j)] || !S.eligible[static_cast<std::size_t>(j)]) continue;
    const std::int64_t a = static_cast<std::int64_t>(j) * P;
    const std::int64_t b = std::min<std::int64_t>(a + P, G.length);
    for (std::int64_t t = a; t < b; ++t) cand_tokens.push_back(static_cast<std::int32_t>(t));
  }
  const int K = static_cast<int>(cand_tokens.size());
  X.scorer->score(X, G, S, Want{.rank = true, .items = cand_tokens});
  for (int i = 0; i < g; ++i) {
    // Ranked over the compact candidate list; ascending ids keep the lower-id tie rule.
    order_by(rank_row(S, K, i), K, nullptr, cap, S.voters[i].order);
    for (std::int32_t& id : S.voters[i].order) id = cand_tokens[static_cast<std::size_t>(id)];
  }
  std::fill(estimate, estimate + g, std::numeric_limits<double>::quiet_NaN());
  return fill(S.voters, static_cast<std::size_t>(g), S.in, {}, L.count, cap, kInf, 0);
}

}  // namespace

extern const Rule rule_two_stage;
const Rule rule_two_stage{
    .name = "two_stage",
    .needs = [](const SelectorConfig&) { return unsigned{kRank | kHeads | kListed}; },
    .scans = [](const SelectArgs&, const SelectorConfig&) { return unsigned{kBoundScan}; },
    .check = check,
    .select = select,
};

}  // namespace masskv::select::detail
