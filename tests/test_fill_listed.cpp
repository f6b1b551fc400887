// The shared fill over rank rows of a subset of the items (Ranked::items, what token_codes' two
// passes hand rule top_k): the same selection as the rows of every item with −inf elsewhere,
// whichever GQA pooling, including the cases where an unlisted item can enter (fewer listed
// items than the cap, listed items ranked −inf), which fall back to the full rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "select/group.hpp"

namespace masskv::select::detail {
namespace {

struct Pooling {
  bool aggregate, log_prob;
};

TEST(FillListed, SubsetRowsSelectWhatTheFullRowsSelect) {
  std::mt19937 rng(53);
  std::normal_distribution<double> normal(0.0, 3.0);
  int checked = 0, short_lists = 0, dead_ranks = 0;
  for (const Pooling pool : {Pooling{true, true}, Pooling{true, false}, Pooling{false, false}}) {
    for (int trial = 0; trial < 200; ++trial) {
      const int n = 1 + static_cast<int>(rng() % 600), rows = 1 + static_cast<int>(rng() % 4);
      Group G;
      G.g = rows;
      G.n = n;
      // A random subset, ascending; sometimes smaller than the cap.
      std::vector<std::int32_t> items;
      const unsigned keep = 1 + rng() % 4;
      for (int j = 0; j < n; ++j) {
        if (rng() % keep == 0) items.push_back(j);
      }
      if (items.empty()) items.push_back(static_cast<std::int32_t>(rng() % n));
      const int K = static_cast<int>(items.size());
      std::vector<double> sub(static_cast<std::size_t>(rows) * K);
      std::vector<double> full(static_cast<std::size_t>(rows) * n, -kInf);
      const bool dead = trial % 7 == 0;  // some listed items ranked −inf
      for (int i = 0; i < rows; ++i) {
        for (int k = 0; k < K; ++k) {
          double v = std::round(normal(rng) * 4) / 4;  // ties
          if (dead && rng() % 3 == 0) v = -kInf;
          sub[static_cast<std::size_t>(i) * K + k] = v;
          full[static_cast<std::size_t>(i) * n + items[static_cast<std::size_t>(k)]] = v;
        }
      }
      // Kept items: a prefix and a suffix, inside the subset (as the scorer's candidates hold
      // them) or not.
      std::vector<std::uint8_t> in(static_cast<std::size_t>(n), 0);
      int count = 0;
      for (int j = 0; j < n; ++j) {
        if (j < n / 50 || j >= n - n / 40) {
          in[static_cast<std::size_t>(j)] = 1;
          ++count;
        }
      }
      const int cap = std::min(n, count + static_cast<int>(rng() % (n / 4 + 2)));
      short_lists += K < cap;
      dead_ranks += dead;
      auto run = [&](const Ranked& r) {
        Scratch S;
        S.in = in;
        const int got = fill_ranked(G, S, r, count, cap, kInf, count);
        EXPECT_EQ(got, static_cast<int>(std::count(S.in.begin(), S.in.end(), 1)));
        return S.in;
      };
      const Ranked whole{.rank = full.data(), .rows = rows, .aggregate = pool.aggregate,
                         .log_prob = pool.log_prob};
      Ranked listed = whole;
      listed.rank = sub.data();
      listed.items = items;
      ASSERT_EQ(run(listed), run(whole))
          << "n " << n << " K " << K << " cap " << cap << " rows " << rows << " aggregate "
          << pool.aggregate << " log_prob " << pool.log_prob << " trial " << trial;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 600);
  EXPECT_GT(short_lists, 20);  // the fallback ran
  EXPECT_GT(dead_ranks, 50);
}

}  // namespace
}  // namespace masskv::select::detail
