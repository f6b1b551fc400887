// The selectors that read the 2-bit page codes (kv/page_codes.hpp, tested in
// test_page_codes.cpp) against plain f64 references of their rules: two_stage (Method::two_stage),
// token_codes in one and two passes, learned_codes, their top-p budgets and refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "core/cpu_features.hpp"
#include "expect_error.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/page_codes.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"
#include "select/log_prob.hpp"
#include "selector_fixture.hpp"

namespace masskv {
namespace {

// ---- the selector against a plain reference of its rule -------------------------------------

// Round robin over per-voter orders (best first) into `in`, up to cap items; returns the count.
int reference_fill(const std::vector<std::vector<std::int32_t>>& orders,
                   std::vector<std::uint8_t>& in, int count, int cap) {
  std::vector<std::size_t> pos(orders.size(), 0);
  bool progress = true;
  while (count < cap && progress) {
    progress = false;
    for (std::size_t i = 0; i < orders.size() && count < cap; ++i) {
      while (pos[i] < orders[i].size() && in[static_cast<std::size_t>(orders[i][pos[i]])]) ++pos[i];
      if (pos[i] == orders[i].size()) continue;
      in[static_cast<std::size_t>(orders[i][pos[i]++])] = 1;
      ++count;
      progress = true;
    }
  }
  return count;
}

// Ids with score, best first, ties to the lower id.
std::vector<std::int32_t> ranked(const std::vector<std::pair<double, std::int32_t>>& items) {
  auto v = items;
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  });
  std::vector<std::int32_t> ids;
  for (const auto& x : v) ids.push_back(x.second);
  return ids;
}

// GroupRule::log_prob's pooling of one head's scores over the items x with live[x] (every item
// when live is empty): agg[x] = max(agg[x], sc[x] − the head's LSE over them), the LSE of
// select/log_prob.hpp (checked against std::exp in LogProbLseMatchesALongDoubleReference) summed
// backwards: the integer sum does not depend on the order.
void reference_pool_log_prob(const std::vector<double>& sc, const std::vector<std::uint8_t>& live,
                             std::vector<double>& agg) {
  const auto on = [&](std::size_t x) { return live.empty() || live[x] != 0; };
  double m = -std::numeric_limits<double>::infinity();
  for (std::size_t x = 0; x < sc.size(); ++x) m = on(x) ? std::max(m, sc[x]) : m;
  std::uint64_t sum = 0;
  for (std::size_t x = sc.size(); x-- > 0;) sum += on(x) ? select::lse_term(sc[x] - m) : 0;
  const double lse = select::lse_finish(m, sum);
  for (std::size_t x = 0; x < sc.size(); ++x) {
    if (on(x)) agg[x] = std::max(agg[x], sc[x] - lse);
  }
}

// One ranking by `score` filled into `in` (count items in) up to `cap`; returns the count.
int reference_fill_by(const std::vector<double>& score, std::vector<std::uint8_t>& in, int count,
                      int cap) {
  std::vector<std::pair<double, std::int32_t>> items;
  for (std::size_t x = 0; x < score.size(); ++x) items.push_back({score[x], static_cast<std::int32_t>(x)});
  return reference_fill({ranked(items)}, in, count, cap);
}

// The items of `in`, ascending: a selection list.
std::vector<std::int32_t> ids_in(const std::vector<std::uint8_t>& in) {
  std::vector<std::int32_t> ids;
  for (std::size_t x = 0; x < in.size(); ++x) {
    if (in[x]) ids.push_back(static_cast<std::int32_t>(x));
  }
  return ids;
}

// Kept tokens of sequence b (in[x] = 1): sink pages' tokens, the last window_tokens tokens
// (from the start of the page they begin in when that is the last page), the last page.
std::vector<std::uint8_t> reference_kept(const test::SelCase& c, const select::SelectorConfig& cfg,
                                         int b) {
  const kv::PageTable t = c.table.table();
  const int P = c.P, pages = t.num_pages(b);
  const std::int64_t L = t.length(b, P);
  const std::int64_t sink_end = std::min<std::int64_t>(cfg.sink_pages, pages) * P;
  const std::int64_t last_start = static_cast<std::int64_t>(pages - 1) * P;
  const std::int64_t tail =
      cfg.window_tokens > 0 ? std::min(last_start, std::max<std::int64_t>(0, L - cfg.window_tokens))
                            : last_start;
  std::vector<std::uint8_t> in(static_cast<std::size_t>(L), 0);
  for (std::int64_t x = 0; x < L; ++x) in[static_cast<std::size_t>(x)] = x < sink_end || x >= tail;
  return in;
}

// The integer form of q head qh of sequence b, scaled as the selector does (q8: d values).
kv::CodeQuery reference_query(const test::SelCase& c, int b, int qh, std::vector<std::int16_t>& q8) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const float* q = c.q.data() + (b * c.Hq + qh) * c.d;
  std::vector<float> qs(static_cast<std::size_t>(c.d));
  for (int ch = 0; ch < c.d; ++ch) qs[ch] = q[ch] * scale;
  q8.resize(static_cast<std::size_t>(c.d));
  return kv::code_query(qs.data(), c.d, q8.data());
}

std::vector<std::int32_t> reference_two_stage(const test::SelCase& c, const select::SelectorConfig& cfg,
                                              int b, int h) {
  const kv::PageTable t = c.table.table();
  const int P = c.P, d = c.d, g = c.Hq / c.Hkv, pages = t.num_pages(b);
  const std::int64_t L = t.length(b, P);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const auto phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), pages);
  std::vector<std::uint8_t> in = reference_kept(c, cfg, b), page_in(pages, 0);
  int count = 0, kept_pages = 0;
  for (std::int64_t x = 0; x < L; ++x) {
    if (in[static_cast<std::size_t>(x)]) {
      ++count;
      if (!page_in[x / P]) ++kept_pages;
      page_in[x / P] = 1;
    }
  }
  const int cap = static_cast<int>(std::min<std::int64_t>(L, std::max<std::int64_t>(count, cfg.budget.tokens)));
  // Stage 1: bounds of the pages holding no kept token.
  const int want = std::min<int>(pages, kept_pages + cfg.candidate_factor * ((cap + P - 1) / P));
  std::vector<std::vector<std::int32_t>> orders(g);
  std::vector<float> U(static_cast<std::size_t>(pages));
  for (int i = 0; i < g; ++i) {
    select::page_upper_bounds(c.cache.summaries(), phys, h, c.q.data() + ((b * c.Hq) + h * g + i) * d,
                              1, d, scale, U);
    std::vector<std::pair<double, std::int32_t>> items;
    for (int j = 0; j < pages; ++j) {
      if (!page_in[j]) items.push_back({U[j], j});
    }
    orders[i] = ranked(items);
  }
  std::vector<std::uint8_t> cand = page_in;
  reference_fill(orders, cand, kept_pages, want);
  // Stage 2: the candidates' tokens by their code score, row by row (kv::page_code_score, the
  // definition the batched scorer is held bit-equal to).
  const kv::PageCodesView pc = c.cache.page_codes();
  for (int i = 0; i < g; ++i) {
    std::vector<std::int16_t> q8;
    const kv::CodeQuery cq = reference_query(c, b, h * g + i, q8);
    std::vector<std::pair<double, std::int32_t>> items;
    for (int j = 0; j < pages; ++j) {
      if (!cand[j] || page_in[j]) continue;
      for (std::int64_t x = j * P; x < std::min<std::int64_t>(L, (j + 1) * P); ++x) {
        const std::uint8_t* row = pc.row(phys[j], h, static_cast<int>(x - j * P));
        items.push_back({kv::page_code_score(cq, pc.range(phys[j], h), row, d),
                         static_cast<std::int32_t>(x)});
      }
    }
    orders[i] = ranked(items);
  }
  if (cfg.rescore_factor > 0) {
    // Stage 3: the code rankings' merged shortlist, ranked per head on the stored keys.
    std::vector<std::uint8_t> short_in(static_cast<std::size_t>(L), 0);
    reference_fill(orders, short_in, 0, cfg.rescore_factor * std::max(0, cap - count));
    const kv::PagedKVView v = c.view();
    for (int i = 0; i < g; ++i) {
      const float* q = c.q.data() + ((b * c.Hq) + h * g + i) * d;
      std::vector<std::pair<double, std::int32_t>> items;
      for (std::int64_t x = 0; x < L; ++x) {
        if (!short_in[static_cast<std::size_t>(x)]) continue;
        const f16* k = v.key<f16>(phys[x / P], h, static_cast<int>(x % P));
        double score = 0;
        for (int ch = 0; ch < d; ++ch) score += static_cast<double>(q[ch]) * to_f32(k[ch]);
        items.push_back({score * static_cast<double>(scale), static_cast<std::int32_t>(x)});
      }
      orders[i] = ranked(items);
    }
  }
  if (cfg.two_stage_pages) {
    // Whole pages, in each head's order of their best token, while a whole page fits.
    for (auto& o : orders) {
      std::vector<std::int32_t> pg;
      for (std::int32_t x : o) {
        if (std::find(pg.begin(), pg.end(), x / P) == pg.end()) pg.push_back(x / P);
      }
      o = pg;
    }
    std::vector<std::uint8_t> chosen(pages, 0);
    reference_fill(orders, chosen, 0, std::max(0, (cap - count) / P));
    for (int j = 0; j < pages; ++j) {
      for (std::int64_t x = j * P; chosen[j] && x < (j + 1) * P; ++x) {
        EXPECT_LT(x, L) << "a candidate page is a whole page";
        in[static_cast<std::size_t>(x)] = 1;
      }
    }
  } else {
    reference_fill(orders, in, count, cap);
  }
  return ids_in(in);
}

TEST(TwoStage, MatchesThePlainReferenceOfItsRule) {
  test::OneThread one;
  std::mt19937 rng(17);
  int lists = 0, differs_from_quest_tokens = 0, whole_page_lists = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 3, 4}) {
      for (int d : {16, 24, 64}) {
        const std::vector<int> lengths{1, 17, 113, 300, 777};
        test::SelCase c = test::random_case(rng, lengths, 2 * g, 2, d, P, DType::f16, 2.0f, 0.5f,
                                            0.7f, /*page_codes=*/true);
        for (int trial = 0; trial < 12; ++trial) {
          select::SelectorConfig cfg;
          cfg.method = select::Method::two_stage;
          cfg.two_stage_pages = trial >= 4 && trial < 8;
          cfg.rescore_factor = trial >= 8 ? 1 + trial % 3 : 0;
          cfg.budget = {select::Budget::Kind::fixed, 24 + 16 * (trial % 4), 0.9};
          cfg.sink_pages = trial % 3;
          cfg.window_tokens = (trial % 2) * 9;
          cfg.candidate_factor = 1 + trial % 4;
          select::SelectOutput out;
          select::run_selector(c.args(), cfg, out);
          const SelectionView sel = out.selection.view();
          ASSERT_EQ(sel.unit, SelectionView::Unit::token);
          for (int b = 0; b < c.B; ++b) {
            for (int h = 0; h < 2; ++h) {
              const auto got = sel.list(b, h);
              const auto want = reference_two_stage(c, cfg, b, h);
              ASSERT_EQ(std::vector<std::int32_t>(got.begin(), got.end()), want)
                  << "P " << P << " g " << g << " d " << d << " trial " << trial << " b " << b
                  << " h " << h;
              ++lists;
              // Not whole pages: the token stage picks inside them (unless two_stage_pages,
              // which takes every token of its pages).
              std::set<int> pages_of;
              for (std::int32_t x : want) pages_of.insert(x / P);
              const bool partial = static_cast<int>(pages_of.size()) * P >
                                   static_cast<int>(want.size()) + P;
              if (cfg.two_stage_pages) {
                // The window's first page and the last page may be partial; no other.
                ASSERT_LE(static_cast<int>(pages_of.size()) * P,
                          static_cast<int>(want.size()) + 2 * P)
                    << "two_stage_pages keeps whole pages";
                whole_page_lists += static_cast<int>(want.size()) > P;
              } else {
                differs_from_quest_tokens += partial;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(lists, 2 * 3 * 3 * 12 * 5 * 2);
  EXPECT_GT(differs_from_quest_tokens, 50);  // the reference is not a page selection
  EXPECT_GT(whole_page_lists, 50);
}

// token_codes with the round robin is two_stage without the page stage: the same lists as
// two_stage with every eligible page a candidate (which the reference above checks) when the
// kept tokens fill whole pages (no window: two_stage never takes the rest of a page a window
// starts in).
TEST(TokenCodes, EqualsTwoStageWithEveryPageACandidate) {
  test::OneThread one;
  std::mt19937 rng(29);
  int lists = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 3}) {
      test::SelCase c = test::random_case(rng, {1, 17, 113, 300, 777}, 2 * g, 2, 24, P,
                                          DType::f16, 2.0f, 0.5f, 0.7f, /*page_codes=*/true);
      for (int trial = 0; trial < 4; ++trial) {
        select::SelectorConfig cfg;
        cfg.method = select::Method::token_codes;
        cfg.code_channels = 1;  // one pass, as two_stage's token stage
        cfg.group = select::GroupRule::union_heads;  // two_stage's rule
        cfg.budget = {select::Budget::Kind::fixed, 24 + 16 * trial, 0.9};
        cfg.sink_pages = trial % 3;
        select::SelectOutput got, want;
        select::run_selector(c.args(), cfg, got);
        cfg.method = select::Method::two_stage;
        cfg.candidate_factor = 1 << 20;
        select::run_selector(c.args(), cfg, want);
        for (int b = 0; b < c.B; ++b) {
          for (int h = 0; h < 2; ++h) {
            const auto x = got.selection.view().list(b, h);
            const auto y = want.selection.view().list(b, h);
            ASSERT_EQ(std::vector<std::int32_t>(x.begin(), x.end()),
                      std::vector<std::int32_t>(y.begin(), y.end()))
                << "P " << P << " g " << g << " trial " << trial << " b " << b << " h " << h;
            ++lists;
          }
        }
      }
    }
  }
  EXPECT_EQ(lists, 2 * 2 * 4 * 5 * 2);
}

// GroupRule::log_prob: one ranking per kv group, the max over its q heads of each head's code
// score minus that head's log-sum-exp over every token; the kept tokens, then that ranking's
// best up to the cap (a plain reference: every token scored row by row).
TEST(TokenCodes, LogProbGroupRuleMatchesThePlainReference) {
  test::OneThread one;
  std::mt19937 rng(31);
  int lists = 0, differs_from_union = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 3, 4}) {
      test::SelCase c = test::random_case(rng, {1, 17, 113, 300, 777}, 2 * g, 2, 32, P,
                                          DType::f16, 2.0f, 0.5f, 0.7f, /*page_codes=*/true);
      const kv::PageTable t = c.table.table();
      const kv::PageCodesView pc = c.cache.page_codes();
      for (int trial = 0; trial < 4; ++trial) {
        select::SelectorConfig cfg;
        cfg.method = select::Method::token_codes;
        cfg.code_channels = 1;  // one pass: every token scored on every channel
        cfg.group = select::GroupRule::log_prob;
        cfg.budget = {select::Budget::Kind::fixed, 24 + 16 * trial, 0.9};
        cfg.sink_pages = trial % 3;
        select::SelectOutput got, uni, dflt;
        select::run_selector(c.args(), cfg, got);
        cfg.group = select::GroupRule::union_heads;
        select::run_selector(c.args(), cfg, uni);
        cfg.group = select::GroupRule::method_default;  // token_codes' own: log_prob
        select::run_selector(c.args(), cfg, dflt);
        for (int b = 0; b < c.B; ++b) {
          const int pages = t.num_pages(b);
          const std::int64_t L = t.length(b, P);
          const auto phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), pages);
          for (int h = 0; h < 2; ++h) {
            std::vector<double> agg(static_cast<std::size_t>(L), -std::numeric_limits<double>::infinity());
            for (int i = 0; i < g; ++i) {
              std::vector<std::int16_t> q8;
              const kv::CodeQuery cq = reference_query(c, b, h * g + i, q8);
              std::vector<double> sc(static_cast<std::size_t>(L));
              for (std::int64_t x = 0; x < L; ++x) {
                sc[x] = kv::page_code_score(cq, pc.range(phys[x / P], h),
                                            pc.row(phys[x / P], h, static_cast<int>(x % P)), 32);
              }
              reference_pool_log_prob(sc, {}, agg);
            }
            std::vector<std::uint8_t> in = reference_kept(c, cfg, b);
            const int count = static_cast<int>(std::count(in.begin(), in.end(), 1));
            const int cap = static_cast<int>(std::min<std::int64_t>(L, std::max<std::int64_t>(count, cfg.budget.tokens)));
            reference_fill_by(agg, in, count, cap);
            const std::vector<std::int32_t> want = ids_in(in);
            const auto x = got.selection.view().list(b, h);
            ASSERT_EQ(std::vector<std::int32_t>(x.begin(), x.end()), want)
                << "P " << P << " g " << g << " trial " << trial << " b " << b << " h " << h;
            const auto dl = dflt.selection.view().list(b, h);
            ASSERT_EQ(std::vector<std::int32_t>(dl.begin(), dl.end()), want) << "the default rule";
            const auto u = uni.selection.view().list(b, h);
            differs_from_union += std::vector<std::int32_t>(u.begin(), u.end()) != want;
            ++lists;
          }
        }
      }
    }
  }
  EXPECT_EQ(lists, 2 * 3 * 4 * 5 * 2);
  EXPECT_GT(differs_from_union, 10);  // g > 1: another rule than the round robin
}

// token_codes in two passes (SelectorConfig::code_channels < 1) against a plain reference of
// its rule: pass 1 on the chosen channels (the largest sums over the group's heads of |q_c|,
// ties to the lower channel) decoded from the token-major rows, pooled by the heads'
// log-probabilities; the kept tokens and the best others up to code_candidates × cap; pass 2
// the full scores of those, each head's LSE over them, pooled and filled to the cap. With
// candidates to spare it equals the one-pass lists.
TEST(TokenCodes, TwoPassesMatchThePlainReferenceOfTheirRule) {
  test::OneThread one;
  std::mt19937 rng(37);
  constexpr double inf = std::numeric_limits<double>::infinity();
  int lists = 0, differs_from_one_pass = 0, differs_by_rule = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 3, 4}) {
      test::SelCase c = test::random_case(rng, {1, 17, 113, 300, 777}, 2 * g, 2, 32, P,
                                          DType::f16, 2.0f, 0.5f, 0.7f, /*page_codes=*/true);
      const kv::PageTable t = c.table.table();
      const kv::PageCodesView pc = c.cache.page_codes();
      for (int trial = 0; trial < 4; ++trial) {
        select::SelectorConfig cfg;
        cfg.method = select::Method::token_codes;
        cfg.budget = {select::Budget::Kind::fixed, 24 + 16 * trial, 0.9};
        cfg.sink_pages = trial % 3;
        cfg.code_channels = trial % 2 ? 0.375 : 0.5;
        cfg.code_candidates = 1 + trial % 3;
        cfg.code_channel_spread = trial != 2;  // trial 2: the channels by |q| alone
        select::SelectOutput got, one_pass, spare, qonly;
        select::run_selector(c.args(), cfg, got);
        select::SelectorConfig by_q = cfg;
        by_q.code_channel_spread = false;
        select::run_selector(c.args(), by_q, qonly);
        select::SelectorConfig all = cfg;
        all.code_candidates = 1 << 20;  // every token a candidate: the one-pass ranking
        select::run_selector(c.args(), all, spare);
        all.code_channels = 1;
        select::run_selector(c.args(), all, one_pass);
        const int r = static_cast<int>(std::lround(cfg.code_channels * 32));
        for (int b = 0; b < c.B; ++b) {
          const int pages = t.num_pages(b);
          const std::int64_t L = t.length(b, P);
          const auto phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), pages);
          for (int h = 0; h < 2; ++h) {
            std::vector<std::pair<double, std::int32_t>> w;
            for (int x = 0; x < 32; ++x) {
              double s = 0;
              for (int i = 0; i < g; ++i) s += std::fabs(c.q[(static_cast<std::size_t>(b) * 2 * g + h * g + i) * 32 + x]);
              // The spread row of the last page (its values: PagedKVCache's own test).
              if (cfg.code_channel_spread) s *= static_cast<double>(pc.spread_row(phys[pages - 1], h)[x]);
              w.push_back({s, x});
            }
            std::vector<std::int32_t> ch = ranked(w);
            ch.resize(static_cast<std::size_t>(r));
            std::vector<std::uint8_t> in = reference_kept(c, cfg, b);
            const int count = static_cast<int>(std::count(in.begin(), in.end(), 1));
            const int cap = static_cast<int>(std::min<std::int64_t>(L, std::max<std::int64_t>(count, cfg.budget.tokens)));
            std::vector<std::vector<double>> full(static_cast<std::size_t>(g));
            std::vector<double> pooled(static_cast<std::size_t>(L), -inf);
            for (int i = 0; i < g; ++i) {
              std::vector<std::int16_t> q8;
              const kv::CodeQuery cq = reference_query(c, b, h * g + i, q8);
              std::int32_t Q1 = 0;
              for (const std::int32_t x : ch) Q1 += q8[x];
              std::vector<double> part(static_cast<std::size_t>(L));
              full[i].resize(static_cast<std::size_t>(L));
              for (std::int64_t x = 0; x < L; ++x) {
                const kv::PageRange8 rg = pc.range(phys[x / P], h);
                const std::uint8_t* row = pc.row(phys[x / P], h, static_cast<int>(x % P));
                std::int32_t I = 0;
                for (const std::int32_t cc : ch) {
                  const int code = (row[cc >> 2] >> (2 * (cc & 3))) & 3;
                  I += q8[cc] * (3 * rg.a[cc] + code * (rg.b[cc] - rg.a[cc]));
                }
                part[x] = cq.unit * (static_cast<double>(rg.lo) * Q1 + static_cast<double>(rg.step) / 3.0 * I);
                full[i][x] = kv::page_code_score(cq, rg, row, 32);
              }
              reference_pool_log_prob(part, {}, pooled);
            }
            std::vector<std::uint8_t> cand = in;
            const std::int64_t want_n = std::min<std::int64_t>(L, static_cast<std::int64_t>(cfg.code_candidates) * cap);
            reference_fill_by(pooled, cand, count, static_cast<int>(want_n));
            std::set<std::int64_t> cand_pages;  // whose ranges pass 2 reads
            for (std::int64_t x = 0; x < L; ++x) {
              if (cand[static_cast<std::size_t>(x)]) cand_pages.insert(x / P);
            }
            ASSERT_EQ(got.code_pages[static_cast<std::size_t>(b) * 2 + h],
                      static_cast<std::int32_t>(cand_pages.size()));
            ASSERT_EQ(one_pass.code_pages[static_cast<std::size_t>(b) * 2 + h], -1);
            std::vector<double> agg(static_cast<std::size_t>(L), -inf);
            for (int i = 0; i < g; ++i) reference_pool_log_prob(full[i], cand, agg);
            reference_fill_by(agg, in, count, cap);
            const std::vector<std::int32_t> want = ids_in(in);
            const auto x = got.selection.view().list(b, h);
            ASSERT_EQ(std::vector<std::int32_t>(x.begin(), x.end()), want)
                << "P " << P << " g " << g << " trial " << trial << " b " << b << " h " << h;
            const auto o = one_pass.selection.view().list(b, h);
            const auto sp = spare.selection.view().list(b, h);
            ASSERT_EQ(std::vector<std::int32_t>(sp.begin(), sp.end()),
                      std::vector<std::int32_t>(o.begin(), o.end()))
                << "candidates to spare: the one-pass lists";
            differs_from_one_pass += std::vector<std::int32_t>(o.begin(), o.end()) != want;
            const auto qo = qonly.selection.view().list(b, h);
            differs_by_rule += std::vector<std::int32_t>(qo.begin(), qo.end()) != want;
            ++lists;
          }
        }
      }
    }
  }
  EXPECT_EQ(lists, 2 * 3 * 4 * 5 * 2);
  EXPECT_GT(differs_from_one_pass, 5);  // the first pass changes some lists
  EXPECT_GT(differs_by_rule, 5) << "the spread changes the channels of some lists";
}

// A selection case with a learned selector's key cache: rows of `groups` × `dim` in `format`
// (N / 2 values), 2 kv heads of g q heads, d 32, page codes, and the selector's queries lq (N),
// drawn from `rng` in that order; args() as run_selector takes them.
struct LearnedCase {
  int groups, dim;
  kv::RowFormat format;
  // The key rows, built (spec()) before c, whose cache copies them: declared before c.
  test::KeyRowsSpec key_rows;
  test::SelCase c;
  std::vector<float> lq;

  LearnedCase(std::mt19937& rng, std::normal_distribution<float>& N,
              const std::vector<int>& lengths, int g, int P, int groups_, int dim_,
              kv::RowFormat format_, float key_scale)
      : groups(groups_), dim(dim_), format(format_), key_rows{groups_, dim_, format_, {}},
        c(test::random_case(rng, lengths, 2 * g, 2, 32, P, DType::f16, key_scale, 0.5f, 0.7f,
                            /*page_codes=*/true, spec(rng, N, lengths))) {
    lq.resize(static_cast<std::size_t>(c.B) * groups * dim);
    for (float& x : lq) x = N(rng);
  }
  select::SelectArgs args() const {
    select::SelectArgs a = c.args();
    a.learned_q = View3<const float>::contiguous(lq.data(), c.B, groups, dim);
    a.learned_keys = c.cache.key_rows();
    return a;
  }
  // ŝ_t of every token of sequence b for selector group `group`: lq · the decoded key row, f64.
  std::vector<double> scores(int b, int group) const {
    const kv::PageTable t = c.table.table();
    const kv::KeyRowsView keys = c.cache.key_rows();
    const int P = c.P;
    const std::int64_t L = t.length(b, P);
    const auto phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), t.num_pages(b));
    const float* q = lq.data() + (static_cast<std::size_t>(b) * groups + group) * dim;
    std::vector<double> s(static_cast<std::size_t>(L));
    std::vector<float> row(static_cast<std::size_t>(dim));
    for (std::int64_t x = 0; x < L; ++x) {
      kv::decode_row(format, keys.row(phys[x / P], group, static_cast<int>(x % P)), dim,
                     row.data());
      double acc = 0;
      for (int y = 0; y < dim; ++y) acc += static_cast<double>(q[y]) * row[static_cast<std::size_t>(y)];
      s[static_cast<std::size_t>(x)] = acc;
    }
    return s;
  }

 private:
  // key_rows' values for the given lengths (called in c's initialiser: key_rows is built).
  const test::KeyRowsSpec* spec(std::mt19937& rng, std::normal_distribution<float>& N,
                                const std::vector<int>& lengths) {
    for (const int len : lengths) {
      std::vector<float> r(static_cast<std::size_t>(len) * groups * dim);
      for (float& x : r) x = N(rng) / 2;
      key_rows.rows.push_back(std::move(r));
    }
    return &key_rows;
  }
};

// learned_codes (token_codes' second pass after a learned selector's ranking) against a plain
// reference of its rule: ŝ_t = learned_q · the decoded key row in f64; the kept tokens and the
// best others by ŝ up to learned_candidates × cap; the candidates' full code scores, each
// head's LSE over them, pooled by the max and filled to the cap. Row formats f32, bf16 and
// int4, head-collapsed and per kv head. With candidates to spare it is token_codes' one pass.
TEST(LearnedCodes, MatchesThePlainReferenceOfItsRule) {
  test::OneThread one;
  std::mt19937 rng(41);
  std::normal_distribution<float> N(0.0f, 1.0f);
  constexpr double inf = std::numeric_limits<double>::infinity();
  int lists = 0, differs_from_one_pass = 0;
  struct Rows {
    int groups, dim;
    kv::RowFormat format;
  };
  for (int P : {4, 16}) {
    for (int g : {1, 3}) {
      for (const Rows rs : {Rows{1, 16, kv::RowFormat::f32}, Rows{2, 20, kv::RowFormat::bf16},
                            Rows{2, 32, kv::RowFormat::int4}}) {
        const LearnedCase lc(rng, N, {1, 17, 113, 300, 777}, g, P, rs.groups, rs.dim, rs.format,
                             2.0f);
        const test::SelCase& c = lc.c;
        const kv::PageTable t = c.table.table();
        const kv::PageCodesView pc = c.cache.page_codes();
        const select::SelectArgs a = lc.args();
        for (int trial = 0; trial < 3; ++trial) {
          select::SelectorConfig cfg;
          cfg.method = select::Method::learned_codes;
          cfg.budget = {select::Budget::Kind::fixed, 24 + 16 * trial, 0.9};
          cfg.sink_pages = trial % 3;
          cfg.learned_candidates = 1 + 2 * trial;
          select::SelectOutput got, spare, one_pass;
          select::run_selector(a, cfg, got);
          select::SelectorConfig all = cfg;
          all.learned_candidates = 1 << 20;
          select::run_selector(a, all, spare);
          select::SelectorConfig tc = cfg;
          tc.method = select::Method::token_codes;
          tc.code_channels = 1;
          select::run_selector(a, tc, one_pass);
          for (int b = 0; b < c.B; ++b) {
            const int pages = t.num_pages(b);
            const std::int64_t L = t.length(b, P);
            const auto phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), pages);
            for (int h = 0; h < 2; ++h) {
              const std::vector<double> s = lc.scores(b, rs.groups == 1 ? 0 : h);
              std::vector<std::uint8_t> in = reference_kept(c, cfg, b);
              const int count = static_cast<int>(std::count(in.begin(), in.end(), 1));
              const int cap = static_cast<int>(std::min<std::int64_t>(L, std::max<std::int64_t>(count, cfg.budget.tokens)));
              std::vector<std::uint8_t> cand = in;
              const std::int64_t want_n = std::min<std::int64_t>(L, static_cast<std::int64_t>(cfg.learned_candidates) * cap);
              reference_fill_by(s, cand, count, static_cast<int>(want_n));
              std::set<std::int64_t> cand_pages;
              for (std::int64_t x = 0; x < L; ++x) {
                if (cand[static_cast<std::size_t>(x)]) cand_pages.insert(x / P);
              }
              ASSERT_EQ(got.code_pages[static_cast<std::size_t>(b) * 2 + h],
                        static_cast<std::int32_t>(cand_pages.size()));
              std::vector<double> agg(static_cast<std::size_t>(L), -inf);
              for (int i = 0; i < g; ++i) {
                std::vector<std::int16_t> q8;
                const kv::CodeQuery cq = reference_query(c, b, h * g + i, q8);
                std::vector<double> full(static_cast<std::size_t>(L));
                for (std::int64_t x = 0; x < L; ++x) {
                  full[static_cast<std::size_t>(x)] = kv::page_code_score(
                      cq, pc.range(phys[x / P], h), pc.row(phys[x / P], h, static_cast<int>(x % P)), 32);
                }
                reference_pool_log_prob(full, cand, agg);
              }
              reference_fill_by(agg, in, count, cap);
              const std::vector<std::int32_t> want = ids_in(in);
              const auto x = got.selection.view().list(b, h);
              ASSERT_EQ(std::vector<std::int32_t>(x.begin(), x.end()), want)
                  << "P " << P << " g " << g << " rows " << rs.groups << "x" << rs.dim << " "
                  << kv::to_string(rs.format) << " trial " << trial << " b " << b << " h " << h;
              const auto o = one_pass.selection.view().list(b, h);
              const auto sp = spare.selection.view().list(b, h);
              ASSERT_EQ(std::vector<std::int32_t>(sp.begin(), sp.end()),
                        std::vector<std::int32_t>(o.begin(), o.end()))
                  << "candidates to spare: token_codes' one pass";
              differs_from_one_pass += std::vector<std::int32_t>(o.begin(), o.end()) != want;
              ++lists;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(lists, 2 * 2 * 3 * 3 * 5 * 2);
  EXPECT_GT(differs_from_one_pass, 20);  // the learned first pass changes lists
}

// A top-p budget pMASS:CAP on the codes (token_codes in one pass, learned_codes): the lists
// and estimates of a plain reference. Each head's mass estimate is the softmax of its code
// scores over the tokens it scored (one pass: every token; learned_codes: the candidates of
// the cap, the rest 0); the heads' log-probabilities pooled by the max rank the tokens, their
// masses pooled by the mean stop the fill once the selection holds MASS (kept tokens first),
// at most CAP. A q head's estimate is its own selected mass. A fixed budget computes no mass
// (estimate NaN).
TEST(TokenCodes, TopPBudgetsStopAtTheHeadsMeanSoftmaxMass) {
  test::OneThread one;
  std::mt19937 rng(43);
  std::normal_distribution<float> N(0.0f, 1.0f);
  constexpr double inf = std::numeric_limits<double>::infinity();
  int lists = 0, stopped_early = 0;
  for (int P : {4, 16}) {
    for (int g : {1, 3}) {
      // Keys scaled up so that the heads' attention is peaked (top-p then stops early).
      const LearnedCase lc(rng, N, {1, 17, 113, 300, 777}, g, P, 1, 16, kv::RowFormat::f32, 6.0f);
      const test::SelCase& c = lc.c;
      const kv::PageTable t = c.table.table();
      const kv::PageCodesView pc = c.cache.page_codes();
      const select::SelectArgs a = lc.args();
      for (const bool learned : {false, true}) {
        for (int trial = 0; trial < 3; ++trial) {
          select::SelectorConfig cfg;
          cfg.method = learned ? select::Method::learned_codes : select::Method::token_codes;
          cfg.code_channels = 1;
          const double p = 0.5 + 0.2 * trial;
          cfg.budget = {select::Budget::Kind::top_p, 48 + 32 * trial, p};
          cfg.sink_pages = trial % 2;
          cfg.learned_candidates = 2;
          select::SelectOutput got, fixed;
          select::run_selector(a, cfg, got);
          select::SelectorConfig fx = cfg;
          fx.budget.kind = select::Budget::Kind::fixed;
          select::run_selector(a, fx, fixed);
          for (int b = 0; b < c.B; ++b) {
            const int pages = t.num_pages(b);
            const std::int64_t L = t.length(b, P);
            const auto phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), pages);
            for (int h = 0; h < 2; ++h) {
              std::vector<std::uint8_t> in = reference_kept(c, cfg, b);
              int count = static_cast<int>(std::count(in.begin(), in.end(), 1));
              const int cap = static_cast<int>(std::min<std::int64_t>(L, std::max<std::int64_t>(count, cfg.budget.tokens)));
              std::vector<std::uint8_t> cand(static_cast<std::size_t>(L), 1);
              if (learned) {  // the kept tokens and the best others by ŝ, 2 × cap in all
                cand = in;
                reference_fill_by(lc.scores(b, 0), cand, count,
                                  static_cast<int>(std::min<std::int64_t>(L, 2 * cap)));
              }
              std::vector<double> agg(static_cast<std::size_t>(L), -inf), mass(static_cast<std::size_t>(L), 0.0);
              std::vector<std::vector<double>> head_mass(static_cast<std::size_t>(g),
                                                         std::vector<double>(static_cast<std::size_t>(L), 0.0));
              for (int i = 0; i < g; ++i) {
                std::vector<std::int16_t> q8;
                const kv::CodeQuery cq = reference_query(c, b, h * g + i, q8);
                std::vector<double> full(static_cast<std::size_t>(L));
                double mx = -inf, sum = 0;
                for (std::int64_t x = 0; x < L; ++x) {
                  full[x] = kv::page_code_score(cq, pc.range(phys[x / P], h),
                                                pc.row(phys[x / P], h, static_cast<int>(x % P)), 32);
                  if (cand[x]) mx = std::max(mx, full[x]);
                }
                for (std::int64_t x = 0; x < L; ++x) sum += cand[x] ? std::exp(full[x] - mx) : 0.0;
                for (std::int64_t x = 0; x < L; ++x) {
                  if (cand[x]) head_mass[i][x] = std::exp(full[x] - mx) / sum;
                  mass[x] += head_mass[i][x] / g;
                }
                reference_pool_log_prob(full, learned ? cand : std::vector<std::uint8_t>{}, agg);
              }
              std::vector<std::pair<double, std::int32_t>> order;
              for (std::int64_t x = 0; x < L; ++x) order.push_back({agg[x], static_cast<std::int32_t>(x)});
              double have = 0;
              for (std::int64_t x = 0; x < L; ++x) have += in[x] ? mass[x] : 0.0;
              for (const std::int32_t x : ranked(order)) {
                if (count >= cap || have >= p) break;
                if (in[x]) continue;
                in[x] = 1;
                ++count;
                have += mass[x];
              }
              const std::vector<std::int32_t> want = ids_in(in);
              const auto x = got.selection.view().list(b, h);
              ASSERT_EQ(std::vector<std::int32_t>(x.begin(), x.end()), want)
                  << (learned ? "learned_codes" : "token_codes") << " P " << P << " g " << g
                  << " trial " << trial << " b " << b << " h " << h;
              for (int i = 0; i < g; ++i) {  // each head's own selected mass
                double est = 0;
                for (std::int64_t y = 0; y < L; ++y) est += in[y] ? head_mass[i][y] : 0.0;
                const std::size_t at = static_cast<std::size_t>(b) * 2 * g + h * g + i;
                ASSERT_NEAR(got.estimate[at], est, 1e-9);
                ASSERT_TRUE(std::isnan(fixed.estimate[at])) << "a fixed budget computes no mass";
              }
              const auto f = fixed.selection.view().list(b, h);
              ASSERT_TRUE(std::includes(f.begin(), f.end(), x.begin(), x.end()))
                  << "the top-p list is a prefix of the fixed budget's ranking";
              stopped_early += x.size() < f.size();
              ++lists;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(lists, 2 * 2 * 2 * 3 * 5 * 2);
  EXPECT_GT(stopped_early, 30);  // the mass stops most lists before the cap
}

TEST(LearnedCodes, RefusesMissingInputsAndBadSettingsNamingThem) {
  std::mt19937 rng(5);
  const std::vector<int> lengths{100};
  test::KeyRowsSpec spec{1, 16, kv::RowFormat::f32, {std::vector<float>(100 * 16, 0.5f)}};
  const test::SelCase c = test::random_case(rng, lengths, 4, 2, 32, 16, DType::f32, 2.0f, 0.5f,
                                            0.7f, /*page_codes=*/true, &spec);
  std::vector<float> lq(16, 1.0f);
  select::SelectorConfig cfg;
  cfg.method = select::Method::learned_codes;
  cfg.budget = {select::Budget::Kind::fixed, 32, 0.9};
  select::SelectOutput out;
  select::SelectArgs a = c.args();
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "learned_keys");
  a.learned_keys = c.cache.key_rows();
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::shape_mismatch,
                     "learned_q");
  a.learned_q = View3<const float>::contiguous(lq.data(), 1, 1, 16);
  select::run_selector(a, cfg, out);  // complete: runs
  EXPECT_EQ(out.selection.view().list(0, 0).size(), 32u);
  a.page_codes = {};
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "page_codes");
  a = c.args();
  a.learned_keys = c.cache.key_rows();
  a.learned_q = View3<const float>::contiguous(lq.data(), 1, 1, 16);
  cfg.learned_candidates = 0;
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "learned_candidates");
  cfg.learned_candidates = 4;
  cfg.budget = {select::Budget::Kind::top_p, 0, 0.9};  // no cap: the learned pass unused
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "budget");
  cfg.budget = {select::Budget::Kind::adaptive, 0, 0.9};
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "budget");
  cfg.budget = {select::Budget::Kind::top_p, 32, 0.9};  // with a cap: runs
  select::run_selector(a, cfg, out);
  lq[3] = std::nanf("");
  cfg.budget = {select::Budget::Kind::fixed, 32, 0.9};
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::non_finite,
                     "learned_q");
}

TEST(TokenCodes, TwoPassesRefuseBadSettingsNamingThem) {
  std::mt19937 rng(3);
  test::SelCase c = test::random_case(rng, {100}, 4, 2, 32, 16, DType::f16, 2.0f, 0.5f, 0.7f,
                                      /*page_codes=*/true);
  select::SelectorConfig cfg;
  cfg.method = select::Method::token_codes;
  cfg.budget = {select::Budget::Kind::fixed, 32, 0.9};
  select::SelectOutput out;
  for (double f : {0.0, -0.5, 1.5, std::nan("")}) {
    cfg.code_channels = f;
    test::expect_error([&] { select::run_selector(c.args(), cfg, out); },
                       ErrorCode::invalid_argument, "code_channels");
  }
  cfg.code_channels = 0.5;
  // An adaptive budget stops on the codes' mass estimate (0.9 of the mean over the group's q
  // heads of each one's softmax over the tokens it scored), with or without a cap.
  cfg.budget = {select::Budget::Kind::adaptive, 0, 0.9};
  select::run_selector(c.args(), cfg, out);
  EXPECT_LT(out.selection.view().list(0, 0).size(), 100u);
  for (int h = 0; h < 2; ++h) EXPECT_GE(out.estimate[2 * h] + out.estimate[2 * h + 1], 1.8 - 1e-12);
  cfg.budget = {select::Budget::Kind::adaptive, 32, 0.9};
  select::run_selector(c.args(), cfg, out);
  EXPECT_LE(out.selection.view().list(0, 0).size(), 32u);
  cfg.budget = {select::Budget::Kind::fixed, 32, 0.9};
  cfg.code_candidates = 0;
  test::expect_error([&] { select::run_selector(c.args(), cfg, out); },
                     ErrorCode::invalid_argument, "code_candidates");
  cfg.code_candidates = 2;
  select::SelectArgs a = c.args();
  a.page_codes.chan_codes = nullptr;  // a view made by hand, without the copy
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "page_codes");
  a = c.args();
  a.page_codes.chan_spread = nullptr;  // without the spread rows: only the |q| rule runs
  test::expect_error([&] { select::run_selector(a, cfg, out); }, ErrorCode::invalid_argument,
                     "page_codes");
  cfg.code_channel_spread = false;
  EXPECT_NO_THROW(select::run_selector(a, cfg, out));
}

// The log-prob rule's LSE (select/log_prob.hpp: polynomial exp and log, an integer sum) against
// a long-double LSE on random rows of many lengths and spreads: within n · 2^-41 + 1e-12 (each
// term is rounded to 2^-40 of the best one's; the polynomials are good to ~1e-15). Its pieces
// against std::exp / std::log: half a unit, 1e-14 relative.
TEST(TokenCodes, LogProbLseMatchesALongDoubleReference) {
  std::mt19937 rng(5);
  int rows = 0;
  for (int n : {1, 2, 7, 64, 1000, 40000}) {
    for (double spread : {0.01, 1.0, 5.0, 30.0, 300.0}) {
      std::normal_distribution<double> N(3.0, spread);
      std::vector<double> x(static_cast<std::size_t>(n));
      double m = -std::numeric_limits<double>::infinity();
      for (double& v : x) m = std::max(m, v = N(rng));
      std::uint64_t sum = 0;
      long double ref = 0;
      for (const double v : x) {
        sum += select::lse_term(v - m);
        ref += std::exp(static_cast<long double>(v - m));
      }
      const double want = static_cast<double>(m + std::log(ref));
      EXPECT_NEAR(select::lse_finish(m, sum), want, n * 0x1p-41 + 1e-12)
          << "n " << n << " spread " << spread;
      ++rows;
    }
  }
  EXPECT_EQ(rows, 30);
  std::uniform_real_distribution<double> U(-27.5, 0.0);
  for (int i = 0; i < 20000; ++i) {
    const double v = i == 0 ? 0.0 : U(rng);
    const double term = static_cast<double>(select::lse_term(v));
    const double want = std::ldexp(std::exp(v), select::kLseFracBits);
    ASSERT_LE(std::abs(term - want), 0.5 + 1e-14 * want) << v;  // rounding: half a unit
  }
  // The AVX2 sum gives the portable one's integer (rows of every length mod 4, NaN, +inf
  // scores above the max, block edges).
  if (cpu::has_avx2()) {
    for (int n : {0, 1, 3, 4, 5, 4095, 4096, 4099, 10001}) {
      std::normal_distribution<double> N(0.0, 6.0);
      std::vector<double> x(static_cast<std::size_t>(n));
      for (double& v : x) v = N(rng);
      if (n > 5) x[3] = std::numeric_limits<double>::quiet_NaN(), x[5] = 40.0, x[2] = -0.0;
      EXPECT_EQ(select::detail::lse_sum_avx2(x.data(), n, 0.5),
                select::lse_sum_portable(x.data(), n, 0.5)) << n;
      // Mostly −inf (a second pass's row: finite on its candidates only) and runs far below
      // the max: whole vectors of dead terms, which the AVX2 loop skips.
      for (std::size_t j = 0; j < x.size(); ++j) {
        if (j % 8 != 1) x[j] = j % 16 < 8 ? -std::numeric_limits<double>::infinity() : -29.0 - static_cast<double>(j % 5);
      }
      EXPECT_EQ(select::detail::lse_sum_avx2(x.data(), n, 0.5),
                select::lse_sum_portable(x.data(), n, 0.5)) << "sparse " << n;
    }
  }
  EXPECT_EQ(select::lse_term(-28.5), 0u);
  EXPECT_EQ(select::lse_term(0.0), 1ull << select::kLseFracBits);
  EXPECT_EQ(select::lse_term(std::numeric_limits<double>::quiet_NaN()), 0u);
  for (const std::uint64_t s : {1ull, 2ull, 3ull, 1ull << 40, (1ull << 40) + 12345, 987654321ull << 20}) {
    const double want = std::log(static_cast<double>(s)) - select::kLseFracBits * std::log(2.0);
    EXPECT_NEAR(select::lse_finish(0.0, s), want, 1e-14 * std::max(1.0, std::abs(want))) << s;
  }
}

TEST(TwoStage, FindsPlantedKeysThatAPageBoundRanksLow) {
  // One sequence of noisy pages; three tokens in three pages point along q. Their pages' boxes
  // are as wide as the others', so Quest's page bound cannot single them out, but with four
  // candidate pages per budget page the token stage finds them.
  test::OneThread one;
  std::mt19937 rng(23);
  std::normal_distribution<float> N(0.0f, 1.0f);
  const int d = 32, P = 16, L = 1024, Hkv = 1;
  std::vector<float> k(static_cast<std::size_t>(L) * d), v(k.size()), q(d);
  for (float& x : q) x = N(rng);
  const double qn = std::sqrt(std::inner_product(q.begin(), q.end(), q.begin(), 0.0));
  for (std::size_t i = 0; i < k.size(); ++i) {
    k[i] = 2.0f * N(rng);
    v[i] = N(rng);
  }
  const int planted[] = {200, 517, 800};
  for (int t : planted) {
    for (int x = 0; x < d; ++x) k[static_cast<std::size_t>(t) * d + x] = 4.0f * q[x] / static_cast<float>(qn) * std::sqrt(static_cast<float>(d));
  }
  test::SelCase c = test::make_case({k}, {v}, q, 1, Hkv, d, P, DType::f32, true);
  select::SelectorConfig cfg;
  cfg.method = select::Method::two_stage;
  cfg.budget = {select::Budget::Kind::fixed, 64, 0.9};
  cfg.candidate_factor = 16;  // all pages
  select::SelectOutput out;
  select::run_selector(c.args(), cfg, out);
  const auto list = out.selection.view().list(0, 0);
  const std::set<int> have(list.begin(), list.end());
  for (int t : planted) EXPECT_TRUE(have.count(t)) << "planted token " << t;
  EXPECT_EQ(static_cast<int>(list.size()), 64);
}

TEST(TwoStage, RefusesWhatItCannotServeNamingTheArgument) {
  std::mt19937 rng(3);
  test::SelCase with = test::random_case(rng, {50}, 2, 1, 16, 4, DType::f16, 2.0f, 0.5f, 0.7f, true);
  test::SelCase without = test::random_case(rng, {50}, 2, 1, 16, 4, DType::f16);
  select::SelectorConfig cfg;
  cfg.method = select::Method::two_stage;
  cfg.budget = {select::Budget::Kind::fixed, 16, 0.9};
  select::SelectOutput out;
  test::expect_error([&] { select::run_selector(without.args(), cfg, out); }, ErrorCode::invalid_argument, "page_codes");
  cfg.candidate_factor = 0;
  test::expect_error([&] { select::run_selector(with.args(), cfg, out); }, ErrorCode::invalid_argument, "candidate_factor");
  cfg.candidate_factor = 2;
  cfg.budget.kind = select::Budget::Kind::top_p;
  test::expect_error([&] { select::run_selector(with.args(), cfg, out); }, ErrorCode::invalid_argument, "budget");
  EXPECT_EQ(select::parse_method("two_stage", "m"), select::Method::two_stage);
}

}  // namespace
}  // namespace masskv
