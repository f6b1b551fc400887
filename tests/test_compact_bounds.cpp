// 8-bit and hierarchical page summaries (compact_bounds.hpp): the bounds stay above every
// exact score (f64), the codes are the tightest outward ones, the hierarchical selector equals
// flat Quest when it scores every group, and stays a valid selection when it does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/cpu_features.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"
#include "select/topk_rank.hpp"
#include "selector_fixture.hpp"

namespace masskv::select {
namespace {

using test::random_case;
using test::SelCase;

// max over the stored keys of logical pages [j0, j1) of sequence b: scale * q·k in f64.
double exact_max(const kv::PagedKVView& v, int b, int j0, int j1, int head, const float* q,
                 double scale) {
  double best = -INFINITY;
  for (int j = j0; j < j1; ++j) {
    for (int slot = 0; slot < v.table.page_len(b, j, v.page_size); ++slot) {
      const bf16* k = v.key<bf16>(v.table.page(b, j), head, slot);
      double dot = 0;
      for (int c = 0; c < v.head_dim; ++c) dot += double(q[c]) * bf16_to_f32(k[c]);
      best = std::max(best, scale * dot);
    }
  }
  return best;
}

TEST(BoundStore8, CodesAreTheTightestOutwardOnes) {
  std::mt19937 rng(3);
  for (int d : {16, 64, 128}) {
    const SelCase sc =
        random_case(rng, {300, 17}, 2, 2, d, 16, DType::bf16, 2.0f, 0.5f, d == 64 ? 8.0f : 0.7f);
    const kv::SummariesView s = sc.cache.summaries();
    const BoundStore8 store(s);
    const BoundStore8View v = store.view();
    for (std::int32_t p : sc.table.indices) {
      for (int h = 0; h < 2; ++h) {
        const float lo = v.grid[2 * (p * 2 + h)], step = v.grid[2 * (p * 2 + h) + 1];
        for (int c = 0; c < d; ++c) {
          const std::int64_t o = v.at(p, h) + c;
          const float m = s.min[o], M = s.max[o];
          ASSERT_LE(dequant8(v.min[o], lo, step), m);
          ASSERT_GE(dequant8(v.max[o], lo, step), M);
          if (v.min[o] < 255) {
            EXPECT_GT(dequant8(static_cast<std::uint8_t>(v.min[o] + 1), lo, step), m);
          }
          if (v.max[o] > 0) {
            EXPECT_LT(dequant8(static_cast<std::uint8_t>(v.max[o] - 1), lo, step), M);
          }
        }
      }
    }
    EXPECT_DOUBLE_EQ(store.bytes_per_token(16), (2.0 * 2 * d + 16) / 16);
  }
}

// The 8-bit bound, the bf16 bound in the GPU order and the group bound are above every exact
// score (f64) of their pages; the bf16 GPU-order bound matches the AVX2 kernel's bits.
TEST(BoundStore8, BoundsAreAboveEveryScore) {
  std::mt19937 rng(5);
  int checked = 0;
  for (int d : {8, 64, 128}) {
    for (int P : {1, 16}) {
      const SelCase c = random_case(rng, {P == 1 ? 70 : 700}, 3, 2, d, P, DType::bf16, 2.0f, 0.5f,
                                    P == 1 ? 0.7f : 6.0f);
      const kv::PagedKVView v = c.view();
      const kv::SummariesView s = c.cache.summaries();
      const BoundStore store(s);
      const BoundStore8 store8(s);
      const kv::PageTable& t = v.table;
      const GroupStore groups(store.view(), t, 4);
      const int n = t.num_pages(0), g = 3, ng = (n + 3) / 4;
      std::vector<float> q(static_cast<std::size_t>(g) * d);
      std::normal_distribution<float> normal(0.0f, 5.0f);
      for (float& x : q) x = normal(rng);
      const float scale = 1.0f / std::sqrt(float(d));
      for (int h = 0; h < 2; ++h) {
        std::vector<float> u8(static_cast<std::size_t>(g) * n), ub(u8.size()), ua(u8.size());
        std::vector<float> ug(static_cast<std::size_t>(g) * ng);
        page_upper_bounds(store8.view(), t.indices, h, q.data(), g, d, scale, u8);
        page_upper_bounds_gpu_order(store.view(), t.indices, h, q.data(), g, d, scale, ub);
        page_upper_bounds(store.view(), t.indices, h, q.data(), g, d, scale, ua);
        page_upper_bounds_gpu_order(groups.view(), groups.indices(), h, q.data(), g, d, scale, ug);
        const bool same_order = d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed();
        for (int i = 0; i < g; ++i) {
          const float* qi = q.data() + i * d;
          for (int j = 0; j < n; ++j) {
            const double ex = exact_max(v, 0, j, j + 1, h, qi, scale);
            ASSERT_GE(u8[i * n + j], ex) << "8-bit, d " << d << " page " << j;
            ASSERT_GE(ub[i * n + j], ex) << "bf16 GPU order, d " << d << " page " << j;
            if (same_order) {
              EXPECT_EQ(ub[i * n + j], ua[i * n + j]) << "page " << j;
            }
            ++checked;
          }
          for (int gi = 0; gi < ng; ++gi) {
            const double ex = exact_max(v, 0, gi * 4, std::min(n, gi * 4 + 4), h, qi, scale);
            ASSERT_GE(ug[i * ng + gi], ex) << "group " << gi;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

// Two kv heads, four q heads each, d 64, page 16, bf16 keys with per-page shifts; the stores.
struct Stores {
  SelCase c;
  BoundStore store;
  BoundStore8 store8;
};
Stores make_stores(std::mt19937& rng, const std::vector<int>& lengths) {
  Stores s{random_case(rng, lengths, 8, 2, 64, 16, DType::bf16), {}, {}};
  s.store = BoundStore(s.c.cache.summaries());
  s.store8 = BoundStore8(s.c.cache.summaries());
  return s;
}

HierSelectArgs hier_args_of(const SelCase& c, const BoundStoreView& sv, const GroupStore& groups,
                            const TopkPolicy& pol, double cover) {
  HierSelectArgs a;
  a.q = c.qview();
  a.table = c.table.table();
  a.pages = &sv;
  a.groups = &groups;
  a.policy = pol;
  a.cover = cover;
  return a;
}

// Hierarchical and flat bf16 Quest on the same inputs.
void hier_and_flat(const Stores& s, const GroupStore& groups, const TopkPolicy& pol, double cover,
                   SelectionStorage& hier, SelectionStorage& flat,
                   std::vector<std::uint32_t>* keys = nullptr) {
  const BoundStoreView sv = s.store.view();
  const HierSelectArgs a = hier_args_of(s.c, sv, groups, pol, cover);
  hier_select(a, hier, keys);
  QuestArgs qa;
  qa.q = a.q;
  qa.table = a.table;
  qa.bounds_bf16 = &sv;
  qa.policy = pol;
  quest_select(qa, flat);
}

// Valid selections: ascending ids inside the sequence, counts as the flat selector's.
void expect_same_shape(const SelectionView& ref, const SelectionView& got, const kv::PageTable& t) {
  ASSERT_EQ(ref.batch, got.batch);
  for (int b = 0; b < ref.batch; ++b)
    for (int h = 0; h < ref.num_kv_heads; ++h) {
      const auto l = got.list(b, h);
      EXPECT_EQ(l.size(), ref.list(b, h).size());
      for (std::size_t i = 0; i < l.size(); ++i) {
        EXPECT_GE(l[i], 0);
        EXPECT_LT(l[i], t.num_pages(b));
        if (i) {
          EXPECT_LT(l[i - 1], l[i]);
        }
      }
    }
}

TEST(HierSelect, EqualsFlatQuestWhenEveryGroupIsScored) {
  std::mt19937 rng(11);
  const Stores s = make_stores(rng, {5000, 1200, 33});
  const kv::PageTable t = s.c.table.table();
  for (int G : {1, 4, 16}) {
    const GroupStore groups(s.store.view(), t, G);
    for (int budget : {0, 8, 40}) {
      SelectionStorage hier, flat;
      hier_and_flat(s, groups, {budget, 1, 64}, 1e6, hier, flat);  // every group
      expect_same_shape(flat.view(), hier.view(), t);
      const SelectionAgreement ag = compare_selections(flat.view(), hier.view());
      if (cpu::has_avx2() && cpu::simd_allowed()) {  // same bound bits: same lists
        EXPECT_EQ(ag.identical, ag.lists) << "G " << G << " budget " << budget;
      } else {
        EXPECT_GT(ag.recall, 0.99);
      }
    }
  }
}

// With 8-bit pages and every group scored: the 8-bit flat selector's lists and keys (both
// evaluate the bounds in the GPU order, on any host).
TEST(HierSelect, EightBitPagesEqualQuestSelect8WhenEveryGroupIsScored) {
  std::mt19937 rng(19);
  const Stores s = make_stores(rng, {3000, 700});
  const kv::PageTable t = s.c.table.table();
  const BoundStoreView sv = s.store.view();
  const BoundStore8View s8 = s.store8.view();
  const GroupStore groups(sv, t, 16);
  const TopkPolicy pol{24, 1, 64};
  HierSelectArgs a;
  a.q = s.c.qview();
  a.table = t;
  a.pages = &sv;
  a.pages8 = &s8;
  a.groups = &groups;
  a.policy = pol;
  a.cover = 1e6;
  SelectionStorage hier, flat;
  std::vector<std::uint32_t> hk, fk;
  hier_select(a, hier, &hk);
  quest_select8(a.q, t, 16, s8, 0, pol, flat, &fk);
  EXPECT_EQ(hk, fk);
  EXPECT_EQ(hier.ids, flat.ids);
  EXPECT_EQ(hier.count, flat.count);
}

// A few groups only: still the flat count, kept pages in, ids valid; the approximation's
// recall of flat Quest is measured (not asserted beyond sanity: random keys have no structure).
TEST(HierSelect, FewGroupsGiveAValidSelection) {
  std::mt19937 rng(13);
  const Stores s = make_stores(rng, {8000, 3000});
  const kv::PageTable t = s.c.table.table();
  const GroupStore groups(s.store.view(), t, 16);
  SelectionStorage hier, flat;
  std::vector<std::uint32_t> keys;
  hier_and_flat(s, groups, {32, 1, 64}, 1.0, hier, flat, &keys);
  expect_same_shape(flat.view(), hier.view(), t);
  const int stride = t.num_pages(0);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h) {
      const auto l = hier.view().list(b, h);
      EXPECT_EQ(l.front(), 0);                  // the sink
      EXPECT_EQ(l.back(), t.num_pages(b) - 1);  // the last page
      // Scored pages: those of 1 + ceil(32 / 16) = 3 groups at most.
      int scored = 0;
      for (int j = 0; j < t.num_pages(b); ++j) scored += keys[(b * 2 + h) * stride + j] != 0;
      EXPECT_LE(scored, 3 * 16);
      EXPECT_GE(scored, 16);
    }
  const SelectionAgreement ag = compare_selections(flat.view(), hier.view());
  EXPECT_GT(ag.recall, 0.0);
  EXPECT_LE(ag.recall, 1.0);
}

// ---- Gaussian-τ from pooled moments, entmax-aware ranking ---------------------------------

// Pooled moments are the moments of every token of the group's pages (f64 from the stored
// keys), to f32 rounding.
TEST(MomentStore, PoolsToTheMomentsOfTheGroupsTokens) {
  std::mt19937 rng(31);
  const SelCase c = random_case(rng, {1000, 77}, 8, 2, 64, 16, DType::bf16);
  const kv::PageTable t = c.table.table();
  const kv::PagedKVView v = c.view();
  for (int G : {1, 3, 16}) {
    const MomentStore ms(c.cache.summaries(), t, G);
    const kv::SummariesView mv = ms.view();
    for (int b = 0; b < 2; ++b)
      for (int gi = 0; gi * G < t.num_pages(b); ++gi) {
        const int slot = ms.indptr()[b] + gi;
        for (int h = 0; h < 2; ++h)
          for (int ch = 0; ch < 64; ch += 7) {
            double n = 0, sum = 0;
            for (int j = gi * G; j < std::min(t.num_pages(b), (gi + 1) * G); ++j)
              for (int s = 0; s < t.page_len(b, j, 16); ++s) {
                sum += bf16_to_f32(v.key<bf16>(t.page(b, j), h, s)[ch]);
                ++n;
              }
            const double mean = sum / n;
            double m2 = 0;
            for (int j = gi * G; j < std::min(t.num_pages(b), (gi + 1) * G); ++j)
              for (int s = 0; s < t.page_len(b, j, 16); ++s) {
                const double x = bf16_to_f32(v.key<bf16>(t.page(b, j), h, s)[ch]) - mean;
                m2 += x * x;
              }
            ASSERT_EQ(mv.count[slot], static_cast<int>(n));
            const std::int64_t at = mv.at(slot, h) + ch;
            EXPECT_NEAR(mv.mean[at], mean, 2e-6 * (1 + std::fabs(mean))) << "G " << G;
            EXPECT_NEAR(mv.m2[at], m2, 2e-5 * (1 + m2)) << "G " << G;
          }
      }
  }
}

// τ̂ from groups of one page is the page model's τ̂ (gaussian_tau_hat of each page's m, v in
// f64), and any τ̂ solves Σ_G N_G E_G(τ̂) = 1.
TEST(GroupTauHat, OnePageGroupsAreThePageModelAndTauSolvesTheModel) {
  std::mt19937 rng(37);
  const SelCase c = random_case(rng, {2000, 300}, 8, 2, 64, 16, DType::bf16);
  const kv::PageTable t = c.table.table();
  const kv::SummariesView ps = c.cache.summaries();
  const double scale = 1.0 / std::sqrt(64.0);
  for (double alpha : {1.5, 2.0, 1.25}) {
    for (int G : {1, 16}) {
      const MomentStore ms(ps, t, G);
      std::vector<double> tau(2 * 8);
      group_tau_hat(ms, c.qview(), 0.f, alpha, tau);
      const kv::SummariesView mv = ms.view();
      for (int b = 0; b < 2; ++b)
        for (int i = 0; i < 8; ++i) {
          const float* q = c.qview().row(b, i);
          std::vector<double> m, var, n;
          for (int gi = ms.indptr()[b]; gi < ms.indptr()[b + 1]; ++gi) {
            double dm = 0, dv = 0;
            for (int ch = 0; ch < 64; ++ch) {
              dm += double(q[ch]) * mv.mean[mv.at(gi, i / 4) + ch];
              dv += double(q[ch]) * q[ch] * std::max(0.0, double(mv.m2[mv.at(gi, i / 4) + ch]));
            }
            m.push_back(scale * dm);
            var.push_back(scale * scale * dv / mv.count[gi]);
            n.push_back(mv.count[gi]);
          }
          const double got = tau[static_cast<std::size_t>(b) * 8 + i];
          EXPECT_NEAR(got, gaussian_tau_hat(m, var, n, alpha), 1e-8 * std::max(1.0, std::fabs(got)));
          double total = 0;
          for (std::size_t j = 0; j < m.size(); ++j)
            total += n[j] * gaussian_entmax_mass(m[j], var[j], alpha, got);
          EXPECT_NEAR(total, 1.0, 1e-6) << "alpha " << alpha << " G " << G;
        }
    }
  }
}


// α = 2 and τ̂ = 0: the rank is the bound itself (one exact rounding), so the entmax-aware
// lists and keys are hierarchical Quest's.
TEST(HierSelect, EntmaxRankWithZeroTauAndAlphaTwoIsQuest) {
  std::mt19937 rng(41);
  const Stores s = make_stores(rng, {6000, 900});
  const BoundStoreView sv = s.store.view();
  const GroupStore groups(sv, s.c.table.table(), 16);
  const std::vector<double> zero(2 * 8, 0.0);
  for (double cover : {1.0, 4.0}) {
    HierSelectArgs a = hier_args_of(s.c, sv, groups, {40, 1, 64}, cover);
    SelectionStorage quest, ranked;
    std::vector<std::uint32_t> qk, rk;
    hier_select(a, quest, &qk);
    a.tau = zero.data();
    a.alpha = 2.0;
    hier_select(a, ranked, &rk);
    EXPECT_EQ(qk, rk);
    EXPECT_EQ(quest.ids, ranked.ids);
    EXPECT_EQ(quest.count, ranked.count);
  }
}

// The adaptive rule: every page it takes beyond the kept ones has rank > -margin, it holds at
// most the fixed budget's count, an all-admitting margin gives the fixed lists, and a margin
// nothing passes leaves the kept pages only.
TEST(HierSelect, AdaptiveRuleKeepsOnlyPagesThatCanReachTau) {
  std::mt19937 rng(43);
  const Stores s = make_stores(rng, {6000, 2500});
  const BoundStoreView sv = s.store.view();
  const kv::PageTable t = s.c.table.table();
  const GroupStore groups(sv, t, 16);
  const MomentStore ms(s.c.cache.summaries(), t, 16);
  std::vector<double> tau(2 * 8);
  group_tau_hat(ms, s.c.qview(), 0.f, 1.5, tau);
  const TopkPolicy pol{48, 1, 64};
  HierSelectArgs a = hier_args_of(s.c, sv, groups, pol, 4.0);
  a.tau = tau.data();
  a.alpha = 1.5;
  SelectionStorage fixed;
  std::vector<std::uint32_t> fk;
  hier_select(a, fixed, &fk);
  a.adaptive = true;
  a.margin = 1e30f;
  SelectionStorage all;
  hier_select(a, all);
  EXPECT_EQ(all.ids, fixed.ids);
  a.margin = -1e30f;
  SelectionStorage none;
  hier_select(a, none);
  // A margin at the 95th percentile of the scored pages' ranks: 1 in 20 is eligible (fewer
  // than the budget: cover 4 scores about 4 budgets' worth).
  std::vector<float> ranks;
  for (std::uint32_t k : fk)
    if (k != 0u) ranks.push_back(detail::topk_key_bound(static_cast<std::uint64_t>(k) << 32));
  const std::size_t at = ranks.size() * 19 / 20;
  std::nth_element(ranks.begin(), ranks.begin() + static_cast<std::ptrdiff_t>(at), ranks.end());
  const float top = ranks[at];
  long adaptive_total = 0, fixed_total = 0;
  for (float margin : {0.0f, 2.0f, -top}) {
    a.margin = margin;
    SelectionStorage got;
    std::vector<std::uint32_t> keys;
    hier_select(a, got, &keys);
    const int stride = t.num_pages(0);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        const auto l = got.view().list(b, h), f = fixed.view().list(b, h), k = none.view().list(b, h);
        EXPECT_LE(l.size(), f.size());
        EXPECT_GE(l.size(), k.size());
        // Kept pages (none's list) are in; every other page taken was keyed and is eligible.
        for (std::int32_t j : k) EXPECT_TRUE(std::binary_search(l.begin(), l.end(), j));
        for (std::int32_t j : l) {
          if (std::binary_search(k.begin(), k.end(), j)) continue;
          const std::uint32_t key = keys[(b * 2 + h) * stride + j];
          ASSERT_NE(key, 0u);
          EXPECT_GT(detail::topk_key_bound(static_cast<std::uint64_t>(key) << 32), -margin);
        }
        adaptive_total += static_cast<long>(l.size());
        fixed_total += static_cast<long>(f.size());
      }
  }
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h) EXPECT_LE(none.view().list(b, h).size(), 1u + 1u + 5u);
  EXPECT_LT(adaptive_total, fixed_total);  // the percentile margin cuts the budget
}

// ---- hierarchical top-p --------------------------------------------------------------------

HierTopPArgs top_p_args(const Stores& s, const BoundStoreView& sv, const GroupStore& groups,
                        const MomentStore& ms, const TopkPolicy& pol, double cover, double p) {
  HierTopPArgs a;
  a.hier = hier_args_of(s.c, sv, groups, pol, cover);
  a.pages = s.c.cache.summaries();
  a.moments = &ms;
  a.p = p;
  return a;
}

// With one-page moment groups and every group scored, the masses are each head's softmax of
// the page model over all pages: they sum to 1 (the mean over heads too).
TEST(HierTopP, OnePageMomentsGiveMassesThatSumToOne) {
  std::mt19937 rng(47);
  const Stores s = make_stores(rng, {3000, 700});
  const BoundStoreView sv = s.store.view();
  const kv::PageTable t = s.c.table.table();
  const GroupStore groups(sv, t, 16);
  const MomentStore ms(s.c.cache.summaries(), t, 1);
  SelectionStorage out;
  std::vector<double> masses;
  hier_top_p(top_p_args(s, sv, groups, ms, {8, 1, 64}, 1e6, 0.5), out, &masses);
  const int stride = t.num_pages(0);
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h) {
      double sum = 0;
      for (int j = 0; j < t.num_pages(b); ++j) sum += masses[(b * 2 + h) * stride + j];
      EXPECT_NEAR(sum, 1.0, 1e-12) << "b " << b << " h " << h;
    }
}

// The rule: kept pages in; the candidates taken are the heaviest (by the float of the mass);
// the mass held before the last one taken is below p, and after it >= p unless the budget or
// the candidates ran out; a larger p takes a superset; p = 1 takes what the budget allows.
TEST(HierTopP, TakesTheHeaviestCandidatesUntilTheMassReachesP) {
  std::mt19937 rng(53);
  const Stores s = make_stores(rng, {6000, 2500});
  const BoundStoreView sv = s.store.view();
  const kv::PageTable t = s.c.table.table();
  const GroupStore groups(sv, t, 16);
  const MomentStore ms(s.c.cache.summaries(), t, 64);
  const TopkPolicy pol{64, 1, 64};
  std::vector<SelectionStorage> outs;
  const double ps[] = {0.3, 0.6, 0.9, 1.0};
  for (double p : ps) {
    SelectionStorage out;
    std::vector<double> masses, none;
    std::vector<std::uint32_t> keys;
    const HierTopPArgs a = top_p_args(s, sv, groups, ms, pol, 4.0, p);
    hier_top_p(a, out, &masses);
    SelectionStorage quest;
    hier_select(a.hier, quest, &keys);
    const int stride = t.num_pages(0);
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        const auto l = out.view().list(b, h);
        const int n = t.num_pages(b);
        const detail::TopkSplit split = detail::topk_split(n, t.length(b, 16), 16, pol);
        const double* m = masses.data() + (b * 2 + h) * stride;
        const std::uint32_t* k = keys.data() + (b * 2 + h) * stride;
        std::vector<std::uint8_t> in(static_cast<std::size_t>(n), 0);
        for (std::int32_t j : l) in[static_cast<std::size_t>(j)] = 1;
        double held = 0, lightest_taken = INFINITY, heaviest_left = -INFINITY;
        int taken = 0, left = 0;
        for (int j = 0; j < n; ++j) {
          const bool kept = j < std::min(split.sinks, split.window) || j >= split.window;
          if (kept) {
            EXPECT_TRUE(in[static_cast<std::size_t>(j)]) << "kept page " << j;
            held += m[j];
          } else if (in[static_cast<std::size_t>(j)]) {
            ASSERT_NE(k[j], 0u) << "a page of an unchosen group";
            lightest_taken = std::min(lightest_taken, static_cast<double>(static_cast<float>(m[j])));
            held += m[j];
            ++taken;
          } else if (k[j] != 0u) {
            heaviest_left = std::max(heaviest_left, static_cast<double>(static_cast<float>(m[j])));
            ++left;
          }
        }
        EXPECT_LE(taken, split.need);
        if (taken > 0 && left > 0) {
          EXPECT_GE(lightest_taken, heaviest_left);
        }
        if (taken < split.need && left > 0) {
          EXPECT_GE(held, p) << "stopped early below p";
        }
        if (p == 1.0 && held < 1.0) {
          EXPECT_EQ(taken, std::min(split.need, taken + left));
        }
      }
    outs.push_back(std::move(out));
  }
  for (std::size_t x = 1; x < outs.size(); ++x)
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        const auto lo = outs[x - 1].view().list(b, h), hi = outs[x].view().list(b, h);
        EXPECT_TRUE(std::includes(hi.begin(), hi.end(), lo.begin(), lo.end())) << "p index " << x;
      }
  // Small p holds fewer pages than the budget on these keys.
  EXPECT_LT(outs.front().view().list(0, 0).size(), outs.back().view().list(0, 0).size());
}

// The 8-bit selector is the flat rule on its own bounds: the same as ranking
// page_upper_bounds(BoundStore8View) by a full sort.
TEST(QuestSelect8, IsTheFlatRuleOnTheEightBitBounds) {
  std::mt19937 rng(17);
  const Stores s = make_stores(rng, {4000, 900});
  const kv::PageTable t = s.c.table.table();
  const TopkPolicy pol{20, 2, 32};
  SelectionStorage sel;
  const auto qv = s.c.qview();
  quest_select8(qv, t, 16, s.store8.view(), 0, pol, sel);
  const int g = 4;
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < 2; ++h) {
      const int n = t.num_pages(b);
      const std::span<const std::int32_t> phys = t.indices.subspan(t.indptr[b], n);
      std::vector<float> U(static_cast<std::size_t>(g) * n);
      page_upper_bounds(s.store8.view(), phys, h, qv.row(b, h * g), g, 64, 1.0f / std::sqrt(64.0f),
                        U);
      std::vector<std::int32_t> want(static_cast<std::size_t>(sel.max_per_head));
      const int cnt = select_topk_pages(U, g, n, t.last_page_len[b], 16, pol, want);
      const auto got = sel.view().list(b, h);
      ASSERT_EQ(static_cast<int>(got.size()), cnt);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), want.begin()));
    }
}

TEST(CompareSelections, CountsCommonIds) {
  SelectionStorage a, b;
  a.reset(SelectionView::Unit::page, 1, 2, 3);
  b.reset(SelectionView::Unit::page, 1, 2, 3);
  a.ids = {0, 2, 5, 1, -1, -1};
  a.count = {3, 1};
  b.ids = {0, 3, 5, 1, -1, -1};
  b.count = {3, 1};
  const SelectionAgreement r = compare_selections(a.view(), b.view());
  EXPECT_EQ(r.lists, 2);
  EXPECT_EQ(r.identical, 1);
  EXPECT_DOUBLE_EQ(r.recall, 3.0 / 4.0);
}

}  // namespace
}  // namespace masskv::select
