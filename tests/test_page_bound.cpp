// Quest page bounds (docs/design.md §2.3), the outward-rounded bf16 store (§2.2) and top-k page
// selection with sinks and window (§3), against f64 references and a brute-force sort.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/cpu_features.hpp"
#include "expect_error.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/select/page_bound.hpp"
#include "select/quest_kernels.hpp"

namespace masskv::select {
namespace {

using masskv::test::expect_error;

using kv::CacheConfig;
using kv::Layout;
using kv::PagedKVCache;
using kv::PageTableStorage;
using kv::SeqId;

constexpr double kU = 0x1p-24;

std::vector<float> random_vec(std::mt19937& rng, std::size_t n, float outlier_scale = 20.0f) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 9);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng) * (pick(rng) == 0 ? outlier_scale : 1.0f);
  return x;
}

// A cache holding one sequence of `length` random tokens, and its page table.
struct Filled {
  PagedKVCache cache;
  SeqId seq;
  PageTableStorage table;
};
Filled fill(const CacheConfig& cfg, int length, std::mt19937& rng) {
  PagedKVCache cache(cfg);
  const SeqId s = cache.create();
  const std::size_t n = static_cast<std::size_t>(length) * cfg.num_kv_heads * cfg.head_dim;
  cache.append(s, random_vec(rng, n), random_vec(rng, n), length);
  const std::vector<SeqId> ids{s};
  PageTableStorage t = cache.page_table(ids);
  return {std::move(cache), s, std::move(t)};
}

// f64 score of every stored key of logical page j against q: scale * q·k.
template <class T>
std::vector<double> page_scores(const kv::PagedKVView& v, int j, int head, const float* q,
                                double scale) {
  std::vector<double> s;
  const int len = v.table.page_len(0, j, v.page_size);
  for (int slot = 0; slot < len; ++slot) {
    const T* k = v.key<T>(v.table.page(0, j), head, slot);
    double dot = 0;
    for (int c = 0; c < v.head_dim; ++c) dot += double(q[c]) * to_f32(k[c]);
    s.push_back(scale * dot);
  }
  return s;
}

// The §2.3 formula in f64 from the stored min/max, and the slack scale ||q||_1 * W of
// page_upper_bounds (W = max_c max(|m_c|, |M_c|)), both times `scale`.
template <class T>
std::pair<double, double> reference_bound(const T* mn, const T* mx, const float* q, int d,
                                          double scale) {
  double s = 0, q1 = 0, w = 0;
  for (int c = 0; c < d; ++c) {
    const double lo = to_f32(mn[c]), hi = to_f32(mx[c]);
    s += std::max(double(q[c]) * lo, double(q[c]) * hi);
    q1 += std::fabs(double(q[c]));
    w = std::max({w, std::fabs(lo), std::fabs(hi)});
  }
  return {scale * s, scale * q1 * w};
}

// Documented slack 2(2d+4)u plus the evaluation error (2d+4)u, per unit of ||q||_1 * W.
double max_excess(int d) { return (6.0 * d + 13) * kU; }

// For every page and head: U >= every exact score in the page (the property the §2.2
// certificate needs), U >= the f64 §2.3 formula, and U exceeds it by at most the documented
// slack 2(2d+4)·2^-24·scale·||q||_1·W plus the f32 evaluation error.
TEST(PageBound, IsAboveEveryScoreInThePage) {
  std::mt19937 rng(1);
  int checked = 0;
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    for (int d : {17, 64, 128}) {
      for (int P : {1, 16}) {
        const CacheConfig cfg{2, d, P, t, 64, Layout::HND};
        Filled f = fill(cfg, P == 1 ? 40 : 301, rng);
        const kv::PagedKVView v = f.cache.view(f.table);
        const kv::SummariesView s = f.cache.summaries();
        const BoundStore store(s);
        const int n = v.table.num_pages(0);
        const int g = 3;
        const std::vector<float> q = random_vec(rng, static_cast<std::size_t>(g) * d, 5.0f);
        const float scale = 1.0f / std::sqrt(float(d));
        for (int h = 0; h < 2; ++h) {
          std::vector<float> u32(static_cast<std::size_t>(g) * n), u16(u32.size());
          page_upper_bounds(s, v.table.indices, h, q.data(), g, d, scale, u32);
          page_upper_bounds(store.view(), v.table.indices, h, q.data(), g, d, scale, u16);
          for (int i = 0; i < g; ++i) {
            for (int j = 0; j < n; ++j) {
              const float* qi = q.data() + i * d;
              const double U = u32[i * n + j], U16 = u16[i * n + j];
              const std::int64_t at = s.at(v.table.page(0, j), h);
              const auto [ref, mag] = reference_bound(s.min + at, s.max + at, qi, d, scale);
              EXPECT_GE(U, ref);
              EXPECT_LE(U - ref, max_excess(d) * mag + 1e-30) << "bound too loose";
              EXPECT_GE(U16, U - max_excess(d) * mag) << "bf16 bound below f32 bound";
              visit_dtype(t, [&](auto tag) {
                for (double sc : page_scores<decltype(tag)>(v, j, h, qi, scale)) {
                  ASSERT_GE(U, sc) << "f32 bound, page " << j << " head " << h;
                  ASSERT_GE(U16, sc) << "bf16 bound, page " << j << " head " << h;
                  ++checked;
                }
              });
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

// A page of one key: the bound is that key's score up to the slack, so it cannot be
// trivially loose (e.g. +inf) and still pass the test above.
TEST(PageBound, IsTightForSingleKeyPages) {
  std::mt19937 rng(2);
  const int d = 128;
  Filled f = fill(CacheConfig{1, d, 1, DType::f32, 64, Layout::NHD}, 50, rng);
  const kv::PagedKVView v = f.cache.view(f.table);
  const std::vector<float> q = random_vec(rng, d);
  std::vector<float> u(50);
  page_upper_bounds(f.cache.summaries(), v.table.indices, 0, q.data(), 1, d, 0.125f, u);
  const kv::SummariesView sum = f.cache.summaries();
  for (int j = 0; j < 50; ++j) {
    const double s = page_scores<float>(v, j, 0, q.data(), 0.125)[0];
    const std::int64_t at = sum.at(v.table.page(0, j), 0);
    const double mag = reference_bound(sum.min + at, sum.max + at, q.data(), d, 0.125).second;
    EXPECT_GE(u[j], s);
    EXPECT_LE(u[j] - s, max_excess(d) * mag) << j;
  }
}

// The bf16 store must round outward: with round-to-nearest min/max the bound falls below
// true scores. Here single-key f32 pages with positive q make the bound q·round(k), which
// nearest rounding lowers for about half the pages; the outward store never does.
TEST(PageBound, Bf16StoreFailsWithoutOutwardRounding) {
  std::mt19937 rng(3);
  const int d = 64, pages = 64;
  Filled f = fill(CacheConfig{1, d, 1, DType::f32, pages, Layout::HND}, pages, rng);
  const kv::PagedKVView v = f.cache.view(f.table);
  const kv::SummariesView s = f.cache.summaries();
  std::vector<float> q(d);
  for (float& x : q) x = std::uniform_real_distribution<float>(0.5f, 1.5f)(rng);

  std::vector<bf16> nmin(s.num_pages * d), nmax(nmin.size());
  for (std::size_t i = 0; i < nmin.size(); ++i) {
    nmin[i] = f32_to_bf16(s.min[i]);
    nmax[i] = f32_to_bf16(s.max[i]);
  }
  const BoundStoreView nearest{nmin.data(), nmax.data(), s.num_pages, 1, d};
  const BoundStore outward(s);
  std::vector<float> un(pages), uo(pages);
  page_upper_bounds(nearest, v.table.indices, 0, q.data(), 1, d, 1.0f, un);
  page_upper_bounds(outward.view(), v.table.indices, 0, q.data(), 1, d, 1.0f, uo);
  int nearest_violations = 0, outward_violations = 0;
  for (int j = 0; j < pages; ++j) {
    const double sc = page_scores<float>(v, j, 0, q.data(), 1.0)[0];
    nearest_violations += un[j] < sc;
    outward_violations += uo[j] < sc;
  }
  EXPECT_GT(nearest_violations, 0) << "the test could not detect a non-outward store";
  EXPECT_EQ(outward_violations, 0);
}

// The AVX2 inner loop and the portable one compute the same sums up to the summation-order
// error (2d)u·||q||_1·W (both are inside the slack), and the same W bit for bit; f64 is the
// referee. Head counts 1..9 cover the 4-head blocks and the single-head remainder.
TEST(QuestKernels, Avx2MatchesPortableAndF64) {
  if (!cpu::has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(9);
  for (int d : {8, 64, 128, 256}) {
    for (int nh : {1, 3, 4, 5, 9}) {
      const int pool = 37, n = 23;
      const std::vector<float> a = random_vec(rng, std::size_t(pool) * d);
      const std::vector<float> b = random_vec(rng, a.size());
      std::vector<float> mn(a.size()), mx(a.size());
      std::vector<std::uint16_t> mn16(a.size()), mx16(a.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        mn[i] = std::min(a[i], b[i]);
        mx[i] = std::max(a[i], b[i]);
        mn16[i] = f32_to_bf16_down(mn[i]).bits;
        mx16[i] = f32_to_bf16_up(mx[i]).bits;
      }
      std::vector<std::int32_t> pages(n);
      for (int& p : pages) p = std::uniform_int_distribution<int>(0, pool - 1)(rng);
      const std::vector<float> q = random_vec(rng, std::size_t(nh) * d);
      std::vector<float> qp(q.size()), qn(q.size());
      for (std::size_t i = 0; i < q.size(); ++i) {
        qp[i] = std::max(q[i], 0.0f);
        qn[i] = std::min(q[i], 0.0f);
      }
      for (bool use_bf16 : {false, true}) {
        std::vector<float> s1(std::size_t(nh) * n), s2(s1.size()), w1(n), w2(n);
        if (use_bf16) {
          detail::quest_sums_portable_bf16(mn16.data(), mx16.data(), d, pages.data(), n, d,
                                           qp.data(), qn.data(), nh, s1.data(), w1.data());
          detail::quest_sums_avx2_bf16(mn16.data(), mx16.data(), d, pages.data(), n, d, qp.data(),
                                       qn.data(), nh, s2.data(), w2.data());
        } else {
          detail::quest_sums_portable_f32(mn.data(), mx.data(), d, pages.data(), n, d, qp.data(),
                                          qn.data(), nh, s1.data(), w1.data());
          detail::quest_sums_avx2_f32(mn.data(), mx.data(), d, pages.data(), n, d, qp.data(),
                                      qn.data(), nh, s2.data(), w2.data());
        }
        for (int j = 0; j < n; ++j) {
          const std::int64_t at = std::int64_t(pages[j]) * d;
          double w = 0;
          for (int c = 0; c < d; ++c) {
            const double lo = use_bf16 ? bf16_to_f32(bf16{mn16[at + c]}) : mn[at + c];
            const double hi = use_bf16 ? bf16_to_f32(bf16{mx16[at + c]}) : mx[at + c];
            w = std::max({w, std::fabs(lo), std::fabs(hi)});
          }
          ASSERT_EQ(w1[j], w2[j]);
          ASSERT_EQ(w1[j], float(w));
          for (int h = 0; h < nh; ++h) {
            double ref = 0, q1 = 0;
            for (int c = 0; c < d; ++c) {
              const double lo = use_bf16 ? bf16_to_f32(bf16{mn16[at + c]}) : mn[at + c];
              const double hi = use_bf16 ? bf16_to_f32(bf16{mx16[at + c]}) : mx[at + c];
              const double x = q[h * d + c];
              ref += std::max(x * lo, x * hi);
              q1 += std::fabs(x);
            }
            const double tol = (2.0 * d + 1) * kU * q1 * w;
            ASSERT_NEAR(s1[h * n + j], ref, tol) << "portable d " << d << " nh " << nh;
            ASSERT_NEAR(s2[h * n + j], ref, tol) << "avx2 d " << d << " nh " << nh;
          }
        }
      }
    }
  }
}

TEST(BoundStore, UpdateMatchesRebuildAfterAppends) {
  std::mt19937 rng(4);
  const CacheConfig cfg{2, 64, 16, DType::bf16, 16, Layout::HND};
  PagedKVCache cache(cfg);
  const SeqId sq = cache.create();
  cache.append(sq, random_vec(rng, 20 * 128), random_vec(rng, 20 * 128), 20);
  BoundStore store(cache.summaries());
  cache.append(sq, random_vec(rng, 30 * 128), random_vec(rng, 30 * 128), 30);
  const std::vector<SeqId> ids{sq};
  const PageTableStorage t = cache.page_table(ids);
  store.update(cache.summaries(), std::span(t.indices).subspan(1));  // pages the append touched
  const BoundStore fresh(cache.summaries());
  const BoundStoreView a = store.view(), b = fresh.view();
  for (std::int64_t i = 0; i < std::int64_t(a.num_pages) * 2 * 64; ++i) {
    ASSERT_EQ(a.min[i].bits, b.min[i].bits) << i;
    ASSERT_EQ(a.max[i].bits, b.max[i].bits) << i;
  }
  for (std::int64_t i = 0; i < std::int64_t(a.num_pages) * 2; ++i) {
    ASSERT_EQ(a.wmax[i], b.wmax[i]) << i;
  }
  // bf16 min + max per channel and one f32 W per kv head, per token of a full page.
  EXPECT_DOUBLE_EQ(store.bytes_per_token(16), (2.0 * 2 * 2 * 64 + 4.0 * 2) / 16);
}

TEST(PageBound, RejectsBadArguments) {
  std::mt19937 rng(5);
  Filled f = fill(CacheConfig{2, 8, 4, DType::f32, 8, Layout::HND}, 9, rng);
  const kv::SummariesView s = f.cache.summaries();
  std::vector<float> q(16, 1.0f), out(2 * 3);
  const std::span<const std::int32_t> pages = f.table.indices;
  expect_error([&] { page_upper_bounds(s, pages, 2, q.data(), 2, 8, 1.0f, out); },
               ErrorCode::out_of_range, "kv_head");
  expect_error([&] { page_upper_bounds(s, pages, 0, q.data(), 2, 8, 0.0f, out); },
               ErrorCode::invalid_argument, "scale");
  expect_error(
      [&] {
        page_upper_bounds(s, pages, 0, q.data(), 2, 8, 1.0f, {out.data(), 5});
      },
      ErrorCode::shape_mismatch, "out");
  const std::vector<std::int32_t> bad{0, 8, 1};
  expect_error([&] { page_upper_bounds(s, bad, 0, q.data(), 2, 8, 1.0f, out); },
               ErrorCode::out_of_range, "pages");
  q[9] = NAN;
  expect_error([&] { page_upper_bounds(s, pages, 0, q.data(), 2, 8, 1.0f, out); },
               ErrorCode::non_finite, "q");
}

// ---- top-k selection ----------------------------------------------------------------

// Brute force: kept pages by definition (first sinks, any page holding one of the last W
// tokens, the last page), the rest ranked by a full sort on (max over heads desc, id asc).
std::vector<std::int32_t> brute_topk(const std::vector<float>& bounds, int g, int n, int last_len,
                                     int P, const TopkPolicy& pol) {
  const std::int64_t L = std::int64_t(n - 1) * P + last_len;
  std::set<std::int32_t> kept;
  for (int j = 0; j < n; ++j) {
    const std::int64_t first = std::int64_t(j) * P, end = std::min<std::int64_t>(first + P, L);
    if (j < pol.sink_pages || j == n - 1 || end > L - pol.window_tokens) kept.insert(j);
  }
  std::vector<std::pair<float, std::int32_t>> rest;
  for (int j = 0; j < n; ++j) {
    if (kept.count(j)) continue;
    float m = -INFINITY;
    for (int i = 0; i < g; ++i) m = std::max(m, bounds[i * n + j]);
    rest.push_back({m, j});
  }
  std::sort(rest.begin(), rest.end(), [](auto a, auto b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const int total = std::min<int>(n, std::max<int>(pol.budget_pages, int(kept.size())));
  std::vector<std::int32_t> out(kept.begin(), kept.end());
  for (int i = 0; i < total - int(kept.size()); ++i) out.push_back(rest[i].second);
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TopkPages, EqualsBruteForceSort) {
  std::mt19937 rng(6);
  for (int trial = 0; trial < 600; ++trial) {
    const int n = trial < 20 ? 1 + trial : std::uniform_int_distribution<int>(1, 300)(rng);
    const int g = std::uniform_int_distribution<int>(1, 4)(rng);
    const int P = 1 << std::uniform_int_distribution<int>(0, 5)(rng);
    const int last = std::uniform_int_distribution<int>(1, P)(rng);
    TopkPolicy pol;
    pol.budget_pages = std::uniform_int_distribution<int>(0, n + 3)(rng);
    pol.sink_pages = std::uniform_int_distribution<int>(0, 3)(rng);
    pol.window_tokens = std::uniform_int_distribution<int>(0, 3 * P)(rng);
    // Coarse values force ties (broken by page id); signed zeros and infinities included.
    std::vector<float> bounds(static_cast<std::size_t>(g) * n);
    const int kind = trial % 3;
    for (float& b : bounds) {
      const int r = std::uniform_int_distribution<int>(0, 40)(rng);
      b = kind == 0 ? std::normal_distribution<float>(0, 3)(rng)
                    : float(std::uniform_int_distribution<int>(-3, 3)(rng));
      if (kind == 2 && r == 0) b = -0.0f;
      if (kind == 2 && r == 1) b = INFINITY;
      if (kind == 2 && r == 2) b = -INFINITY;
    }
    const std::vector<std::int32_t> want = brute_topk(bounds, g, n, last, P, pol);
    const int slots = topk_selected_pages(n, std::int64_t(n - 1) * P + last, P, pol);
    ASSERT_EQ(slots, int(want.size()));
    std::vector<std::int32_t> out(slots + 3, 1234);
    const int count = select_topk_pages(bounds, g, n, last, P, pol, out);
    ASSERT_EQ(count, int(want.size())) << "trial " << trial;
    for (int i = 0; i < count; ++i) ASSERT_EQ(out[i], want[i]) << "trial " << trial << " i " << i;
    for (int i = count; i < int(out.size()); ++i) ASSERT_EQ(out[i], -1);
  }
}

TEST(TopkPages, KeepsSinksWindowAndLastPageAscending) {
  const int n = 100, P = 16, last = 5;
  std::vector<float> bounds(n);
  for (int j = 0; j < n; ++j) bounds[j] = float(j % 7) - 100.0f * (j < 5 || j > 90);
  // Window: tokens [1549, 1589) -> pages 96..99. 6 kept + the 13 pages with bound 6.
  TopkPolicy pol{19, 2, 40};
  std::vector<std::int32_t> out(19);
  ASSERT_EQ(select_topk_pages(bounds, 1, n, last, P, pol, out), 19);
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end()));
  EXPECT_EQ(std::adjacent_find(out.begin(), out.end()), out.end());
  for (int j : {0, 1, 96, 97, 98, 99}) {
    EXPECT_NE(std::find(out.begin(), out.end(), j), out.end()) << j;
  }
  for (int j : out) {
    if (j > 1 && j < 96) {
      EXPECT_EQ(j % 7, 6) << "non-kept pages must have the top bound";
    }
  }
  // Budget below the kept set: the kept pages only.
  pol.budget_pages = 0;
  pol.window_tokens = 0;
  std::vector<std::int32_t> small(4);
  ASSERT_EQ(select_topk_pages(bounds, 1, n, last, P, pol, small), 3);
  EXPECT_EQ(small, (std::vector<std::int32_t>{0, 1, 99, -1}));
}

TEST(TopkPages, RejectsNanBoundsAndShortOutput) {
  std::vector<float> bounds(10, 1.0f);
  std::vector<std::int32_t> out(4);
  TopkPolicy pol{4, 1, 0};
  bounds[3] = NAN;
  expect_error([&] { select_topk_pages(bounds, 1, 10, 1, 16, pol, out); }, ErrorCode::non_finite,
               "bounds");
  bounds[3] = 0;
  pol.budget_pages = 5;
  expect_error([&] { select_topk_pages(bounds, 1, 10, 1, 16, pol, out); },
               ErrorCode::shape_mismatch, "out");
  pol.sink_pages = -1;
  expect_error([&] { select_topk_pages(bounds, 1, 10, 1, 16, pol, out); },
               ErrorCode::invalid_argument, "sink_pages");
}

// The fused selector equals bounds + per-list top-k, for f32 and bf16 sources, several
// sequences, GQA ratios, and any thread count.
TEST(QuestSelect, EqualsPerHeadBoundsAndTopkForAnyThreadCount) {
  std::mt19937 rng(7);
  for (int ratio : {1, 3, 4}) {
    const int Hkv = 2, Hq = Hkv * ratio, d = 64, P = 16;
    const CacheConfig cfg{Hkv, d, P, DType::bf16, 128, Layout::NHD};
    PagedKVCache cache(cfg);
    std::vector<SeqId> ids;
    for (int len : {1, 17, 300, 555}) {
      ids.push_back(cache.create());
      const std::size_t n = std::size_t(len) * Hkv * d;
      cache.append(ids.back(), random_vec(rng, n), random_vec(rng, n), len);
    }
    const PageTableStorage t = cache.page_table(ids);
    const kv::SummariesView s = cache.summaries();
    const BoundStore store(s);
    const BoundStoreView sv = store.view();
    const int B = int(ids.size());
    std::vector<float> qbuf = random_vec(rng, std::size_t(B) * Hq * d);
    QuestArgs args;
    args.q = View3<const float>::contiguous(qbuf.data(), B, Hq, d);
    args.table = t.table();
    args.page_size = P;
    args.policy = TopkPolicy{8, 1, 20};
    for (bool use_bf16 : {false, true}) {
      args.summaries = use_bf16 ? nullptr : &s;
      args.bounds_bf16 = use_bf16 ? &sv : nullptr;
      // Expected: per (b, kv head) bounds in CSR order, then the batch top-k.
      std::vector<float> bounds(t.indices.size() * Hq);
      const float scale = 1.0f / std::sqrt(float(d));
      for (int b = 0; b < B; ++b) {
        const int n = t.table().num_pages(b);
        const auto pages = std::span(t.indices).subspan(t.indptr[b], n);
        for (int h = 0; h < Hkv; ++h) {
          const std::span<float> rows(
              bounds.data() + std::size_t(t.indptr[b]) * Hq + std::size_t(h) * ratio * n,
              std::size_t(ratio) * n);
          const float* qg = args.q.row(b, h * ratio);
          if (use_bf16) {
            page_upper_bounds(sv, pages, h, qg, ratio, d, scale, rows);
          } else {
            page_upper_bounds(s, pages, h, qg, ratio, d, scale, rows);
          }
        }
      }
      SelectionStorage want;
      select_topk_pages(bounds, t.table(), P, Hkv, Hq, args.policy, want);
      for (int threads : {1, 2, 3}) {
        omp_set_num_threads(threads);
        SelectionStorage got;
        quest_select(args, got);
        EXPECT_EQ(got.ids, want.ids) << "ratio " << ratio << " threads " << threads;
        EXPECT_EQ(got.count, want.count);
        EXPECT_EQ(got.max_per_head, want.max_per_head);
      }
      if (use_bf16) {  // the kernels compute W themselves when the view has none
        BoundStoreView no_w = sv;
        no_w.wmax = nullptr;
        args.bounds_bf16 = &no_w;
        SelectionStorage got;
        quest_select(args, got);
        EXPECT_EQ(got.ids, want.ids) << "ratio " << ratio << " without precomputed W";
        args.bounds_bf16 = &sv;
      }
      // Sequence 0 (1 token) selects its only page; the others hit the budget.
      const SelectionView view = want.view();
      EXPECT_EQ(view.list(0, 0).size(), 1u);
      EXPECT_EQ(view.list(3, 1).size(), 8u);
    }
  }
}

TEST(QuestSelect, RejectsMismatchedArguments) {
  std::mt19937 rng(8);
  Filled f = fill(CacheConfig{2, 8, 4, DType::f32, 8, Layout::HND}, 9, rng);
  const kv::SummariesView s = f.cache.summaries();
  std::vector<float> q(1 * 4 * 8, 0.5f);
  QuestArgs args;
  args.q = View3<const float>::contiguous(q.data(), 1, 4, 8);
  args.table = f.table.table();
  args.page_size = 4;
  SelectionStorage out;
  expect_error([&] { quest_select(args, out); }, ErrorCode::invalid_argument, "summaries");
  args.summaries = &s;
  EXPECT_NO_THROW(quest_select(args, out));
  args.q.n1 = 3;
  expect_error([&] { quest_select(args, out); }, ErrorCode::shape_mismatch, "num_q_heads");
  args.q.n1 = 4;
  args.q.n2 = 7;
  expect_error([&] { quest_select(args, out); }, ErrorCode::shape_mismatch, "q");
  args.q.n2 = 8;
  args.page_size = 3;
  expect_error([&] { quest_select(args, out); }, ErrorCode::invalid_argument, "page_size");
}

}  // namespace
}  // namespace masskv::select
