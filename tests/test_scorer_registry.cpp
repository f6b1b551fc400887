// The scorer registry (src/select/registry.cpp, docs/design.md §3 "Adding a scorer"): a scorer
// registered from outside the library (tests/dummy_scorer.cpp) runs through the public
// run_selector with a library rule, against a plain reference of what that rule does with its
// ranking and masses; a rule refuses a scorer that lacks what it needs, naming the argument.
// The GPU half (the same scorer through its device functor on the hierarchical top-k path)
// comes with part 3's device-side step of issue 29.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "expect_error.hpp"
#include "masskv/select/selector.hpp"
#include "select/group.hpp"
#include "select/scorer.hpp"
#include "selector_fixture.hpp"

namespace masskv::select {
namespace detail {
extern const Scorer scorer_oldest_first;
}  // namespace detail
namespace {

// The one registration call: what a program with its own scorer adds.
void register_oldest_first() {
  static const bool once = (detail::register_scorer(detail::scorer_oldest_first), true);
  (void)once;
}

// What rule top_k makes of oldest_first for one (sequence, kv head): the kept pages, then the
// oldest pages until the cap, or (top-p budget) until the token share held reaches p.
std::vector<std::int32_t> reference(const kv::PageTable& t, int P, int b,
                                    const SelectorConfig& c, double* held) {
  const int pages = t.num_pages(b);
  const std::int64_t L = t.length(b, P);
  const KeptRanges<int> k = kept_pages(pages, L, P, c.sink_pages, c.window_tokens);
  std::vector<std::uint8_t> in(static_cast<std::size_t>(pages), 0);
  auto share = [&](int j) {
    return static_cast<double>(std::min<std::int64_t>(P, L - static_cast<std::int64_t>(j) * P)) /
           static_cast<double>(L);
  };
  int count = 0;
  double have = 0;
  for (int j = 0; j < pages; ++j) {
    if (j < k.first_end || j >= k.last_begin) {
      in[static_cast<std::size_t>(j)] = 1;
      ++count;
      have += share(j);
    }
  }
  const int cap =
      c.budget.tokens > 0
          ? std::min(pages, std::max(count, static_cast<int>((c.budget.tokens + P - 1) / P)))
          : pages;
  const double p = c.budget.kind == Budget::Kind::fixed ? 2.0 : c.budget.p;
  for (int j = 0; j < pages && count < cap && have < p; ++j) {
    if (in[static_cast<std::size_t>(j)]) continue;
    in[static_cast<std::size_t>(j)] = 1;
    ++count;
    have += share(j);
  }
  std::vector<std::int32_t> list;
  *held = 0;
  for (int j = 0; j < pages; ++j) {
    if (!in[static_cast<std::size_t>(j)]) continue;
    list.push_back(j);
    *held += share(j);
  }
  return list;
}

TEST(ScorerRegistry, ARegisteredScorerRunsThroughRunSelectorWithALibraryRule) {
  register_oldest_first();
  test::OneThread one;
  std::mt19937 rng(29);
  int checked = 0, stopped = 0;
  for (int g : {1, 3}) {
    test::SelCase c = test::random_case(rng, {1, 40, 150, 333}, 2 * g, 2, 16, 16, DType::f32);
    for (auto kind : {Budget::Kind::fixed, Budget::Kind::top_p}) {
      for (auto rule : {GroupRule::union_heads, GroupRule::aggregate}) {
        SelectorConfig cfg;
        cfg.method = Method::quest;  // its rule: top_k
        cfg.scorer = "oldest_first";
        cfg.group = rule;
        cfg.sink_pages = 1;
        cfg.window_tokens = 20;
        cfg.budget = {kind, kind == Budget::Kind::fixed ? 96 : 0, 0.4};
        SelectOutput out;
        run_selector(c.args(), cfg, out);
        const SelectionView sv = out.selection.view();
        for (int b = 0; b < c.B; ++b) {
          for (int h = 0; h < c.Hkv; ++h) {
            double held = 0;
            const auto want = reference(c.table.table(), c.P, b, cfg, &held);
            const auto got = sv.list(b, h);
            EXPECT_EQ(std::vector<std::int32_t>(got.begin(), got.end()), want)
                << "g " << g << " kind " << static_cast<int>(kind) << " b " << b << " h " << h;
            for (int i = 0; i < g; ++i) {
              EXPECT_NEAR(out.estimate[static_cast<std::size_t>((b * c.Hkv + h) * g + i)], held,
                          1e-12);
            }
            ++checked;
            if (kind == Budget::Kind::top_p &&
                static_cast<int>(want.size()) < c.table.table().num_pages(b)) {
              ++stopped;  // the top-p budget stopped on the scorer's masses
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(checked, 64);
  EXPECT_GT(stopped, 8);
}

TEST(ScorerRegistry, NamingTheMethodsOwnScorerChangesNothing) {
  test::OneThread one;
  std::mt19937 rng(3);
  test::SelCase c = test::random_case(rng, {150, 77}, 6, 2, 16, 16, DType::f16);
  SelectorConfig cfg;
  cfg.budget.tokens = 64;
  SelectOutput own, named;
  run_selector(c.args(), cfg, own);
  cfg.scorer = "page_bound";
  run_selector(c.args(), cfg, named);
  EXPECT_EQ(own.selection.ids, named.selection.ids);
  EXPECT_EQ(own.estimate, named.estimate);
}

TEST(ScorerRegistry, RulesRefuseScorersLackingWhatTheyNeedNamingTheArgument) {
  register_oldest_first();
  std::mt19937 rng(4);
  test::SelCase c = test::random_case(rng, {60}, 2, 1, 16, 16, DType::f32);
  SelectOutput out;
  SelectorConfig cfg;
  cfg.method = Method::entmax_support;  // the growth rule needs a logit bound
  cfg.mapping = Mapping::entmax(1.5);
  cfg.budget.tokens = 32;
  cfg.scorer = "oldest_first";
  test::expect_error([&] { run_selector(c.args(), cfg, out); }, ErrorCode::invalid_argument,
                     "scorer", "a logit bound");
  cfg.method = Method::quest;
  cfg.budget = {Budget::Kind::top_p, 0, 0.9};
  cfg.scorer = "recency";  // no mass estimate for a top-p budget to stop on
  test::expect_error([&] { run_selector(c.args(), cfg, out); }, ErrorCode::invalid_argument,
                     "budget", "mass estimate");
  cfg.scorer = "no_such_scorer";
  test::expect_error([&] { run_selector(c.args(), cfg, out); }, ErrorCode::invalid_argument,
                     "scorer", "no_such_scorer");
  test::expect_error([] { detail::register_scorer(detail::scorer_oldest_first); },
                     ErrorCode::invalid_argument, "scorer", "already registered");
}

}  // namespace
}  // namespace masskv::select

namespace masskv {
namespace {

// order_by against a plain full sort: best first, ties to the lower id, the first `limit`;
// ranks with many ties and -inf, eligibility masks, limits from 1 to past n (the sampled
// threshold runs where the limit is a small part of n, the plain path elsewhere).
TEST(OrderBy, EqualsTheFirstItemsOfAFullSort) {
  std::mt19937 rng(31);
  int lists = 0;
  for (int n : {1, 7, 128, 129, 1000, 4096, 5000}) {
    for (int limit : {1, 8, 16, 64, 256, 1 << 20}) {
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<double> rank(static_cast<std::size_t>(n));
        std::vector<std::uint8_t> elig(static_cast<std::size_t>(n));
        std::normal_distribution<double> N(0.0, 1.0);
        for (int j = 0; j < n; ++j) {
          rank[j] = kind == 1   ? std::floor(4 * N(rng))  // heavy ties
                    : kind == 2 ? (j % 5 == 0 ? -std::numeric_limits<double>::infinity() : N(rng))
                    : kind == 3 ? static_cast<double>(j % 3)  // three values only
                                : N(rng);
          elig[j] = static_cast<std::uint8_t>(rng() % 4 != 0);
        }
        for (const bool masked : {false, true}) {
          std::vector<std::int32_t> want;
          for (int j = 0; j < n; ++j) {
            if (!masked || elig[j]) want.push_back(j);
          }
          std::stable_sort(want.begin(), want.end(),
                           [&](std::int32_t a, std::int32_t b) { return rank[a] > rank[b]; });
          if (want.size() > static_cast<std::size_t>(limit)) want.resize(limit);
          std::vector<std::int32_t> got;
          select::detail::order_by(rank.data(), n, masked ? elig.data() : nullptr, limit, got);
          ASSERT_EQ(got, want) << "n " << n << " limit " << limit << " kind " << kind
                               << " masked " << masked;
          ++lists;
        }
      }
    }
  }
  EXPECT_EQ(lists, 7 * 6 * 4 * 2);
}

}  // namespace
}  // namespace masskv
