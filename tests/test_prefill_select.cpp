// Sparse prefill selection (select/prefill_select.hpp) against plain f64 references on random
// caches of several shapes: dense probabilities and head-averaged masses, the chosen sets of
// every method, the attention recomputed on a support, and budget = everything == dense.
//
// Tolerances: probabilities come from f32 scores and f32 exp (as attn::prefill computes them):
// |p̂ - p| <= 1e-5 · p + 1e-7 per entry, masses the same, every query's mass sums to 1 within
// 1e-5. Outputs on a support as the harness states for prefill: ||ô - o||_inf / ||o||_inf <=
// 1e-5 per row. Chosen sets are compared exactly, from the same f64 mass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "harness.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/select/prefill_select.hpp"

namespace masskv::test {
namespace {

using select::PrefillMethod;
using select::PrefillSelectConfig;

struct Shape {
  int length, n, hkv, ratio, d, page;
  DType dtype;
};

const Shape kShapes[] = {
    {97, 97, 1, 3, 64, 16, DType::f32},   {300, 70, 2, 4, 64, 16, DType::f16},
    {513, 64, 3, 3, 64, 32, DType::bf16}, {1000, 130, 1, 8, 128, 16, DType::f16},
    {200, 33, 4, 1, 96, 64, DType::f32},
};

struct Fixture {
  explicit Fixture(const Shape& s, std::uint32_t seed)
      : shape(s), cache(config(s, seed)), q(random_q(s.n, s.hkv * s.ratio, s.d, 2.0f, seed + 7)) {}
  static KVConfig config(const Shape& s, std::uint32_t seed) {
    KVConfig kv;
    kv.lengths = {s.length};
    kv.num_kv_heads = s.hkv;
    kv.head_dim = s.d;
    kv.page_size = s.page;
    kv.dtype = s.dtype;
    kv.seed = seed;
    kv.value_offset = 0.5f;
    return kv;
  }
  int hq() const { return shape.hkv * shape.ratio; }
  double scale() const { return 1.0 / std::sqrt(double(shape.d)); }
  select::PrefillSelectArgs args() const {
    return {View3<const float>::contiguous(q.data(), shape.n, hq(), shape.d), cache.view(),
            static_cast<float>(scale())};
  }
  const float* qrow(int i, int h) const {
    return q.data() + (static_cast<std::size_t>(i) * hq() + h) * shape.d;
  }
  // f64 softmax probabilities of query i, head h over keys 0..position.
  std::vector<double> ref_p(int i, int h) const {
    const int pos = shape.length - shape.n + i;
    std::vector<double> s = token_scores(cache, 0, h / shape.ratio, qrow(i, h), scale());
    s.resize(static_cast<std::size_t>(pos) + 1);
    const double m = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double& x : s) z += (x = std::exp(x - m));
    for (double& x : s) x /= z;
    return s;
  }
  // f64 head-averaged mass [groups][n][L].
  std::vector<double> ref_mass(bool collapsed) const {
    const int groups = collapsed ? 1 : shape.hkv, per = hq() / groups;
    const std::size_t L = static_cast<std::size_t>(shape.length);
    std::vector<double> m(static_cast<std::size_t>(groups) * shape.n * L, 0.0);
    for (int h = 0; h < hq(); ++h) {
      for (int i = 0; i < shape.n; ++i) {
        const std::vector<double> p = ref_p(i, h);
        double* row = m.data() + (static_cast<std::size_t>(h / per) * shape.n + i) * L;
        for (std::size_t j = 0; j < p.size(); ++j) row[j] += p[j] / per;
      }
    }
    return m;
  }
  std::vector<double> value(int h, int t) const {
    const kv::PagedKVView v = cache.view();
    const std::int32_t page = v.table.page(0, t / v.page_size);
    std::vector<double> out(static_cast<std::size_t>(shape.d));
    visit_dtype(v.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* row = v.value<T>(page, h, t % v.page_size);
      for (int c = 0; c < shape.d; ++c) out[static_cast<std::size_t>(c)] = to_f32(row[c]);
    });
    return out;
  }
  Shape shape;
  HandCache cache;
  std::vector<float> q;
};

// The plain reference selection of one row: items in [0, visible) of `unit` tokens; forced =
// sinks (start < sink tokens) and the diagonal (end > the query block's first position); then
// all other items sorted by (score desc, index asc), taken until ceil(budget / unit) items.
std::vector<int> ref_choose(const std::vector<double>& token_score, std::int64_t visible_tokens,
                            int unit, std::int64_t sink_tokens, std::int64_t qb_first,
                            std::int64_t budget_tokens) {
  const std::int64_t items = (visible_tokens + unit - 1) / unit;
  std::vector<double> score(static_cast<std::size_t>(items), 0.0);
  for (std::int64_t t = 0; t < visible_tokens; ++t) score[t / unit] += token_score[t];
  std::vector<int> keep, rest;
  for (int j = 0; j < items; ++j) {
    const std::int64_t start = std::int64_t{j} * unit;
    (start < sink_tokens || start + unit > qb_first ? keep : rest).push_back(j);
  }
  std::stable_sort(rest.begin(), rest.end(), [&](int a, int b) { return score[a] > score[b]; });
  const std::int64_t budget = (budget_tokens + unit - 1) / unit;  // items covering it
  for (std::size_t x = 0; x < rest.size() && std::ssize(keep) < budget; ++x)
    keep.push_back(rest[x]);
  std::sort(keep.begin(), keep.end());
  return keep;
}

std::vector<int> kept_items(const std::uint8_t* keep, std::int64_t tokens, int unit) {
  std::vector<int> out;
  for (std::int64_t t = 0; t < tokens; t += unit) {
    if (keep[t] != 0) out.push_back(static_cast<int>(t / unit));
  }
  return out;
}

TEST(PrefillSelect, ProbabilitiesAndMassesMatchF64Reference) {
  double worst = 0;
  for (std::size_t c = 0; c < std::size(kShapes); ++c) {
    const Fixture f(kShapes[c], 40 + static_cast<std::uint32_t>(c));
    std::vector<float> p;
    select::prefill_probabilities(f.args(), p);
    const std::size_t L = static_cast<std::size_t>(f.shape.length);
    for (int h = 0; h < f.hq(); ++h) {
      for (int i = 0; i < f.shape.n; ++i) {
        const std::vector<double> ref = f.ref_p(i, h);
        const float* row = p.data() + (static_cast<std::size_t>(h) * f.shape.n + i) * L;
        for (std::size_t j = 0; j < L; ++j) {
          const double r = j < ref.size() ? ref[j] : 0.0;
          const double err = std::abs(row[j] - r);
          worst = std::max(worst, err / (r + 1e-2));
          ASSERT_LE(err, 1e-5 * r + 1e-7)
              << "shape " << c << " head " << h << " query " << i << " key " << j;
        }
      }
    }
    for (const bool collapsed : {true, false}) {
      std::vector<double> mass;
      select::prefill_token_mass(p, f.hq(), f.shape.hkv, f.shape.n, f.shape.length, collapsed,
                                 mass);
      const std::vector<double> ref = f.ref_mass(collapsed);
      ASSERT_EQ(mass.size(), ref.size());
      for (std::size_t x = 0; x < ref.size(); ++x) {
        ASSERT_LE(std::abs(mass[x] - ref[x]), 1e-5 * ref[x] + 1e-7) << "shape " << c << " at " << x;
      }
      for (std::size_t r = 0; r < mass.size() / L; ++r) {
        const double sum = std::accumulate(mass.begin() + r * L, mass.begin() + (r + 1) * L, 0.0);
        EXPECT_NEAR(sum, 1.0, 1e-5) << "shape " << c << " row " << r;
      }
    }
  }
  std::printf("worst probability error relative to p + 0.01: %.3g\n", worst);
}

PrefillSelectConfig config(PrefillMethod m, int k_block, double fraction, int sinks = 1) {
  PrefillSelectConfig c;
  c.method = m;
  c.q_block = 16;
  c.k_block = k_block;
  c.sink_blocks = sinks;
  c.budget.fraction = fraction;
  return c;
}

TEST(PrefillSelect, PerQuerySupportsMatchPlainReference) {
  for (std::size_t c = 0; c < std::size(kShapes); ++c) {
    const Fixture f(kShapes[c], 60 + static_cast<std::uint32_t>(c));
    const std::int64_t L = f.shape.length, first = L - f.shape.n;
    for (const bool collapsed : {true, false}) {
      const std::vector<double> mass = f.ref_mass(collapsed);
      const int groups = collapsed ? 1 : f.shape.hkv;
      for (const PrefillMethod m : {PrefillMethod::token, PrefillMethod::block}) {
        for (const int kb : {16, 64}) {
          for (const double frac : {1.0 / 16, 1.0 / 4}) {
            PrefillSelectConfig cfg = config(m, kb, frac);
            cfg.head_collapsed = collapsed;
            cfg.budget.min_keys = c % 2 == 0 ? 0 : 48;
            std::vector<std::uint8_t> keep;
            select::per_query_support(mass, groups, f.shape.n, L, cfg, keep);
            const int unit = m == PrefillMethod::token ? 1 : kb;
            for (int r = 0; r < groups * f.shape.n; ++r) {
              const int i = r % f.shape.n;
              const std::int64_t pos = first + i;
              const std::vector<double> row(mass.begin() + r * L, mass.begin() + (r + 1) * L);
              const std::vector<int> want =
                  ref_choose(row, pos + 1, unit, kb, first + (i / cfg.q_block) * cfg.q_block,
                             cfg.budget.keys(pos + 1));
              const std::uint8_t* got = keep.data() + static_cast<std::size_t>(r) * L;
              ASSERT_EQ(kept_items(got, pos + 1, unit), want)
                  << "shape " << c << " method " << to_string(m) << " k_block " << kb
                  << " fraction " << frac << " row " << r;
              for (std::int64_t t = pos + 1; t < L; ++t) ASSERT_EQ(got[t], 0) << "future key";
              // Whole items: every token of a kept item up to the position.
              for (std::int64_t t = 0; t <= pos; ++t) ASSERT_EQ(got[t], got[t - t % unit]);
            }
          }
        }
      }
    }
  }
}

TEST(PrefillSelect, SharedAndIndexMasksMatchPlainReference) {
  for (std::size_t c = 0; c < std::size(kShapes); ++c) {
    const Fixture f(kShapes[c], 80 + static_cast<std::uint32_t>(c));
    const std::int64_t L = f.shape.length, first = L - f.shape.n;
    const std::vector<double> mass = f.ref_mass(true);
    // Index scores in f64: mean over q heads of (mean q of the block) · (mean k of the block).
    for (const int kb : {16, 64, 128}) {
      const std::int64_t cols = (L + kb - 1) / kb;
      for (const double frac : {1.0 / 16, 1.0 / 8}) {
        for (const PrefillMethod m : {PrefillMethod::shared, PrefillMethod::index}) {
          const PrefillSelectConfig cfg = config(m, kb, frac, 1 + static_cast<int>(c % 2));
          select::BlockMaskStorage got;
          if (m == PrefillMethod::shared) {
            select::shared_block_mask(mass, f.shape.n, L, cfg, got);
          } else {
            select::index_block_mask(f.args(), cfg, got);
          }
          ASSERT_EQ(got.cols, cols);
          for (std::int64_t r = 0; r < got.rows; ++r) {
            const int i0 = static_cast<int>(r * cfg.q_block);
            const int i1 = std::min(f.shape.n, i0 + cfg.q_block);
            std::vector<double> score(static_cast<std::size_t>(L), 0.0);
            if (m == PrefillMethod::shared) {
              for (int i = i0; i < i1; ++i) {
                for (std::int64_t t = 0; t < L; ++t) score[t] += mass[i * L + t];
              }
            } else {
              // Each block's pooled score on its first token (the reference sums tokens into
              // blocks): mean over heads of (mean q) · k, averaged over the block's keys.
              for (int h = 0; h < f.hq(); ++h) {
                std::vector<float> qm(static_cast<std::size_t>(f.shape.d), 0.0f);
                for (int x = 0; x < f.shape.d; ++x) {
                  double sum = 0;
                  for (int i = i0; i < i1; ++i) sum += f.qrow(i, h)[x];
                  qm[x] = static_cast<float>(sum / (i1 - i0));
                }
                const std::vector<double> sc =
                    token_scores(f.cache, 0, h / f.shape.ratio, qm.data(), 1.0);
                for (std::int64_t b = 0; b < cols; ++b) {
                  const std::int64_t t0 = b * kb, t1 = std::min(L, t0 + kb);
                  for (std::int64_t t = t0; t < t1; ++t) {
                    score[t0] += sc[t] / double(t1 - t0) / f.hq();
                  }
                }
              }
            }
            const std::int64_t last = first + i1 - 1;
            const std::vector<int> want =
                ref_choose(score, last + 1, kb, std::int64_t{cfg.sink_blocks} * kb, first + i0,
                           cfg.budget.keys(last + 1));
            std::vector<int> have;
            for (std::int64_t b = 0; b < cols; ++b) {
              if (got.mask[r * cols + b] != 0) have.push_back(static_cast<int>(b));
            }
            ASSERT_EQ(have, want) << "shape " << c << " " << to_string(m) << " k_block " << kb
                                  << " row " << r;
          }
        }
      }
    }
  }
}

// out on a support = softmax over the support's f64 scores, times V.
TEST(PrefillSelect, SupportAttentionMatchesF64Recomputation) {
  double worst = 0;
  for (std::size_t c = 0; c < std::size(kShapes); ++c) {
    const Fixture f(kShapes[c], 100 + static_cast<std::uint32_t>(c));
    const std::int64_t L = f.shape.length, first = L - f.shape.n;
    std::vector<float> p;
    select::prefill_probabilities(f.args(), p);
    for (const bool collapsed : {true, false}) {
      const int groups = collapsed ? 1 : f.shape.hkv;
      std::vector<double> mass;
      select::prefill_token_mass(p, f.hq(), f.shape.hkv, f.shape.n, L, collapsed, mass);
      for (const PrefillMethod m : {PrefillMethod::token, PrefillMethod::block}) {
        PrefillSelectConfig cfg = config(m, 16, 1.0 / 8);
        cfg.head_collapsed = collapsed;
        std::vector<std::uint8_t> keep;
        select::per_query_support(mass, groups, f.shape.n, L, cfg, keep);
        std::vector<float> out(static_cast<std::size_t>(f.shape.n) * f.hq() * f.shape.d);
        select::support_attention(
            f.args(), p, keep, groups,
            View3<float>::contiguous(out.data(), f.shape.n, f.hq(), f.shape.d));
        for (int i = 0; i < f.shape.n; ++i) {
          for (int h = 0; h < f.hq(); ++h) {
            const int g = collapsed ? 0 : h / f.shape.ratio;
            const std::uint8_t* kp =
                keep.data() + (static_cast<std::size_t>(g) * f.shape.n + i) * L;
            std::vector<double> s =
                token_scores(f.cache, 0, h / f.shape.ratio, f.qrow(i, h), f.scale());
            double mx = -INFINITY;
            for (std::int64_t t = 0; t <= first + i; ++t) {
              if (kp[t] != 0) mx = std::max(mx, s[t]);
            }
            std::vector<double> o(static_cast<std::size_t>(f.shape.d), 0.0);
            double z = 0;
            for (std::int64_t t = 0; t <= first + i; ++t) {
              if (kp[t] == 0) continue;
              const double w = std::exp(s[t] - mx);
              z += w;
              const std::vector<double> v = f.value(h / f.shape.ratio, static_cast<int>(t));
              for (int x = 0; x < f.shape.d; ++x) o[x] += w * v[x];
            }
            double norm = 0, err = 0;
            const float* got = out.data() + (static_cast<std::size_t>(i) * f.hq() + h) * f.shape.d;
            for (int x = 0; x < f.shape.d; ++x) {
              o[x] /= z;
              norm = std::max(norm, std::abs(o[x]));
              err = std::max(err, std::abs(got[x] - o[x]));
            }
            worst = std::max(worst, err / norm);
            ASSERT_LE(err, 1e-5 * norm) << "shape " << c << " query " << i << " head " << h;
          }
        }
      }
    }
  }
  std::printf("worst support-attention rel err %.3g\n", worst);
}

// Budget = every key: each method attends everything, and its output equals dense prefill.
TEST(PrefillSelect, WholeBudgetEqualsDensePrefill) {
  for (std::size_t c = 0; c < std::size(kShapes); ++c) {
    const Fixture f(kShapes[c], 120 + static_cast<std::uint32_t>(c));
    const std::int64_t L = f.shape.length;
    const std::size_t out_size = static_cast<std::size_t>(f.shape.n) * f.hq() * f.shape.d;
    const std::int32_t indptr[2] = {0, f.shape.n};
    attn::PrefillArgs a;
    a.q = f.args().q;
    a.q_indptr = indptr;
    a.cache = f.cache.view();
    a.scale = static_cast<float>(f.scale());
    std::vector<double> ref(out_size), lse(static_cast<std::size_t>(f.shape.n) * f.hq());
    std::vector<float> out(out_size);
    a.out = View3<float>::contiguous(out.data(), f.shape.n, f.hq(), f.shape.d);
    attn::prefill_reference(a, ref, lse);
    std::vector<float> p;
    select::prefill_probabilities(f.args(), p);
    std::vector<double> mass;
    select::prefill_token_mass(p, f.hq(), f.shape.hkv, f.shape.n, L, true, mass);
    for (const PrefillMethod m : {PrefillMethod::token, PrefillMethod::block, PrefillMethod::shared,
                                  PrefillMethod::index}) {
      const PrefillSelectConfig cfg = config(m, 64, 1.0);
      std::fill(out.begin(), out.end(), 0.0f);
      std::int64_t attended = 0;
      if (m == PrefillMethod::token || m == PrefillMethod::block) {
        std::vector<std::uint8_t> keep;
        select::per_query_support(mass, 1, f.shape.n, L, cfg, keep);
        attended = std::accumulate(keep.begin(), keep.end(), std::int64_t{0});
        select::support_attention(f.args(), p, keep, 1, a.out);
      } else {
        select::BlockMaskStorage mask;
        if (m == PrefillMethod::shared) {
          select::shared_block_mask(mass, f.shape.n, L, cfg, mask);
        } else {
          select::index_block_mask(f.args(), cfg, mask);
        }
        attended = mask.keys_attended(f.shape.n, L);
        const attn::BlockMask view = mask.view();
        attn::PrefillArgs b = a;
        b.block_mask = &view;
        attn::prefill(b);
      }
      const std::int64_t first = L - f.shape.n;
      EXPECT_EQ(attended, f.shape.n * first + std::int64_t{f.shape.n} * (f.shape.n + 1) / 2)
          << to_string(m);
      const Errors e = compare(out, ref, {}, {}, f.shape.d);
      EXPECT_LE(e.out, 1e-5) << "shape " << c << " " << to_string(m);
    }
  }
}

// The learned indexer: random selector key rows (f32, several groups) and projected queries;
// per query block, the f64 block scores Σ_i Σ_g softmax(q_s,ig · k_s,jg over j <= pos_i) / G
// summed per key block. The mask must keep the sinks and the diagonal, hold the budget's number
// of blocks, and prefer higher scores: every chosen other block scores at least every unchosen
// one (to 1e-5: the f32 GEMM's scores, within 1e-5 relative of f64, decide only near-ties).
TEST(PrefillSelect, LearnedMaskFollowsF64BlockScores) {
  struct LShape {
    int length, n, groups, dim, page;
  };
  for (const LShape ls :
       {LShape{300, 70, 1, 32, 16}, LShape{777, 129, 2, 16, 32}, LShape{130, 130, 3, 8, 16}}) {
    kv::CacheConfig cc;
    cc.num_kv_heads = 1;
    cc.head_dim = 8;
    cc.page_size = ls.page;
    cc.dtype = DType::f32;
    cc.capacity_pages = ls.length / ls.page + 2;
    cc.key_row_groups = ls.groups;
    cc.key_row_dim = ls.dim;
    kv::PagedKVCache cache(cc);
    const kv::SeqId seq = cache.create();
    std::mt19937 rng(static_cast<std::uint32_t>(ls.length));
    const auto uniform = [&](float a, float b) {
      return std::uniform_real_distribution<float>(a, b)(rng);
    };
    std::vector<float> k(static_cast<std::size_t>(ls.length) * 8), v(k.size()),
        rows(static_cast<std::size_t>(ls.length) * ls.groups * ls.dim),
        q(static_cast<std::size_t>(ls.n) * ls.groups * ls.dim);
    for (float& x : k) x = uniform(-1.f, 1.f);
    for (float& x : v) x = uniform(-1.f, 1.f);
    for (float& x : rows) x = uniform(-1.f, 1.f);
    for (float& x : q) x = uniform(-1.5f, 1.5f);
    cache.append(seq, k, v, ls.length, rows);
    const kv::PageTableStorage table = cache.page_table(std::span<const kv::SeqId>(&seq, 1));
    const std::int64_t L = ls.length, first = L - ls.n;
    for (const int kb : {16, 64}) {
      PrefillSelectConfig cfg = config(PrefillMethod::learned, kb, 1.0 / 8, 1);
      select::BlockMaskStorage got;
      select::learned_block_mask(q, cache.key_rows(), table.table(), ls.n, cfg, got);
      const std::int64_t cols = (L + kb - 1) / kb;
      ASSERT_EQ(got.cols, cols);
      for (std::int64_t r = 0; r < got.rows; ++r) {
        const int i0 = static_cast<int>(r * cfg.q_block);
        const int i1 = std::min(ls.n, i0 + cfg.q_block);
        std::vector<double> score(static_cast<std::size_t>(cols), 0.0);
        for (int i = i0; i < i1; ++i) {
          const std::int64_t visible = first + i + 1;
          for (int g = 0; g < ls.groups; ++g) {
            std::vector<double> s(static_cast<std::size_t>(visible));
            for (std::int64_t t = 0; t < visible; ++t) {
              double dot = 0;
              for (int x = 0; x < ls.dim; ++x)
                dot += double(q[(std::size_t(i) * ls.groups + g) * ls.dim + x]) *
                       rows[(std::size_t(t) * ls.groups + g) * ls.dim + x];
              s[t] = dot;
            }
            const double m = *std::max_element(s.begin(), s.end());
            double z = 0;
            for (double& x : s) z += (x = std::exp(x - m));
            for (std::int64_t t = 0; t < visible; ++t) score[t / kb] += s[t] / z / ls.groups;
          }
        }
        const std::int64_t last = first + i1 - 1, items = (last + 1 + kb - 1) / kb;
        const std::int64_t budget = (cfg.budget.keys(last + 1) + kb - 1) / kb;
        double min_chosen = INFINITY, max_other = -INFINITY;
        std::int64_t chosen = 0;
        for (std::int64_t b = 0; b < cols; ++b) {
          const bool on = got.mask[r * cols + b] != 0;
          const bool forced = b < cfg.sink_blocks || (b + 1) * kb > first + i0;
          ASSERT_FALSE(b >= items && on) << "block past the query block's last key";
          if (b >= items) continue;
          if (forced) {
            ASSERT_TRUE(on) << "sink or diagonal block " << b << " dropped, row " << r;
          } else if (on) {
            min_chosen = std::min(min_chosen, score[b]);
          } else {
            max_other = std::max(max_other, score[b]);
          }
          chosen += on;
        }
        EXPECT_GE(chosen, std::min(items, budget)) << "row " << r;
        EXPECT_GE(min_chosen, max_other - 1e-5) << "row " << r << " k_block " << kb;
      }
    }
  }
  // Shapes that do not agree are errors, not reads past the arrays.
  kv::CacheConfig cc;
  cc.num_kv_heads = 1;
  cc.head_dim = 8;
  cc.dtype = DType::f32;
  cc.capacity_pages = 4;
  cc.key_row_groups = 1;
  cc.key_row_dim = 8;
  kv::PagedKVCache cache(cc);
  const kv::SeqId seq = cache.create();
  std::vector<float> kv8(8 * 20, 0.5f), rows(8 * 20, 0.25f), q(8 * 3, 1.0f);
  cache.append(seq, kv8, kv8, 20, rows);
  const kv::PageTableStorage table = cache.page_table(std::span<const kv::SeqId>(&seq, 1));
  select::BlockMaskStorage out;
  EXPECT_THROW(select::learned_block_mask(q, cache.key_rows(), table.table(), 4,
                                          config(PrefillMethod::learned, 16, 0.5, 1), out),
               masskv::Error);
  EXPECT_THROW(select::learned_block_mask(q, cache.key_rows(), table.table(), 30,
                                          config(PrefillMethod::learned, 16, 0.5, 1), out),
               masskv::Error);
}

TEST(PrefillSelect, BudgetRuleAndBadConfigs) {
  select::PrefillBudget b;
  b.fraction = 1.0 / 16;
  EXPECT_EQ(b.keys(1600), 100);
  EXPECT_EQ(b.keys(1601), 101);  // ceil
  b.min_keys = 2048;
  EXPECT_EQ(b.keys(1600), 1600);  // never more than visible
  EXPECT_EQ(b.keys(64000), 4000);
  b.tokens = 300;
  EXPECT_EQ(b.keys(64000), 300);
  PrefillSelectConfig c;
  c.k_block = 0;
  EXPECT_THROW(c.validate(), masskv::Error);
  c = {};
  c.budget.fraction = 0;
  EXPECT_THROW(c.validate(), masskv::Error);
  c = {};
  c.method = PrefillMethod::shared;
  c.head_collapsed = false;
  EXPECT_THROW(c.validate(), masskv::Error);
  EXPECT_THROW(select::parse_prefill_method("blocks", "--sparse-prefill"), masskv::Error);
  EXPECT_EQ(select::parse_prefill_method("index", "x"), PrefillMethod::index);
  EXPECT_EQ(select::parse_prefill_method("learned", "x"), PrefillMethod::learned);
}

}  // namespace
}  // namespace masskv::test
