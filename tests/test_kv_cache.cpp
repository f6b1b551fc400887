// PagedKVCache and PagedKVView::validate (docs/design.md §3): stored data and summaries against
// an f64 recomputation, copy-on-write forks, refcounts, all-or-nothing errors, and one test
// per malformed page table.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/paged_kv.hpp"

namespace masskv::kv {
namespace {

using masskv::test::expect_error;

constexpr double kU = 0x1p-24;  // unit roundoff of f32

// Random keys/values: mostly N(0,1), some channels with outliers (the case that makes raw
// sums cancel, docs/design.md §2.4), within f16 range.
std::vector<float> random_tokens(std::mt19937& rng, int n, int H, int d) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 15);
  std::vector<float> x(static_cast<std::size_t>(n) * H * d);
  for (std::size_t i = 0; i < x.size(); ++i) {
    const int kind = pick(rng);
    x[i] = normal(rng) * (kind == 0 ? 300.0f : kind == 1 ? 1e-3f : 1.0f) + (kind == 2 ? 40.0f : 0);
  }
  return x;
}

// What the cache should hold: the f32 inputs of every token of a sequence, in order.
struct Shadow {
  std::vector<float> k, v;
  std::int64_t length = 0;
};

template <class T>
float stored(const T* p, int c) {
  return to_f32(p[c]);
}

// The last page's spread row (PageCodesView::chan_spread) against the population standard
// deviation of the sequence's stored keys, two passes in long double. Tolerance: the row's f32
// rounding, plus what the f64 Welford sums can lose where the spread is small against the
// channel's largest |x| = M (an error e in the variance moves the deviation by <= sqrt(e);
// e <= ~n · 2^-53 · M²).
void check_spread(const PagedKVCache& cache, const PagedKVView& view, int b, const Shadow& sh) {
  const CacheConfig& cfg = cache.config();
  const int H = cfg.num_kv_heads, d = cfg.head_dim, P = cfg.page_size;
  const PageCodesView pc = cache.page_codes();
  ASSERT_NE(pc.chan_spread, nullptr);
  const std::int32_t last = view.table.page(b, view.table.num_pages(b) - 1);
  const auto n = static_cast<std::size_t>(sh.length);
  for (int h = 0; h < H; ++h) {
    const float* row = pc.spread_row(last, h);
    for (int c = 0; c < d; ++c) {
      std::vector<long double> x(n);
      long double mean = 0, M = 0;
      visit_dtype(cfg.dtype, [&](auto tag) {
        using T = decltype(tag);
        for (std::size_t t = 0; t < n; ++t) {
          x[t] = to_f32(from_f32<T>(sh.k[(t * H + h) * d + c]));  // the stored key
          mean += x[t];
          M = std::max(M, std::fabs(x[t]));
        }
      });
      mean /= static_cast<long double>(n);
      long double var = 0;
      for (const long double v : x) var += (v - mean) * (v - mean);
      const double ref = static_cast<double>(std::sqrt(var / static_cast<long double>(n)));
      const double tol = 0x1p-23 * ref + 4 * std::sqrt(static_cast<double>(n) * 0x1p-53) * double(M);
      ASSERT_LE(std::fabs(row[c] - ref), tol)
          << "spread, seq " << b << " head " << h << " c " << c << " n " << n << " P " << P;
    }
  }
}

// Checks stored K/V of every sequence against the shadow and every page summary against
// recompute_summary. Tolerances (u = 2^-24, n tokens in the page, M = max |x| of the
// channel in the page): min/max bit-equal; mean: n·u·M (each Welford step rounds the mean
// to f32 once, and an earlier error shrinks by (1-1/k) per step); M2: u·(n·M2 + 2n(n+1)·M²)
// (the f32 rounding of M2 plus the effect of the stored mean's error, <= 4k·u·M² in step k);
// max ||v||: rounded up, within 2^-22 relative.
void check_cache(const PagedKVCache& cache, const std::map<SeqId, Shadow>& shadows) {
  const CacheConfig& cfg = cache.config();
  const int H = cfg.num_kv_heads, d = cfg.head_dim, P = cfg.page_size;
  std::vector<SeqId> ids;
  for (const auto& [id, sh] : shadows) {
    ASSERT_EQ(cache.length(id), sh.length);
    if (sh.length > 0) ids.push_back(id);
  }
  if (ids.empty()) return;
  const PageTableStorage table = cache.page_table(ids);
  const PagedKVView view = cache.view(table);
  ASSERT_NO_THROW(view.validate());
  const SummariesView sum = cache.summaries();
  for (std::size_t b = 0; b < ids.size(); ++b) {
    const Shadow& sh = shadows.at(ids[b]);
    ASSERT_EQ(view.table.length(static_cast<int>(b), P), sh.length);
    if (cfg.page_codes) {
      ASSERT_NO_FATAL_FAILURE(check_spread(cache, view, static_cast<int>(b), sh));
    }
    for (int j = 0; j < view.table.num_pages(static_cast<int>(b)); ++j) {
      const std::int32_t page = view.table.page(static_cast<int>(b), j);
      const int len = view.table.page_len(static_cast<int>(b), j, P);
      ASSERT_EQ(sum.count[page], len) << "page " << page;
      for (int h = 0; h < H; ++h) {
        // Stored data equals the RNE conversion of the input.
        visit_dtype(cfg.dtype, [&](auto tag) {
          using T = decltype(tag);
          for (int s = 0; s < len; ++s) {
            const std::size_t tok = static_cast<std::size_t>(j) * P + s;
            const float* kin = sh.k.data() + (tok * H + h) * d;
            const float* vin = sh.v.data() + (tok * H + h) * d;
            const T* ks = view.key<T>(page, h, s);
            const T* vs = view.value<T>(page, h, s);
            for (int c = 0; c < d; ++c) {
              ASSERT_EQ(std::bit_cast<std::uint32_t>(stored(ks, c)),
                        std::bit_cast<std::uint32_t>(to_f32(from_f32<T>(kin[c]))));
              ASSERT_EQ(std::bit_cast<std::uint32_t>(stored(vs, c)),
                        std::bit_cast<std::uint32_t>(to_f32(from_f32<T>(vin[c]))));
            }
          }
        });
        const PageSummary ref = recompute_summary(view, page, h, len);
        const std::int64_t at = sum.at(page, h);
        std::vector<double> M(d, 0.0);
        visit_dtype(cfg.dtype, [&](auto tag) {
          using T = decltype(tag);
          for (int s = 0; s < len; ++s) {
            const T* ks = view.key<T>(page, h, s);
            for (int c = 0; c < d; ++c) M[c] = std::max(M[c], std::fabs(double(stored(ks, c))));
          }
        });
        for (int c = 0; c < d; ++c) {
          ASSERT_EQ(std::bit_cast<std::uint32_t>(sum.min[at + c]),
                    std::bit_cast<std::uint32_t>(ref.min[c]))
              << "min, page " << page << " head " << h << " c " << c;
          ASSERT_EQ(std::bit_cast<std::uint32_t>(sum.max[at + c]),
                    std::bit_cast<std::uint32_t>(ref.max[c]))
              << "max, page " << page << " head " << h << " c " << c;
          const double n = len;
          ASSERT_LE(std::fabs(sum.mean[at + c] - ref.mean[c]), n * kU * M[c] * 1.001)
              << "mean, page " << page << " head " << h << " c " << c << " n " << n;
          ASSERT_LE(std::fabs(sum.m2[at + c] - ref.m2[c]),
                    kU * (n * ref.m2[c] + 2 * n * (n + 1) * M[c] * M[c]) * 1.001 + 1e-300)
              << "M2, page " << page << " head " << h << " c " << c << " n " << n;
        }
        const double vmax = sum.max_vnorm[static_cast<std::size_t>(page) * H + h];
        ASSERT_GE(vmax, ref.max_vnorm);
        ASSERT_LE(vmax, ref.max_vnorm * (1 + 0x1p-22));
      }
    }
  }
}

struct Grid {
  int page_size;
  DType dtype;
  int head_dim;
  Layout layout;
};

std::string grid_name(const Grid& g) {
  return "P" + std::to_string(g.page_size) + "_" + std::string(to_string(g.dtype)) + "_d" +
         std::to_string(g.head_dim) + (g.layout == Layout::HND ? "_HND" : "_NHD");
}

// Random appends (single tokens and batches), forks, frees and creates; the state is
// checked against the shadow every few operations. Out-of-memory during the run is allowed
// and must leave the sequence unchanged.
void run_random_ops(const Grid& g, unsigned seed) {
  SCOPED_TRACE(grid_name(g));
  CacheConfig cfg;
  cfg.num_kv_heads = 2;
  cfg.head_dim = g.head_dim;
  cfg.page_size = g.page_size;
  cfg.dtype = g.dtype;
  cfg.layout = g.layout;
  cfg.capacity_pages = g.page_size >= 64 ? 24 : 160;
  cfg.page_codes = seed % 3 == 0;  // and the spread rows (check_spread) on a third of the grids
  PagedKVCache cache(cfg);
  const int H = cfg.num_kv_heads, d = cfg.head_dim, P = cfg.page_size;
  std::mt19937 rng(seed);
  std::map<SeqId, Shadow> shadows;
  shadows[cache.create()] = {};
  const int max_batch = std::min(2 * P + 3, 300);
  int ooms = 0;
  for (int op = 0; op < 28; ++op) {
    std::vector<SeqId> alive;
    for (const auto& [id, sh] : shadows) alive.push_back(id);
    const int r = std::uniform_int_distribution<int>(0, 99)(rng);
    if (alive.empty() || r < 8) {
      shadows[cache.create()] = {};
    } else {
      const SeqId s = alive[std::uniform_int_distribution<std::size_t>(0, alive.size() - 1)(rng)];
      if (r < 20) {
        const SeqId c = cache.fork(s);
        shadows[c] = shadows[s];
      } else if (r < 28) {
        cache.free(s);
        shadows.erase(s);
        EXPECT_FALSE(cache.alive(s));
      } else {
        const int n = r < 60 ? 1 : std::uniform_int_distribution<int>(2, max_batch)(rng);
        const std::vector<float> k = random_tokens(rng, n, H, d);
        const std::vector<float> v = random_tokens(rng, n, H, d);
        try {
          cache.append(s, k, v, n);
          Shadow& sh = shadows[s];
          sh.k.insert(sh.k.end(), k.begin(), k.end());
          sh.v.insert(sh.v.end(), v.begin(), v.end());
          sh.length += n;
        } catch (const Error& e) {
          ASSERT_EQ(e.code(), ErrorCode::out_of_memory) << e.what();
          ++ooms;  // the shadow stays as it was: check_cache verifies nothing was written
        }
      }
    }
    if (op % 4 == 3) {
      ASSERT_NO_FATAL_FAILURE(check_cache(cache, shadows));
    }
  }
  ASSERT_NO_FATAL_FAILURE(check_cache(cache, shadows));
  for (const auto& [id, sh] : shadows) cache.free(id);
  EXPECT_EQ(cache.free_pages(), cfg.capacity_pages) << "pages leaked (ooms: " << ooms << ")";
}

TEST(PagedKVCache, SummariesMatchRecomputationAfterRandomAppendsForksFrees) {
  unsigned seed = 1;
  for (int P : {1, 16, 64, 256}) {
    for (DType t : {DType::f32, DType::f16, DType::bf16}) {
      for (int d : {64, 128, 256}) {
        for (Layout l : {Layout::HND, Layout::NHD}) {
          // The largest pages get one head_dim per layout to keep the suite fast.
          if (P == 256 && d != (l == Layout::HND ? 64 : 256)) continue;
          ASSERT_NO_FATAL_FAILURE(run_random_ops({P, t, d, l}, seed++));
        }
      }
    }
  }
}

// Odd head_dim and a single head exercise the stride arithmetic off the power-of-two path.
TEST(PagedKVCache, SummariesMatchRecomputationForOddShapes) {
  for (int d : {1, 17, 113}) {
    ASSERT_NO_FATAL_FAILURE(run_random_ops({16, DType::f16, d, Layout::NHD}, 100u + d));
    ASSERT_NO_FATAL_FAILURE(run_random_ops({4, DType::bf16, d, Layout::HND}, 200u + d));
  }
}

// Welford in f32 storage stays accurate where a raw sum of squares would cancel: a large
// common offset with a small spread.
TEST(PagedKVCache, WelfordSurvivesLargeOffsets) {
  CacheConfig cfg{1, 8, 256, DType::f32, 2, Layout::HND};
  PagedKVCache cache(cfg);
  const SeqId s = cache.create();
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.0f, 1.0f);
  std::vector<float> k(256 * 8), v(256 * 8, 1.0f);
  for (float& x : k) x = 10000.0f + n(rng);
  cache.append(s, k, v, 256);
  const std::vector<SeqId> ids{s};
  const PageTableStorage t = cache.page_table(ids);
  const PageSummary ref = recompute_summary(cache.view(t), t.indices[0], 0, 256);
  const SummariesView sum = cache.summaries();
  for (int c = 0; c < 8; ++c) {
    // Relative error of M2 (about 256 for unit variance) stays below 1e-3; a sum of squares
    // in f32 would lose it entirely (1e8 * 256 * 2^-24 >> 256).
    EXPECT_NEAR(sum.m2[c], ref.m2[c], 1e-3 * ref.m2[c]) << c;
  }
}

class CacheFixture : public ::testing::Test {
 protected:
  static CacheConfig config(int capacity) {
    return CacheConfig{2, 8, 16, DType::f16, capacity, Layout::HND};
  }
  static void append_random(PagedKVCache& c, SeqId s, int n, unsigned seed) {
    std::mt19937 rng(seed);
    const std::vector<float> k = random_tokens(rng, n, 2, 8), v = random_tokens(rng, n, 2, 8);
    c.append(s, k, v, n);
  }
  // Everything observable about one sequence: its pages' bytes and summaries.
  struct Snapshot {
    std::vector<std::int32_t> pages;
    std::vector<std::uint8_t> kv;
    std::vector<float> sums;
    std::vector<std::int32_t> counts;
    bool operator==(const Snapshot&) const = default;
  };
  static Snapshot snapshot(const PagedKVCache& c, SeqId s) {
    const std::vector<SeqId> ids{s};
    const PageTableStorage t = c.page_table(ids);
    const PagedKVView v = c.view(t);
    const SummariesView sum = c.summaries();
    Snapshot snap;
    snap.pages = t.indices;
    const std::size_t page_bytes = static_cast<std::size_t>(v.stride_page) * 2;
    for (std::int32_t p : t.indices) {
      for (const void* base : {v.k, v.v}) {
        const auto* bytes = static_cast<const std::uint8_t*>(base) + p * page_bytes;
        snap.kv.insert(snap.kv.end(), bytes, bytes + page_bytes);
      }
      for (const float* arr : {sum.min, sum.max, sum.mean, sum.m2}) {
        snap.sums.insert(snap.sums.end(), arr + sum.at(p, 0), arr + sum.at(p + 1, 0));
      }
      snap.sums.insert(snap.sums.end(), sum.max_vnorm + 2 * p, sum.max_vnorm + 2 * p + 2);
      snap.counts.push_back(sum.count[p]);
    }
    return snap;
  }
};

TEST_F(CacheFixture, AppendToForkLeavesParentUnchanged) {
  PagedKVCache c(config(16));
  const SeqId parent = c.create();
  append_random(c, parent, 20, 1);  // one full page + 4 tokens in a shared partial page
  const SeqId child = c.fork(parent);
  const Snapshot before = snapshot(c, parent);
  EXPECT_EQ(snapshot(c, child), before);  // shares every page
  append_random(c, child, 3, 2);
  EXPECT_EQ(snapshot(c, parent), before);
  const Snapshot cs = snapshot(c, child);
  EXPECT_EQ(cs.pages[0], before.pages[0]) << "full pages stay shared";
  EXPECT_NE(cs.pages[1], before.pages[1]) << "the partial page is copied on write";
  EXPECT_EQ(c.length(child), 23);
  EXPECT_EQ(c.length(parent), 20);
  // The parent now owns its partial page alone: it writes in place, the child is unchanged.
  const Snapshot child_before = snapshot(c, child);
  const int free_before = c.free_pages();
  append_random(c, parent, 2, 3);
  EXPECT_EQ(c.free_pages(), free_before);
  EXPECT_EQ(snapshot(c, parent).pages, before.pages);
  EXPECT_EQ(snapshot(c, child), child_before);
}

TEST_F(CacheFixture, AppendToParentLeavesForkUnchanged) {
  PagedKVCache c(config(16));
  const SeqId parent = c.create();
  append_random(c, parent, 37, 4);
  const SeqId child = c.fork(parent);
  const Snapshot before = snapshot(c, child);
  append_random(c, parent, 30, 5);  // fills the shared partial page's copy and goes on
  EXPECT_EQ(snapshot(c, child), before);
  EXPECT_NE(snapshot(c, parent).pages[2], before.pages[2]);
  c.free(parent);
  EXPECT_EQ(snapshot(c, child), before);
}

TEST_F(CacheFixture, ForkAtPageBoundaryCopiesNothing) {
  PagedKVCache c(config(8));
  const SeqId parent = c.create();
  append_random(c, parent, 32, 6);
  const int free_before = c.free_pages();
  const SeqId child = c.fork(parent);
  EXPECT_EQ(c.free_pages(), free_before);
  append_random(c, child, 1, 7);
  EXPECT_EQ(c.free_pages(), free_before - 1);  // one new page, no copy
  const Snapshot cs = snapshot(c, child), ps = snapshot(c, parent);
  EXPECT_EQ(std::vector<std::int32_t>(cs.pages.begin(), cs.pages.begin() + 2), ps.pages);
}

TEST_F(CacheFixture, FreeingEverySequenceReturnsEveryPage) {
  PagedKVCache c(config(12));
  const SeqId a = c.create();
  append_random(c, a, 40, 8);
  const SeqId b = c.fork(a), d = c.fork(a);
  append_random(c, b, 17, 9);
  const SeqId e = c.fork(b);
  append_random(c, e, 1, 10);
  c.free(a);
  c.free(e);
  EXPECT_LT(c.free_pages(), 12);
  c.free(b);
  c.free(d);
  EXPECT_EQ(c.free_pages(), 12);
}

// pages_needed over several sequences against what appending to each in turn really takes:
// random trees of forks at random lengths (shared partial pages with 2-4 holders, some of
// them outside the set), every subset order of up to 4 sequences, n in {1, 5, 16, 17}.
TEST_F(CacheFixture, PagesNeededForSeveralSequencesIsWhatTheirAppendsTake) {
  std::mt19937 rng(21);
  for (int round = 0; round < 40; ++round) {
    PagedKVCache c(config(64));
    std::vector<SeqId> live{c.create()};
    append_random(c, live[0], 1 + static_cast<int>(rng() % 40), static_cast<unsigned>(rng()));
    for (int f = 0; f < 4; ++f) {
      const SeqId parent = live[rng() % live.size()];
      live.push_back(c.fork(parent));
      if (rng() % 3 == 0)
        append_random(c, live.back(), 1 + static_cast<int>(rng() % 20),
                      static_cast<unsigned>(rng()));
    }
    std::shuffle(live.begin(), live.end(), rng);
    const std::size_t k = 1 + rng() % 4;
    const std::vector<SeqId> set(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(k));
    const int n = std::array{1, 5, 16, 17}[rng() % 4];
    const std::int64_t predicted = c.pages_needed(set, n);
    std::int64_t separately = 0;  // each alone: an upper bound (it ignores handed-back pages)
    for (const SeqId s : set) separately += c.pages_needed(s, n);
    EXPECT_LE(predicted, separately);
    const int before = c.free_pages();
    for (const SeqId s : set) append_random(c, s, n, static_cast<unsigned>(rng()));
    EXPECT_EQ(predicted, before - c.free_pages()) << "round " << round;
  }
}

TEST_F(CacheFixture, PagesNeededRejectsARepeatedSequence) {
  PagedKVCache c(config(4));
  const SeqId a = c.create(), b = c.create();
  const std::vector<SeqId> ids{a, b, a};
  expect_error([&] { (void)c.pages_needed(ids, 1); }, ErrorCode::invalid_argument, "seqs");
}

TEST_F(CacheFixture, OutOfMemoryAppendsNothing) {
  PagedKVCache c(config(4));
  const SeqId s = c.create();
  append_random(c, s, 60, 11);  // 4 pages, the last holds 12 tokens
  const Snapshot before = snapshot(c, s);
  expect_error([&] { append_random(c, s, 5, 12); }, ErrorCode::out_of_memory, "capacity_pages");
  EXPECT_EQ(c.length(s), 60);
  EXPECT_EQ(snapshot(c, s), before);
  append_random(c, s, 4, 13);  // exactly fills the last page: fits
  EXPECT_EQ(c.length(s), 64);
}

TEST_F(CacheFixture, OutOfMemoryForCopyOnWriteAppendsNothing) {
  PagedKVCache c(config(3));
  const SeqId parent = c.create();
  append_random(c, parent, 40, 14);  // 3 pages, all of the pool
  const SeqId child = c.fork(parent);
  const Snapshot before = snapshot(c, parent);
  expect_error([&] { append_random(c, child, 1, 15); }, ErrorCode::out_of_memory, "capacity_pages");
  EXPECT_EQ(snapshot(c, child), before);
  EXPECT_EQ(snapshot(c, parent), before);
  EXPECT_EQ(c.free_pages(), 0);
}

TEST_F(CacheFixture, NonFiniteInputIsRejectedAndNothingAppended) {
  PagedKVCache c(config(4));
  const SeqId s = c.create();
  append_random(c, s, 5, 16);
  const Snapshot before = snapshot(c, s);
  std::vector<float> k(3 * 16, 0.5f), v(3 * 16, 0.5f);
  k[20] = std::nanf("");
  expect_error([&] { c.append(s, k, v, 3); }, ErrorCode::non_finite, "k", "k[20]");
  k[20] = 0.5f;
  v[47] = -INFINITY;
  expect_error([&] { c.append(s, k, v, 3); }, ErrorCode::non_finite, "v", "v[47]");
  v[47] = 0.5f;
  k[0] = 1e6f;  // finite in f32, overflows f16
  expect_error([&] { c.append(s, k, v, 3); }, ErrorCode::non_finite, "k", "overflows f16");
  EXPECT_EQ(c.length(s), 5);
  EXPECT_EQ(snapshot(c, s), before);
}

TEST_F(CacheFixture, UnknownOrFreedSequenceIsOutOfRange) {
  PagedKVCache c(config(4));
  const SeqId s = c.create();
  std::vector<float> k(16, 0.0f);
  expect_error([&] { c.append(s + 1, k, k, 1); }, ErrorCode::out_of_range, "seq");
  expect_error([&] { c.append(-1, k, k, 1); }, ErrorCode::out_of_range, "seq");
  c.free(s);
  expect_error([&] { c.append(s, k, k, 1); }, ErrorCode::out_of_range, "seq");
  expect_error([&] { c.fork(s); }, ErrorCode::out_of_range, "seq");
  expect_error([&] { c.free(s); }, ErrorCode::out_of_range, "seq");
  expect_error([&] { (void)c.length(s); }, ErrorCode::out_of_range, "seq");
}

TEST_F(CacheFixture, WrongInputSizeIsShapeMismatch) {
  PagedKVCache c(config(4));
  const SeqId s = c.create();
  std::vector<float> k(2 * 16, 0.0f), v(2 * 16 - 1, 0.0f);
  expect_error([&] { c.append(s, k, k, 3); }, ErrorCode::shape_mismatch, "k");
  expect_error([&] { c.append(s, k, v, 2); }, ErrorCode::shape_mismatch, "v");
  expect_error([&] { c.append(s, k, k, -1); }, ErrorCode::invalid_argument, "n");
}

TEST_F(CacheFixture, EmptySequenceCannotEnterAPageTable) {
  PagedKVCache c(config(4));
  const SeqId a = c.create(), b = c.create();
  append_random(c, a, 3, 17);
  const std::vector<SeqId> ids{a, b};
  expect_error([&] { (void)c.page_table(ids); }, ErrorCode::invalid_argument, "seqs", "empty");
  expect_error([&] { (void)c.page_table({}); }, ErrorCode::invalid_argument, "seqs");
}

TEST_F(CacheFixture, PageTableMatchesLengths) {
  PagedKVCache c(config(8));
  const SeqId a = c.create(), b = c.create();
  append_random(c, a, 16, 18);
  append_random(c, b, 17, 19);
  const std::vector<SeqId> ids{b, a};
  const PageTableStorage t = c.page_table(ids);
  EXPECT_EQ(t.indptr, (std::vector<std::int32_t>{0, 2, 3}));
  EXPECT_EQ(t.last_page_len, (std::vector<std::int32_t>{1, 16}));
  EXPECT_EQ(t.table().length(0, 16), 17);
  EXPECT_EQ(t.table().length(1, 16), 16);
}

TEST(CacheConfig, RejectsBadGeometry) {
  expect_error(
      [] {
        PagedKVCache c(CacheConfig{2, 8, 24, DType::f16, 4, Layout::HND});
      },
      ErrorCode::invalid_argument, "page_size");
  expect_error(
      [] {
        PagedKVCache c(CacheConfig{2, 8, 512, DType::f16, 4, Layout::HND});
      },
      ErrorCode::invalid_argument, "page_size");
  expect_error(
      [] {
        PagedKVCache c(CacheConfig{0, 8, 16, DType::f16, 4, Layout::HND});
      },
      ErrorCode::invalid_argument, "num_kv_heads");
  expect_error(
      [] {
        PagedKVCache c(CacheConfig{2, 0, 16, DType::f16, 4, Layout::HND});
      },
      ErrorCode::invalid_argument, "head_dim");
  expect_error(
      [] {
        PagedKVCache c(CacheConfig{2, 8, 16, DType::f16, 0, Layout::HND});
      },
      ErrorCode::invalid_argument, "capacity_pages");
}

TEST(PagedKVCache, BytesPerTokenForReports) {
  PagedKVCache c(CacheConfig{8, 128, 16, DType::f16, 1, Layout::HND});
  EXPECT_DOUBLE_EQ(c.kv_bytes_per_token(), 2.0 * 8 * 128 * 2);
  // min, max, mean, M2 in f32 per head and channel + max ||v|| per head + count, per page.
  EXPECT_DOUBLE_EQ(c.summary_bytes_per_token(), (8 * (4 * 128 * 4 + 4) + 4) / 16.0);
  PagedKVCache f(CacheConfig{8, 128, 16, DType::f32, 1, Layout::NHD});
  EXPECT_DOUBLE_EQ(f.kv_bytes_per_token(), 2.0 * 8 * 128 * 4);
}

// ---- PagedKVView::validate: one test per malformed case -------------------------------

class ValidateTable : public ::testing::Test {
 protected:
  // Two sequences over a pool of 10 pages, page_size 16: 3 pages (last 5), 2 pages (last 16).
  std::vector<std::int32_t> indptr{0, 3, 5}, indices{4, 0, 7, 9, 2}, last{5, 16};
  float pool[1] = {};
  PagedKVView view(Layout layout = Layout::HND) const {
    PagedKVView v;
    v.k = pool;
    v.v = pool;
    v.dtype = DType::f32;
    v.num_pages = 10;
    v.num_kv_heads = 4;
    v.page_size = 16;
    v.head_dim = 64;
    v.set_layout(layout);
    v.table = {indptr, indices, last};
    return v;
  }
  void expect_rejected(const PagedKVView& v, ErrorCode code, const std::string& arg,
                       const std::string& part = "") {
    expect_error([&] { v.validate(); }, code, arg, part);
  }
};

TEST_F(ValidateTable, AcceptsAWellFormedTableInBothLayouts) {
  EXPECT_NO_THROW(view(Layout::HND).validate());
  EXPECT_NO_THROW(view(Layout::NHD).validate());
  const PagedKVView h = view(Layout::HND), n = view(Layout::NHD);
  EXPECT_EQ(h.offset(1, 2, 3), 1 * 4 * 16 * 64 + 2 * 16 * 64 + 3 * 64);
  EXPECT_EQ(n.offset(1, 2, 3), 1 * 16 * 4 * 64 + 3 * 4 * 64 + 2 * 64);
}

TEST_F(ValidateTable, RejectsPageSizeNotPowerOfTwo) {
  PagedKVView v = view();
  v.page_size = 12;
  expect_rejected(v, ErrorCode::invalid_argument, "page_size", "12");
}

TEST_F(ValidateTable, RejectsPageSizeAbove256) {
  PagedKVView v = view();
  v.page_size = 512;
  v.set_layout(Layout::HND);
  expect_rejected(v, ErrorCode::invalid_argument, "page_size");
}

TEST_F(ValidateTable, RejectsZeroHeadDim) {
  PagedKVView v = view();
  v.head_dim = 0;
  expect_rejected(v, ErrorCode::invalid_argument, "head_dim");
}

TEST_F(ValidateTable, RejectsZeroKvHeads) {
  PagedKVView v = view();
  v.num_kv_heads = 0;
  expect_rejected(v, ErrorCode::invalid_argument, "num_kv_heads");
}

TEST_F(ValidateTable, RejectsNullKeys) {
  PagedKVView v = view();
  v.k = nullptr;
  expect_rejected(v, ErrorCode::invalid_argument, "k");
}

TEST_F(ValidateTable, RejectsNullValues) {
  PagedKVView v = view();
  v.v = nullptr;
  expect_rejected(v, ErrorCode::invalid_argument, "v");
}

TEST_F(ValidateTable, RejectsOverlappingSlotStride) {
  PagedKVView v = view(Layout::HND);
  v.stride_slot = 63;  // rows of 64 channels would overlap
  expect_rejected(v, ErrorCode::shape_mismatch, "stride_slot", "63");
}

TEST_F(ValidateTable, RejectsOverlappingHeadStride) {
  PagedKVView v = view(Layout::NHD);
  v.stride_slot = 4 * 64;
  v.stride_head = 32;
  expect_rejected(v, ErrorCode::shape_mismatch, "stride_head");
}

TEST_F(ValidateTable, RejectsHeadStrideInsideSlotAxis) {
  PagedKVView v = view(Layout::HND);
  v.stride_head = 16 * 64 - 64;  // the head axis steps into the previous head's slots
  expect_rejected(v, ErrorCode::shape_mismatch, "stride_head");
}

TEST_F(ValidateTable, RejectsPageStrideSmallerThanAPage) {
  PagedKVView v = view();
  v.stride_page -= 1;
  expect_rejected(v, ErrorCode::shape_mismatch, "stride_page");
}

TEST_F(ValidateTable, RejectsEmptyIndptr) {
  indptr.clear();
  last.clear();
  expect_rejected(view(), ErrorCode::shape_mismatch, "indptr");
}

TEST_F(ValidateTable, RejectsIndptrWithoutSequences) {
  indptr = {0};
  last.clear();
  indices.clear();
  expect_rejected(view(), ErrorCode::shape_mismatch, "indptr");
}

TEST_F(ValidateTable, RejectsIndptrNotStartingAtZero) {
  indptr = {1, 3, 5};
  expect_rejected(view(), ErrorCode::invalid_argument, "indptr", "indptr[0]");
}

TEST_F(ValidateTable, RejectsDecreasingIndptr) {
  indptr = {0, 3, 2};
  indices.resize(2);
  expect_rejected(view(), ErrorCode::invalid_argument, "indptr", "indptr[2] = 2 < indptr[1] = 3");
}

TEST_F(ValidateTable, RejectsSequenceWithoutPages) {
  indptr = {0, 0, 5};
  expect_rejected(view(), ErrorCode::invalid_argument, "indptr", "sequence 0 has no pages");
}

TEST_F(ValidateTable, RejectsIndicesShorterThanIndptrEnd) {
  indices.pop_back();
  expect_rejected(view(), ErrorCode::shape_mismatch, "indices", "indptr[2] = 5");
}

TEST_F(ValidateTable, RejectsIndicesLongerThanIndptrEnd) {
  indices.push_back(1);
  expect_rejected(view(), ErrorCode::shape_mismatch, "indices");
}

TEST_F(ValidateTable, RejectsNegativePageId) {
  indices[3] = -1;
  expect_rejected(view(), ErrorCode::out_of_range, "indices", "indices[3] = -1");
}

TEST_F(ValidateTable, RejectsPageIdBeyondPool) {
  indices[1] = 10;
  expect_rejected(view(), ErrorCode::out_of_range, "indices", "indices[1] = 10");
}

TEST_F(ValidateTable, RejectsLastPageLenCountMismatch) {
  last.push_back(3);
  expect_rejected(view(), ErrorCode::shape_mismatch, "last_page_len");
}

TEST_F(ValidateTable, RejectsZeroLastPageLen) {
  last[1] = 0;
  expect_rejected(view(), ErrorCode::invalid_argument, "last_page_len", "last_page_len[1] = 0");
}

TEST_F(ValidateTable, RejectsLastPageLenAbovePageSize) {
  last[0] = 17;
  expect_rejected(view(), ErrorCode::invalid_argument, "last_page_len", "last_page_len[0] = 17");
}

}  // namespace
}  // namespace masskv::kv
