// Decode: every implementation against the f64 reference on a sampled grid covering every
// value of every axis (docs/design.md §6), plus the split/sparsity/determinism properties of §2.2
// and §2.6.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "harness.hpp"
#include "masskv/mapping.hpp"

namespace masskv::test {
namespace {

using kv::Layout;

const Mapping kMappings[] = {Mapping::softmax(), Mapping::entmax(1.5), Mapping::entmax(2.0),
                             Mapping::entmax(1.25)};

// Case i of the sampled grid: each axis advances with a different stride so that, over the
// grid, every value of every axis appears (and most pairs do), without the full product.
DecodeCase grid_case(int i) {
  static const int lengths[] = {1, 15, 16, 17, 113, 1000, 4097};
  static const int ratios[] = {1, 3, 4, 8};
  static const int dims[] = {64, 128, 256, 96};
  static const int pages[] = {1, 16, 64};
  static const DType dtypes[] = {DType::f32, DType::f16, DType::bf16};
  DecodeCase c;
  const int len = lengths[i % 7];
  // Several sequences of different lengths in one batch.
  c.kv.lengths = {len, 1 + (len * 5 + 3 * i) % 300};
  if (i % 3 == 0) c.kv.lengths.push_back(len > 16 ? len - 16 : len + 16);
  c.kv.num_kv_heads = 1 + i % 2;
  c.num_q_heads = c.kv.num_kv_heads * ratios[(i / 2) % 4];
  c.kv.head_dim = dims[(i * 3) % 4];
  c.kv.page_size = pages[(i / 3) % 3];
  if (c.kv.page_size == 1 && len > 1000) c.kv.page_size = 16;
  c.kv.dtype = dtypes[(i * 5) % 3];
  c.kv.layout = (i / 5) % 2 ? Layout::NHD : Layout::HND;
  c.kv.seed = 100 + i;
  c.kv.value_offset = 0.5f;
  c.mapping = kMappings[(i / 4) % 4];
  c.selection = (i * 7 / 3) % 3;
  c.chunk_pages = 1 + (i % 5) * 3;
  c.q_sd = c.mapping.is_entmax() ? 3.0f : 1.5f;
  return c;
}

TEST(Decode, EveryImplMatchesReferenceOnSampledGrid) {
  Errors worst;
  for (int i = 0; i < 56; ++i) {
    const Errors e = check_decode(grid_case(i));
    worst.out = std::max(worst.out, e.out);
    worst.stat = std::max(worst.stat, e.stat);
  }
  std::printf("worst out rel err %.3g, lse/tau err %.3g\n", worst.out, worst.stat);
}

TEST(Decode, LongContextMatchesReference) {
  // The longest lengths are kept to a few configurations (runtime).
  for (int m = 0; m < 2; ++m) {
    DecodeCase c;
    c.kv.lengths = {65537, 17};
    c.kv.num_kv_heads = 2;
    c.num_q_heads = 8;
    c.kv.head_dim = 128;
    c.kv.page_size = 16;
    c.kv.dtype = m == 0 ? DType::f16 : DType::bf16;
    c.kv.layout = m == 0 ? Layout::HND : Layout::NHD;
    c.kv.value_offset = 0.5f;
    c.mapping = m == 0 ? Mapping::softmax() : Mapping::entmax(1.5);
    c.chunk_pages = 64;
    c.q_sd = 3;
    check_decode(c);
  }
}

}  // namespace
}  // namespace masskv::test

namespace masskv::test {
namespace {

struct Result {
  std::vector<float> out, stat;
};

// Runs decode on `cache` with q and returns out and lse/tau.
Result run_decode(const HandCache& cache, const std::vector<float>& q, int hq, Mapping mapping,
                  const SelectionView* sel, int chunk_pages, attn::Impl impl) {
  const int B = static_cast<int>(cache.config().lengths.size()), d = cache.config().head_dim;
  Result r{std::vector<float>(static_cast<std::size_t>(B) * hq * d), std::vector<float>(B * hq)};
  attn::DecodeArgs args;
  args.q = View3<const float>::contiguous(q.data(), B, hq, d);
  args.cache = cache.view();
  args.mapping = mapping;
  args.selection = sel;
  args.out = View3<float>::contiguous(r.out.data(), B, hq, d);
  args.lse_or_tau = r.stat;
  args.chunk_pages = chunk_pages;
  args.impl = impl;
  attn::decode(args);
  return r;
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    norm = std::max(norm, static_cast<double>(std::abs(b[i])));
  }
  return diff / norm;
}

KVConfig property_kv(DType dtype, Layout layout, int page_size) {
  KVConfig kv;
  kv.lengths = {1000, 257, 33};
  kv.num_kv_heads = 2;
  kv.head_dim = 64;
  kv.page_size = page_size;
  kv.dtype = dtype;
  kv.layout = layout;
  kv.seed = 77;
  kv.value_offset = 0.5f;
  return kv;
}

// docs/design.md §2.2: any superset of the entmax support gives the dense result exactly (up to
// f32 rounding of a different chunking: 1e-6 relative on f32 KV).
TEST(EntmaxDecode, SparseEqualsDenseWhenSupportCovered) {
  for (const double alpha : {1.5, 2.0, 1.25}) {
    for (const auto unit : {SelectionView::Unit::token, SelectionView::Unit::page}) {
      const HandCache cache(property_kv(DType::f32, Layout::HND, 16));
      const int hq = 6, g = 3, d = 64, P = 16;
      const std::vector<float> q = random_q(3, hq, d, 4.0f, 5);
      const Mapping map = Mapping::entmax(alpha);
      const Result dense = run_decode(cache, q, hq, map, nullptr, 4, attn::Impl::fast);
      // Support of each kv group: tokens with z > tau for some head of the group, plus random
      // extras (any superset must do).
      std::vector<std::vector<std::int32_t>> lists;
      std::mt19937 rng(9);
      std::bernoulli_distribution extra(0.05);
      int covered = 0, total = 0;
      for (int b = 0; b < 3; ++b) {
        for (int h = 0; h < 2; ++h) {
          const int len = cache.config().lengths[b];
          std::vector<char> keep(len, 0);
          for (int j = 0; j < g; ++j) {
            const std::vector<double> s =
                token_scores(cache, b, h, q.data() + (b * hq + h * g + j) * d, 1.0 / 8);
            const double tau = dense.stat[b * hq + h * g + j];
            for (int t = 0; t < len; ++t) keep[t] |= (alpha - 1) * s[t] > tau - 1e-4;
          }
          std::vector<std::int32_t> ids;
          for (int t = 0; t < len; ++t) {
            const int unit_id = unit == SelectionView::Unit::token ? t : t / P;
            if ((keep[t] || extra(rng)) && (ids.empty() || ids.back() != unit_id)) {
              ids.push_back(unit_id);
            }
          }
          covered += static_cast<int>(std::count(keep.begin(), keep.end(), 1));
          total += len;
          lists.push_back(ids);
        }
      }
      ASSERT_LT(covered, total / 2) << "support should be sparse for this test to mean much";
      OwnedSelection sel;
      {
        // lists are per (b, h); build the selection directly.
        std::size_t max_per = 1;
        for (auto& l : lists) max_per = std::max(max_per, l.size() + 1);
        sel.ids.assign(lists.size() * max_per, -1);
        for (std::size_t i = 0; i < lists.size(); ++i) {
          std::copy(lists[i].begin(), lists[i].end(), sel.ids.begin() + i * max_per);
          sel.count.push_back(static_cast<std::int32_t>(lists[i].size()));
        }
        sel.view = {unit, 3, 2, static_cast<int>(max_per), sel.ids, sel.count};
      }
      const Result sparse = run_decode(cache, q, hq, map, &sel.view, 2, attn::Impl::fast);
      EXPECT_LE(rel_diff(sparse.out, dense.out), 1e-6) << "alpha " << alpha;
      for (std::size_t i = 0; i < dense.stat.size(); ++i) {
        EXPECT_NEAR(sparse.stat[i], dense.stat[i], 1e-6 * std::max(1.0f, std::abs(dense.stat[i])));
      }
    }
  }
}

// The converse, so the test above can fail: dropping a support token changes the result.
TEST(EntmaxDecode, SparseDiffersWhenSupportTokenDropped) {
  const HandCache cache(property_kv(DType::f32, Layout::HND, 16));
  const int hq = 2, d = 64;
  const std::vector<float> q = random_q(3, hq, d, 4.0f, 5);
  const Mapping map = Mapping::entmax(1.5);
  const Result dense = run_decode(cache, q, hq, map, nullptr, 4, attn::Impl::fast);
  std::vector<std::vector<std::int32_t>> per_seq(3);
  for (int b = 0; b < 3; ++b) {
    const std::vector<double> s = token_scores(cache, b, 0, q.data() + b * hq * d, 1.0 / 8);
    const auto top = std::max_element(s.begin(), s.end()) - s.begin();
    for (int t = 0; t < cache.config().lengths[b]; ++t) {
      if (t != top) per_seq[b].push_back(t);
    }
  }
  const OwnedSelection sel = make_selection(cache, SelectionView::Unit::token, per_seq);
  const Result sparse = run_decode(cache, q, hq, map, &sel.view, 4, attn::Impl::fast);
  EXPECT_GT(rel_diff(sparse.out, dense.out), 1e-3);
}

// docs/design.md §2.6: softmax partials over any split merge to the unsplit result.
TEST(SoftmaxDecode, AnySplitMergesToUnsplitResult) {
  for (const Layout layout : {Layout::HND, Layout::NHD}) {
    const HandCache cache(property_kv(DType::f32, layout, 16));
    const std::vector<float> q = random_q(3, 4, 64, 2.0f, 6);
    const Result whole =
        run_decode(cache, q, 4, Mapping::softmax(), nullptr, 1 << 20, attn::Impl::simd);
    for (const int chunk : {1, 2, 3, 7, 64}) {
      const Result split =
          run_decode(cache, q, 4, Mapping::softmax(), nullptr, chunk, attn::Impl::simd);
      EXPECT_LE(rel_diff(split.out, whole.out), 1e-6) << "chunk_pages " << chunk;
      for (std::size_t i = 0; i < whole.stat.size(); ++i) {
        EXPECT_NEAR(split.stat[i], whole.stat[i], 1e-6 * std::max(1.0f, std::abs(whole.stat[i])));
      }
    }
  }
}

// docs/design.md §6: the same bits whatever the thread count (fixed chunks, fixed merge order).
TEST(Decode, BitIdenticalForOneAndTwoThreads) {
  const HandCache cache(property_kv(DType::bf16, Layout::NHD, 16));
  const std::vector<float> q = random_q(3, 8, 64, 3.0f, 8);
  const OwnedSelection sel = random_selection(cache, SelectionView::Unit::token, 0.3, 4);
  const int saved = omp_get_max_threads();
  for (const Mapping map : kMappings) {
    for (const SelectionView* s : {static_cast<const SelectionView*>(nullptr), &sel.view}) {
      omp_set_num_threads(1);
      const Result one = run_decode(cache, q, 8, map, s, 2, attn::Impl::fast);
      omp_set_num_threads(2);
      const Result two = run_decode(cache, q, 8, map, s, 2, attn::Impl::fast);
      const Result simd = run_decode(cache, q, 8, map, s, 2, attn::Impl::simd);
      EXPECT_EQ(0, std::memcmp(one.out.data(), two.out.data(), one.out.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(one.stat.data(), two.stat.data(), one.stat.size() * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(one.out.data(), simd.out.data(), one.out.size() * sizeof(float)));
    }
  }
  omp_set_num_threads(saved);
}

// Sparse decode equals the reference computed on the selected subset only (check_decode's
// reference reads exactly the selected rows), for page and token selections.
TEST(Decode, SparseMatchesReferenceOnSelectedSubset) {
  for (int unit = 1; unit <= 2; ++unit) {
    for (const Mapping map : kMappings) {
      DecodeCase c;
      c.kv = property_kv(DType::f16, Layout::HND, 16);
      c.num_q_heads = 8;
      c.mapping = map;
      c.selection = unit;
      c.keep = 0.2;
      c.q_sd = 3;
      check_decode(c);
    }
  }
}

// docs/design.md §6: an empty selection gives out = 0 and lse = -inf (softmax) / tau = NaN
// (entmax).
TEST(Decode, EmptySelectionGivesZeroOutput) {
  const HandCache cache(property_kv(DType::f32, Layout::HND, 16));
  const std::vector<float> q = random_q(3, 4, 64, 1.0f, 3);
  // Sequence 1 selects nothing, the others one token each.
  const OwnedSelection sel = make_selection(cache, SelectionView::Unit::token, {{5}, {}, {0}});
  for (const Mapping map : {Mapping::softmax(), Mapping::entmax(1.5)}) {
    for (const ImplEntry& impl : decode_impls()) {
      const Result r = run_decode(cache, q, 4, map, &sel.view, 2, impl.impl);
      for (int hq = 0; hq < 4; ++hq) {
        for (int c = 0; c < 64; ++c) EXPECT_EQ(r.out[(1 * 4 + hq) * 64 + c], 0.0f);
        if (map.is_entmax()) {
          EXPECT_TRUE(std::isnan(r.stat[4 + hq]));
        } else {
          EXPECT_EQ(r.stat[4 + hq], -INFINITY);
        }
        // One selected token: the output is that token's value row exactly (p = 1).
        EXPECT_TRUE(std::isfinite(r.stat[hq]));
      }
    }
  }
}

}  // namespace
}  // namespace masskv::test
