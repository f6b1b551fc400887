// Scorer "page_codes": tokens ranked per q head by q·x̂ on the page codes (kv/page_codes.hpp:
// each key, per channel, as one of four levels of its page's range on an 8-bit grid; the score
// in integers), page by page with every q head at once. It ranks the tokens of a given list
// (two_stage's candidates) or every token (token_codes), reading their codes and the ranges.
// Scorer "learned_codes": the same second pass after a learned selector's first
// (Method::learned_codes). Both give a mass estimate for a top-p budget: each head's softmax
// of its scores over the tokens it scored (with two passes, the candidates: the rest count 0).
#include "masskv/kv/page_codes.hpp"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "select/learned.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

// The codes every pass reads: present, of the cache's shape, with their ranges.
void check_codes(const SelectArgs& a) {
  using enum ErrorCode;
  const kv::PageCodesView& pc = a.page_codes;
  require(!pc.empty(), invalid_argument, "page_codes",
          "this method scores on the cache's page codes (CacheConfig::page_codes)");
  require(pc.num_pages == a.cache.num_pages && pc.num_kv_heads == a.cache.num_kv_heads &&
              pc.head_dim == a.cache.head_dim && pc.page_size == a.cache.page_size,
          shape_mismatch, "page_codes", "shape differs from the cache's");
  require(pc.range_min != nullptr && pc.range_max != nullptr && pc.grid != nullptr,
          invalid_argument, "page_codes", "the ranges (range_min, range_max, grid) are missing");
}

void check(const SelectArgs& a, const SelectorConfig& c) {
  using enum ErrorCode;
  check_codes(a);
  const kv::PageCodesView& pc = a.page_codes;
  require(c.code_channels > 0 && c.code_channels <= 1, invalid_argument, "code_channels",
          "must be in (0, 1], got ", c.code_channels);
  require(c.code_channels == 1 || c.code_candidates >= 1, invalid_argument, "code_candidates",
          "must be >= 1, got ", c.code_candidates);
  require(c.code_channels == 1 || !c.code_channel_spread || pc.chan_spread != nullptr,
          invalid_argument, "page_codes",
          "two passes weighing channels by their spread (code_channel_spread) read the codes' "
          "chan_spread rows, which are missing");
  require(c.code_channels == 1 || (pc.chan_codes != nullptr && pc.chan_ranges != nullptr),
          invalid_argument, "page_codes",
          "two passes (code_channels < 1) read the codes' channel-major copy (chan_codes, "
          "chan_ranges), which is missing");
}

// Each q head's integer form, once per group (qs: scratch of d floats).
void group_queries(const Context& X, const Group& G, std::vector<float>& qs,
                   std::vector<std::int16_t>& q8, std::vector<kv::CodeQuery>& cq) {
  const int g = G.g, d = X.d;
  qs.resize(static_cast<std::size_t>(d));
  q8.resize(static_cast<std::size_t>(g) * static_cast<std::size_t>(d));
  cq.resize(static_cast<std::size_t>(g));
  for (int i = 0; i < g; ++i) {
    const float* q = qrow(X, G.b, G.h * X.gsize + i);
    for (int x = 0; x < d; ++x) qs[static_cast<std::size_t>(x)] = q[x] * X.scale;
    cq[static_cast<std::size_t>(i)] =
        kv::code_query(qs.data(), d, q8.data() + static_cast<std::size_t>(i) * d);
  }
}

// Full scores of the listed tokens (ascending), page by page with every q head at once:
// out[i * stride + k] for the k-th item.
void score_items(const Context& X, const Group& G, const kv::CodeQuery* cq,
                 std::span<const std::int32_t> items, int K, double* out, std::size_t stride) {
  thread_local std::vector<std::int32_t> slots;
  const int P = G.page_size;
  slots.resize(static_cast<std::size_t>(P));
  auto item = [&](int k) { return items.empty() ? k : items[static_cast<std::size_t>(k)]; };
  const kv::PageCodesView& pc = X.a.page_codes;
  for (int k = 0; k < K;) {
    const int j = item(k) / P;
    const std::int32_t phys = G.phys[static_cast<std::size_t>(j)];
    int n = 0;
    for (; n < P && k + n < K && item(k + n) / P == j; ++n) {
      slots[static_cast<std::size_t>(n)] = item(k + n) - j * P;
    }
    kv::page_code_scores(cq, G.g, pc.range(phys, G.h), pc.row(phys, G.h, 0), slots.data(), n, X.d,
                         out + k, stride);
    k += n;
  }
}

// The second pass of two: the kept tokens and the first pass's best others by `pooled` (one
// value per token, higher better), up to code_candidate_count in all, scored on every channel
// (today's scores, bit for bit): the rule's rows over them only (Scratch::listed; the rest rank
// −inf, so that the rule's pooling takes each head's LSE over the candidates). It reads the
// ranges of the pages holding them (Scratch::code_pages, counted by read_cost).
void rescore_candidates(const Context& X, const Group& G, Scratch& S, const Want& want,
                        const std::vector<kv::CodeQuery>& cq, const double* pooled, int factor) {
  thread_local std::vector<std::uint8_t> open;
  const int n = G.n, P = G.page_size;
  const auto N = static_cast<std::size_t>(n);
  const int want_n = static_cast<int>(code_candidate_count(factor, n, want.cap));
  int kept = 0;
  open.resize(N);
  for (std::size_t t = 0; t < N; ++t) {
    open[t] = S.in[t] ? 0 : 1;
    kept += S.in[t];
  }
  const int others = std::max(0, want_n - kept);
  for (const RankedItem& x : best_items(pooled, n, open.data(), others, 3)) {
    open[static_cast<std::size_t>(x.id)] = 2;  // marked: a candidate
  }
  std::vector<std::int32_t>& cand = S.listed;  // ascending, straight into the rule's list
  cand.clear();
  for (std::size_t t = 0; t < N; ++t) {
    if (S.in[t] || open[t] == 2) cand.push_back(static_cast<std::int32_t>(t));
  }
  const int K = static_cast<int>(cand.size());
  S.code_pages = 0;
  for (std::size_t k = 0; k < cand.size(); ++k) {
    if (k == 0 || cand[k] / P != cand[k - 1] / P) ++S.code_pages;
  }
  S.rank.resize(static_cast<std::size_t>(G.g) * static_cast<std::size_t>(K));
  score_items(X, G, cq.data(), cand, K, S.rank.data(), static_cast<std::size_t>(K));
}

// token_codes' first pass (SelectorConfig::code_channels < 1): every token on the group's
// chosen channels, the heads pooled by their log-probabilities, into `pooled`.
void channel_pass(const Context& X, const Group& G, Scratch& S,
                  const std::vector<kv::CodeQuery>& cq, const std::vector<std::int16_t>& q8,
                  std::vector<double>& pooled) {
  thread_local std::vector<double> weight;
  thread_local std::vector<std::int32_t> ch, sums;
  thread_local std::vector<kv::CodeQuery> part;
  const int n = G.n, g = G.g, d = X.d, P = G.page_size;
  const auto N = static_cast<std::size_t>(n);
  // The chosen channels: the largest sums over the heads of |q_c| (ties: the lower channel),
  // each times the channel's spread over the sequence's keys (its last page's row) when
  // SelectorConfig::code_channel_spread.
  weight.assign(static_cast<std::size_t>(d), 0.0);
  for (int i = 0; i < g; ++i) {
    const float* q = qrow(X, G.b, G.h * X.gsize + i);
    for (int c = 0; c < d; ++c) weight[static_cast<std::size_t>(c)] += std::fabs(q[c]);
  }
  if (X.c.code_channel_spread) {
    const float* sd = X.a.page_codes.spread_row(G.phys.back(), G.h);
    for (int c = 0; c < d; ++c) weight[static_cast<std::size_t>(c)] *= static_cast<double>(sd[c]);
  }
  const int r = code_channel_count(X.c, d);
  order_by(weight.data(), d, nullptr, r, ch);
  std::sort(ch.begin(), ch.end());  // memory order
  // Integer sums over the chosen channels, then the definition's f64 operations with the
  // chosen channels' Q.
  part.assign(cq.begin(), cq.end());
  for (int i = 0; i < g; ++i) {
    std::int32_t Q = 0;
    for (const std::int32_t c : ch) Q += q8[static_cast<std::size_t>(i) * d + c];
    part[static_cast<std::size_t>(i)].sum = Q;
  }
  sums.assign(static_cast<std::size_t>(g) * N, 0);
  kv::channel_code_sums(X.a.page_codes, G.h, G.phys.data(), n, ch.data(), r, part.data(), g,
                        sums.data());
  S.rank.resize(static_cast<std::size_t>(g) * N);
  pooled.assign(N, -kInf);
  for (int i = 0; i < g; ++i) {
    const kv::CodeQuery& cq1 = part[static_cast<std::size_t>(i)];
    double* row = rank_row(S, n, i);
    const std::int32_t* I = sums.data() + static_cast<std::size_t>(i) * N;
    for (int j = 0; j * P < n; ++j) {
      const kv::PageRange8 rg = X.a.page_codes.range(G.phys[static_cast<std::size_t>(j)], G.h);
      const int t0 = j * P;
      kv::code_scores(cq1.unit, cq1.sum, rg, I + t0, std::min(n - t0, P), row + t0);
    }
    pool_log_prob(row, n, pooled.data());
  }
}

// The mass rows from the rank rows of K items: each head's softmax over them (the scores are
// logits on the codes' grid).
void masses_of_ranks(const Group& G, Scratch& S, int K) {
  S.mass.assign(S.rank.begin(), S.rank.begin() + static_cast<std::ptrdiff_t>(G.g) * K);
  for (int i = 0; i < G.g; ++i) normalise_log({mass_row(S, K, i), static_cast<std::size_t>(K)});
}

// What the rule asks, on the codes: two passes when it gives a cap and `first_pass` (called
// with the group's integer queries) gives a first ranking (one value per token) and its
// candidate factor; otherwise every asked token on every channel, one pass. The masses when
// asked (masses_of_ranks).
template <class FirstPass>
void score_codes(const Context& X, const Group& G, Scratch& S, const Want& want,
                 FirstPass first_pass) {
  thread_local std::vector<float> qs;
  thread_local std::vector<std::int16_t> q8;
  thread_local std::vector<kv::CodeQuery> cq;
  S.mass.clear();
  if (!want.rank) return;
  group_queries(X, G, qs, q8, cq);
  int K = want.items.empty() ? G.n : static_cast<int>(want.items.size());
  const auto [ranking, factor] = want.items.empty() && want.cap > 0
                                     ? first_pass(cq, q8)
                                     : std::pair<const double*, int>{nullptr, 0};
  if (ranking != nullptr) {
    rescore_candidates(X, G, S, want, cq, ranking, factor);
    K = static_cast<int>(S.listed.size());
  } else {
    S.rank.resize(static_cast<std::size_t>(G.g) * static_cast<std::size_t>(K));
    score_items(X, G, cq.data(), want.items, K, rank_row(S, K, 0), static_cast<std::size_t>(K));
  }
  if (want.mass) masses_of_ranks(G, S, K);
}

// token_codes: its channel pass first when code_channels < 1.
void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  score_codes(X, G, S, want,
              [&](const std::vector<kv::CodeQuery>& cq, const std::vector<std::int16_t>& q8) {
                thread_local std::vector<double> pooled;
                if (X.c.code_channels >= 1) return std::pair<const double*, int>{nullptr, 0};
                channel_pass(X, G, S, cq, q8, pooled);
                return std::pair<const double*, int>{pooled.data(), X.c.code_candidates};
              });
}

// learned_codes: the codes' checks, the learned selector's, and its candidate factor.
void check_learned_codes(const SelectArgs& a, const SelectorConfig& c) {
  check_codes(a);
  check_learned_args(a);
  require(c.learned_candidates >= 1, ErrorCode::invalid_argument, "learned_candidates",
          "must be >= 1, got ", c.learned_candidates);
  require(c.budget.tokens > 0, ErrorCode::invalid_argument, "budget",  // needs_budget_cap
          "learned_codes needs a cap on its budget (a top-p budget as pMASS:CAP): its learned "
          "first pass keeps learned_candidates x the cap");
}

void prepare_learned_codes(Context& X) { prepare_learned(X, LearnedItems::token_scores); }

// learned_codes: ŝ (prepared) as the first pass (its check makes every budget give a cap).
void score_learned(const Context& X, const Group& G, Scratch& S, const Want& want) {
  score_codes(X, G, S, want,
              [&](const std::vector<kv::CodeQuery>&, const std::vector<std::int16_t>&) {
                return std::pair<const double*, int>{learned_row(X, G), X.c.learned_candidates};
              });
}

}  // namespace

extern const Scorer scorer_page_codes, scorer_learned_codes;
const Scorer scorer_page_codes{
    .name = "page_codes",
    .provides = kRank | kHeads | kListed | kMass,
    .mass_when_stopping = true,
    .tokens = [](const SelectorConfig&) { return true; },
    .check = check,
    .score = score,
};
const Scorer scorer_learned_codes{
    .name = "learned_codes",
    .provides = kRank | kHeads | kMass,
    .mass_when_stopping = true,
    .tokens = [](const SelectorConfig&) { return true; },
    .check = check_learned_codes,
    .prepare = prepare_learned_codes,
    .score = score_learned,
};

}  // namespace masskv::select::detail
