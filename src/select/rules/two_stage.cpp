// Rule "two_stage": the group's token selection (S.in holds the kept tokens; `cap` tokens at
// most). Stage 1 merges the q heads' §2.3 bound rankings (docs/design.md) of the pages that
// hold no kept token, up to candidate_factor × ceil(cap / page_size) pages; stage 2 ranks
// those pages' tokens per q head by the scorer (a kListed scorer: it reads the candidates'
// tokens only) and merges those rankings (the same round robin) to the cap. The page scan is
// the rule's own: the bound, or the page moments (two_stage_pages_by). Options: a third stage
// rescoring the codes' shortlist on the stored keys (rescore_factor), whole pages in place of
// tokens (two_stage_pages). Estimate NaN. two_stage.
#include <algorithm>
#include <limits>
#include <span>
#include <vector>

#include "masskv/error.hpp"
#include "select/kept.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {

extern const Scorer scorer_token_keys;

namespace {

void check(const SelectArgs&, const SelectorConfig& c) {
  using enum ErrorCode;
  require(c.candidate_factor >= 1, invalid_argument, "candidate_factor", "must be >= 1, got ",
          c.candidate_factor);
  require(c.budget.kind == Budget::Kind::fixed, invalid_argument, "budget",
          "two_stage takes a fixed budget");
  require(c.rescore_factor >= 0, invalid_argument, "rescore_factor", "must be >= 0, got ",
          c.rescore_factor);
}

// rescore_factor: the code rankings merged (round robin) into a shortlist of `want` of the
// candidate tokens (ascending), whose keys are read and scored exactly per q head (the
// token_keys scorer); those exact rankings replace the code rankings.
void rescore(const Context& X, const Group& G, Scratch& S, std::span<const std::int32_t> cand,
             int want, int cap) {
  thread_local std::vector<std::uint8_t> short_in;
  thread_local std::vector<std::int32_t> shortlist;
  short_in.assign(static_cast<std::size_t>(G.length), 0);
  (void)fill(S.voters, static_cast<std::size_t>(G.g), short_in, {}, 0, want, kInf, 0);
  shortlist.clear();
  for (const std::int32_t t : cand) {  // the voters' orders hold candidates only
    if (short_in[static_cast<std::size_t>(t)]) shortlist.push_back(t);
  }
  const int K = static_cast<int>(shortlist.size());
  scorer_token_keys.score(X, G, S, Want{.rank = true, .items = shortlist});
  for (int i = 0; i < G.g; ++i) {
    order_by(rank_row(S, K, i), K, nullptr, cap, S.voters[i].order);
    for (std::int32_t& id : S.voters[i].order) id = shortlist[static_cast<std::size_t>(id)];
  }
}

// two_stage_pages: each head's candidate pages in the order of their best token (the first
// time a page appears in the head's token ranking), merged round robin into whole pages while
// a whole page still fits under the cap; then their tokens join S.in.
int fill_pages(const Group& G, Scratch& S, std::vector<std::uint8_t>& page_in, int count,
               int cap) {
  thread_local std::vector<std::int32_t> pages;
  const int P = G.page_size, g = G.g;
  std::fill(page_in.begin(), page_in.end(), std::uint8_t{0});
  for (int i = 0; i < g; ++i) {
    std::vector<std::int32_t>& order = S.voters[i].order;
    pages.clear();
    for (const std::int32_t t : order) {
      const std::int32_t j = t / P;
      if (!page_in[static_cast<std::size_t>(j)]) pages.push_back(j);
      page_in[static_cast<std::size_t>(j)] = 1;
    }
    for (const std::int32_t j : pages) page_in[static_cast<std::size_t>(j)] = 0;
    order.assign(pages.begin(), pages.end());
  }
  // Every candidate page is a full page (kept pages are never candidates, and the partial last
  // page is kept), so whole pages fit while count + P <= cap.
  const int page_cap = std::max(0, (cap - count) / P);
  const int taken = fill(S.voters, static_cast<std::size_t>(g), page_in, {}, 0, page_cap, kInf, 0);
  for (int j = 0; j < G.pages; ++j) {
    if (!page_in[static_cast<std::size_t>(j)]) continue;
    const std::int64_t a = static_cast<std::int64_t>(j) * P;
    for (std::int64_t t = a; t < a + P; ++t) S.in[static_cast<std::size_t>(t)] = 1;
  }
  return count + taken * P;
}

int select(const Context& X, const Group& G, Scratch& S, const Limits& L, double* estimate,
           std::uint8_t&) {
  thread_local std::vector<std::uint8_t> page_in;      // candidate (or kept) pages
  thread_local std::vector<std::int32_t> cand_tokens;  // the candidates' tokens, in order
  thread_local std::vector<double> page_rank;          // stage 1 from the page moments
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
    if (X.c.two_stage_pages_by == TwoStagePages::bound) {
      order_by(bound_row(X, G, i), G.pages, S.eligible.data(), want, S.voters[i].order);
    } else {  // the page moments: q·μ, or the Gaussian model's log-mass m + v/2
      const double* m = head_row(X.m, X, G, i);
      const double* v = head_row(X.v, X, G, i);
      page_rank.resize(static_cast<std::size_t>(G.pages));
      const bool gauss = X.c.two_stage_pages_by == TwoStagePages::gauss;
      for (int j = 0; j < G.pages; ++j) page_rank[j] = m[j] + (gauss ? 0.5 * v[j] : 0.0);
      order_by(page_rank.data(), G.pages, S.eligible.data(), want, S.voters[i].order);
    }
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
  const int r = std::max(1, X.c.rescore_factor);
  for (int i = 0; i < g; ++i) {
    // Ranked over the compact candidate list; ascending ids keep the lower-id tie rule.
    order_by(rank_row(S, K, i), K, nullptr, r * cap, S.voters[i].order);
    for (std::int32_t& id : S.voters[i].order) id = cand_tokens[static_cast<std::size_t>(id)];
  }
  if (X.c.rescore_factor > 0) rescore(X, G, S, cand_tokens, r * std::max(0, cap - L.count), cap);
  std::fill(estimate, estimate + g, std::numeric_limits<double>::quiet_NaN());
  if (X.c.two_stage_pages) return fill_pages(G, S, page_in, L.count, cap);
  return fill(S.voters, static_cast<std::size_t>(g), S.in, {}, L.count, cap, kInf, 0);
}

}  // namespace

extern const Rule rule_two_stage;
const Rule rule_two_stage{
    .name = "two_stage",
    .needs = [](const SelectorConfig&) { return unsigned{kRank | kHeads | kListed}; },
    .scans =
        [](const SelectArgs&, const SelectorConfig& c) {
          return unsigned{c.two_stage_pages_by == TwoStagePages::bound ? kBoundScan : kMomentScan};
        },
    .check = check,
    .select = select,
};

}  // namespace masskv::select::detail
