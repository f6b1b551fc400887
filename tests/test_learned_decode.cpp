// The learned selector at decode (docs/design.md §2.8; learn/project.hpp, kv/key_rows.hpp,
// select::Method::learned, model::Session's selector key cache):
//   - key rows in the paged cache: stored as encoded, shared by forks, copied on write;
//   - the projections against an f64 reference (both input kinds, groups 1 / n_kv, RoPE), and
//     the analytic mean-score selector giving the mean of the heads' scores;
//   - score -> softmax -> page mass -> top-K ∧ top-p against a plain f64 reference on random
//     shapes (d_s 16/20/32/64, groups 1 and n_kv, lengths crossing pages, p 0.5/0.9/1, K_min
//     and K_max edge cases, f32 and bf16 rows), the same bits for 1 and 3 threads;
//   - on SmolLM2 (skipped when absent): a budget covering every page is dense decode, the
//     mean-score selector picks the pages of the mean-score oracle, a 2-page budget reads less,
//     unlisted layers stay dense, forks and decode_batch equal separate runs, mismatches throw.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "expect_error.hpp"
#include "installed_model.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/key_formats.hpp"
#include "masskv/learn/construct.hpp"
#include "masskv/learn/project.hpp"
#include "masskv/model/model.hpp"
#include "masskv/select/selector.hpp"

namespace masskv {
namespace {

using test::expect_error;

std::vector<float> randn(std::size_t n, std::mt19937& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

// ---- key rows in the cache ------------------------------------------------------------------

kv::CacheConfig rows_config(kv::RowFormat f, int groups, int dim) {
  kv::CacheConfig c;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.page_size = 4;
  c.dtype = DType::f32;
  c.capacity_pages = 16;
  c.key_row_groups = groups;
  c.key_row_dim = dim;
  c.key_row_format = f;
  return c;
}

std::vector<float> stored_row(const kv::KeyRowsView& v, std::int32_t page, int group, int slot) {
  std::vector<float> out(static_cast<std::size_t>(v.dim));
  kv::decode_row(v.format, v.row(page, group, slot), v.dim, out.data());
  return out;
}

TEST(KeyRows, StoredAsEncodedSharedByForksCopiedOnWrite) {
  for (const kv::RowFormat f : {kv::RowFormat::f32, kv::RowFormat::bf16}) {
    SCOPED_TRACE(to_string(f));
    std::mt19937 rng(3);
    const int G = 2, dim = 5, tok = 2 * 8;
    kv::PagedKVCache cache(rows_config(f, G, dim));
    const kv::SeqId a = cache.create();
    const auto k = randn(6 * tok, rng), v = randn(6 * tok, rng), r = randn(6 * G * dim, rng);
    cache.append(a, k, v, 6, r);  // pages: 4 + 2 (partial)
    const kv::SeqId b = cache.fork(a);
    const auto r2 = randn(G * dim, rng), r3 = randn(G * dim, rng);
    cache.append(b, std::span(k).first(tok), std::span(v).first(tok), 1, r2);  // copies page 1
    cache.append(a, std::span(k).first(tok), std::span(v).first(tok), 1, r3);  // in place
    const kv::KeyRowsView view = cache.key_rows();
    ASSERT_FALSE(view.empty());
    const auto ta = cache.page_table(std::span<const kv::SeqId>(&a, 1));
    const auto tb = cache.page_table(std::span<const kv::SeqId>(&b, 1));
    EXPECT_EQ(ta.indices[0], tb.indices[0]);  // the full page is shared
    EXPECT_NE(ta.indices[1], tb.indices[1]);  // the partial one was copied
    const auto expect_row = [&](const kv::PageTableStorage& t, int token, int g, const float* x) {
      const std::vector<float> got = stored_row(view, t.indices[static_cast<std::size_t>(token / 4)], g, token % 4);
      for (int c = 0; c < dim; ++c) {
        const float want = f == kv::RowFormat::f32 ? x[c] : bf16_to_f32(f32_to_bf16(x[c]));
        EXPECT_EQ(got[static_cast<std::size_t>(c)], want) << "token " << token << " group " << g;
      }
    };
    for (int t = 0; t < 6; ++t) {
      for (int g = 0; g < G; ++g) {
        expect_row(ta, t, g, r.data() + (t * G + g) * dim);
        expect_row(tb, t, g, r.data() + (t * G + g) * dim);
      }
    }
    for (int g = 0; g < G; ++g) {
      expect_row(ta, 6, g, r3.data() + g * dim);
      expect_row(tb, 6, g, r2.data() + g * dim);
    }
    EXPECT_EQ(cache.key_row_bytes_per_token(), G * static_cast<double>(kv::row_bytes(f, dim)));
  }
}

TEST(KeyRows, BadRowsAndConfigsThrow) {
  kv::PagedKVCache cache(rows_config(kv::RowFormat::f32, 1, 4));
  const kv::SeqId s = cache.create();
  const std::vector<float> k(16, 0.5f), v(16, 0.5f);
  expect_error([&] { cache.append(s, k, v, 1); }, ErrorCode::shape_mismatch, "key_rows");
  std::vector<float> rows(4, 1.0f);
  rows[2] = NAN;
  expect_error([&] { cache.append(s, k, v, 1, rows); }, ErrorCode::non_finite, "key_rows");
  EXPECT_EQ(cache.length(s), 0);
  kv::PagedKVCache plain(rows_config(kv::RowFormat::f32, 0, 0));
  const kv::SeqId p = plain.create();
  expect_error([&] { plain.append(p, k, v, 1, std::vector<float>(4, 1.0f)); },
               ErrorCode::shape_mismatch, "key_rows");
  EXPECT_TRUE(plain.key_rows().empty());
  expect_error([] { rows_config(kv::RowFormat::f32, 2, 0).validate(); }, ErrorCode::invalid_argument,
               "key_row_groups");
  expect_error([] { (void)kv::parse_row_format("int3", "--selector-key-format"); },
               ErrorCode::invalid_argument, "--selector-key-format");
}

// The 4-bit row formats (§2.9) in the key cache: a stored row decodes to what
// kv::quantize_row / dequantize_row give, forks share it, and score_rows on the codes equals
// the f64 dot with the decoded values within (dim + 4) 2^-24 Σ|q x̂| (f32 sums per block).
TEST(KeyRows, FourBitFormatsStoreQuantisedRowsAndScoreThem) {
  for (const kv::RowFormat f : {kv::RowFormat::int4, kv::RowFormat::mxfp4, kv::RowFormat::nvfp4,
                                kv::RowFormat::mxfp8}) {
    SCOPED_TRACE(to_string(f));
    const kv::KeyFormat kf = f == kv::RowFormat::int4    ? kv::KeyFormat::int4
                             : f == kv::RowFormat::mxfp4 ? kv::KeyFormat::mxfp4
                             : f == kv::RowFormat::mxfp8 ? kv::KeyFormat::mxfp8
                                                         : kv::KeyFormat::nvfp4;
    std::mt19937 rng(11);
    const int G = 2, dim = 64, tok = 2 * 8, n = 9;
    kv::PagedKVCache cache(rows_config(f, G, dim));
    const kv::SeqId a = cache.create();
    const auto k = randn(n * tok, rng), v = randn(n * tok, rng), r = randn(n * G * dim, rng);
    cache.append(a, k, v, n, r);
    const kv::SeqId b = cache.fork(a);
    const kv::KeyRowsView view = cache.key_rows();
    EXPECT_EQ(view.row_bytes(), static_cast<std::size_t>(kv::row_bytes(kf, dim)));
    EXPECT_EQ(cache.key_row_bytes_per_token(), G * static_cast<double>(kv::row_bytes(kf, dim)));
    const auto t = cache.page_table(std::span<const kv::SeqId>(&b, 1));
    const auto q = randn(dim, rng);
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(kv::code_bytes(kf, dim)));
    std::vector<std::uint8_t> scales(static_cast<std::size_t>(kv::scale_bytes(kf, dim)) + 1);
    std::vector<float> want(static_cast<std::size_t>(dim));
    for (int tokn = 0; tokn < n; ++tokn) {
      for (int g = 0; g < G; ++g) {
        const float* x = r.data() + (tokn * G + g) * dim;
        kv::quantize_row(kf, x, dim, codes.data(), scales.data());
        kv::dequantize_row(kf, codes.data(), scales.data(), dim, want.data());
        const std::int32_t page = t.indices[static_cast<std::size_t>(tokn / 4)];
        EXPECT_EQ(stored_row(view, page, g, tokn % 4), want) << "token " << tokn;
        double exact = 0, mag = 0;
        for (int c = 0; c < dim; ++c) {
          exact += static_cast<double>(q[c]) * want[c];
          mag += std::fabs(static_cast<double>(q[c]) * want[c]);
        }
        double got = 0;
        kv::score_rows(f, q.data(), view.row(page, g, tokn % 4), 0, 1, dim, &got);
        EXPECT_NEAR(got, exact, (dim + 4) * 0x1p-24 * mag + 1e-30) << "token " << tokn;
      }
    }
  }
  expect_error([] { rows_config(kv::RowFormat::int4, 1, 48).validate(); },
               ErrorCode::invalid_argument, "key_row_dim");
  expect_error([] { rows_config(kv::RowFormat::nvfp4, 1, 24).validate(); },
               ErrorCode::invalid_argument, "key_row_dim");
  EXPECT_EQ(kv::parse_row_format("mxfp4", "x"), kv::RowFormat::mxfp4);
}

// ---- projections ----------------------------------------------------------------------------

model::ModelConfig small_config() {
  model::ModelConfig c;
  c.arch = model::Arch::llama;
  c.n_layer = 3;
  c.n_embd = 40;
  c.n_head = 6;
  c.n_head_kv = 2;
  c.head_dim = 8;
  c.rope_base = 10000;
  c.rope_freq_scale = 1;
  c.is_local.assign(3, 0);
  c.attn_scale = 1.0f / std::sqrt(8.0f);
  return c;
}

// f64 reference of learn::project: W x per group (its slice for qk input), then RoPE in
// adjacent pairs with angles pos * scale * base^(-2j / d_s).
std::vector<double> project_reference(const learn::Selector& s, const learn::LayerSelector& l,
                                      learn::Side side, const std::vector<float>& x, int n,
                                      const std::vector<std::int64_t>& pos, double base) {
  const bool q = side == learn::Side::query;
  const int width = q ? l.q_in : l.k_in, G = l.groups, D = l.dim;
  const int stride = s.input == learn::Input::qk ? G * width : width;
  const std::vector<float>& w = q ? l.wq : l.wk;
  std::vector<double> out(static_cast<std::size_t>(n * G * D));
  for (int t = 0; t < n; ++t) {
    for (int g = 0; g < G; ++g) {
      const int off = s.input == learn::Input::qk ? g * width : 0;
      double* o = out.data() + (t * G + g) * D;
      for (int r = 0; r < D; ++r) {
        double acc = 0;
        for (int i = 0; i < width; ++i) {
          acc += static_cast<double>(w[static_cast<std::size_t>((g * D + r) * width + i)]) *
                 x[static_cast<std::size_t>(t * stride + off + i)];
        }
        o[r] = acc;
      }
      if (!l.rope) continue;
      for (int j = 0; j < D / 2; ++j) {
        const double ang = static_cast<double>(pos[static_cast<std::size_t>(t)]) * std::pow(base, -2.0 * j / D);
        const double a = o[2 * j], b = o[2 * j + 1];
        o[2 * j] = a * std::cos(ang) - b * std::sin(ang);
        o[2 * j + 1] = a * std::sin(ang) + b * std::cos(ang);
      }
    }
  }
  return out;
}

TEST(LearnProject, MatchesF64ReferenceForEveryInputKind) {
  const model::ModelConfig c = small_config();
  std::mt19937 rng(11);
  for (const learn::Input input : {learn::Input::qk, learn::Input::hidden}) {
    for (const int groups : {1, c.n_head_kv}) {
      for (const int n : {1, 5}) {
        const bool rope = input == learn::Input::hidden;
        const learn::Selector s = learn::random_selector(c, input, groups, 6, rope, 5);
        const learn::LayerSelector& l = s.layers[1];
        std::vector<std::int64_t> pos(static_cast<std::size_t>(n));
        for (int t = 0; t < n; ++t) pos[static_cast<std::size_t>(t)] = 1000 + 37 * t;
        for (const learn::Side side : {learn::Side::query, learn::Side::key}) {
          SCOPED_TRACE(testing::Message() << (input == learn::Input::qk ? "qk" : "hidden") << " groups "
                                          << groups << " n " << n << " side " << static_cast<int>(side));
          const int row = input == learn::Input::hidden ? c.n_embd
                          : side == learn::Side::query  ? c.n_head * c.head_dim
                                                        : c.n_head_kv * c.head_dim;
          const auto x = randn(static_cast<std::size_t>(n * row), rng);
          std::vector<float> out(static_cast<std::size_t>(n * groups * l.dim)), scratch;
          learn::project(s, l, side, x.data(), static_cast<std::size_t>(n), pos,
                         learn::rope_inv_freq(c, 1, l.dim), out.data(), scratch);
          const auto ref = project_reference(s, l, side, x, n, pos, c.rope_base);
          // f32 products and sums (1e-5 * Σ|w x| covers them, as Matmul.*) plus the f32
          // cos/sin of the rotation: 1e-5 of the row's size.
          for (std::size_t i = 0; i < out.size(); ++i) {
            EXPECT_NEAR(out[i], ref[i], 1e-4 * (1.0 + std::fabs(ref[i]))) << i;
          }
        }
      }
    }
  }
}

TEST(LearnProject, MeanScoreSelectorGivesTheMeanOfTheHeadsScores) {
  const model::ModelConfig c = small_config();
  std::mt19937 rng(2);
  const int Hq = c.n_head, Hkv = c.n_head_kv, D = c.head_dim, gsize = Hq / Hkv;
  const auto q = randn(static_cast<std::size_t>(Hq * D), rng), k = randn(static_cast<std::size_t>(Hkv * D), rng);
  const std::vector<std::int64_t> pos{7};
  for (const int groups : {1, Hkv}) {
    const learn::Selector s = learn::mean_score_selector(c, groups);
    const learn::LayerSelector& l = s.layers[0];
    std::vector<float> pq(static_cast<std::size_t>(groups * l.dim)), pk(pq.size()), scratch;
    learn::project(s, l, learn::Side::query, q.data(), 1, pos, {}, pq.data(), scratch);
    learn::project(s, l, learn::Side::key, k.data(), 1, pos, {}, pk.data(), scratch);
    for (int g = 0; g < groups; ++g) {
      double shat = 0, want = 0;
      for (int i = 0; i < l.dim; ++i) shat += static_cast<double>(pq[static_cast<std::size_t>(g * l.dim + i)]) * pk[static_cast<std::size_t>(g * l.dim + i)];
      const int h0 = groups == 1 ? 0 : g * gsize, h1 = groups == 1 ? Hq : h0 + gsize;
      for (int h = h0; h < h1; ++h) {
        double dot = 0;
        for (int x = 0; x < D; ++x) dot += static_cast<double>(q[static_cast<std::size_t>(h * D + x)]) * k[static_cast<std::size_t>((h / gsize) * D + x)];
        want += c.attn_scale * dot / (h1 - h0);
      }
      EXPECT_NEAR(shat, want, 1e-5 * (1 + std::fabs(want))) << "groups " << groups << " g " << g;
    }
  }
}

TEST(LearnProject, ModelMismatchAndBadSelectorsThrow) {
  const model::ModelConfig c = small_config();
  learn::Selector s = learn::mean_score_selector(c, 1);
  learn::check_model(s, c);
  model::ModelConfig other = c;
  other.n_layer = 4;
  other.is_local.assign(4, 0);
  expect_error([&] { learn::check_model(s, other); }, ErrorCode::invalid_argument, "selector", "layers");
  other = c;
  other.arch = model::Arch::gemma3;
  expect_error([&] { learn::check_model(s, other); }, ErrorCode::invalid_argument, "selector", "gemma3");
  s.layers[0].wk.pop_back();
  expect_error([&] { learn::check_model(s, c); }, ErrorCode::invalid_argument, "selector");
  expect_error([&] { (void)learn::mean_score_selector(c, 3); }, ErrorCode::invalid_argument, "groups");
  expect_error([&] { (void)learn::random_selector(c, learn::Input::hidden, 1, 5, true, 1); },
               ErrorCode::invalid_argument, "dim");
}

// ---- selection against the f64 reference ----------------------------------------------------

struct Shape {
  int hkv, groups, dim, page, sinks, window;
  std::vector<int> lengths;  // per sequence; the second is a fork of the first when longer
  kv::RowFormat format;
};

// The plain f64 reference of one (sequence, kv head): scores of the stored rows, softmax,
// page masses, then kept pages (sinks, window, last) first and the rest by mass (ties to the
// lower id), the smallest prefix with mass >= p, clamped to [K_min, K_max] pages.
std::vector<std::int32_t> reference_selection(const kv::KeyRowsView& keys, const kv::PageTable& t,
                                              int b, int group, const float* q,
                                              const select::SelectorConfig& c, double* held) {
  const int P = keys.page_size, pages = t.num_pages(b);
  const std::int64_t L = t.length(b, P);
  std::vector<double> s;
  std::vector<float> row(static_cast<std::size_t>(keys.dim));
  for (int j = 0; j < pages; ++j) {
    for (int slot = 0; slot < t.page_len(b, j, P); ++slot) {
      kv::decode_row(keys.format, keys.row(t.page(b, j), group, slot), keys.dim, row.data());
      double acc = 0;
      for (int x = 0; x < keys.dim; ++x) acc += static_cast<double>(q[x]) * row[static_cast<std::size_t>(x)];
      s.push_back(acc);
    }
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double z = 0;
  for (double& v : s) z += (v = std::exp(v - mx));
  std::vector<double> mass(static_cast<std::size_t>(pages), 0.0);
  for (std::size_t i = 0; i < s.size(); ++i) mass[i / static_cast<std::size_t>(P)] += s[i] / z;
  std::vector<char> in(static_cast<std::size_t>(pages), 0);
  for (int j = 0; j < std::min(c.sink_pages, pages); ++j) in[static_cast<std::size_t>(j)] = 1;
  const std::int64_t win = std::max<std::int64_t>(0, L - c.window_tokens);
  for (int j = 0; j < pages; ++j) {
    if (j == pages - 1 || static_cast<std::int64_t>(j + 1) * P > win) in[static_cast<std::size_t>(j)] = 1;
  }
  int count = static_cast<int>(std::count(in.begin(), in.end(), 1));
  const auto pages_for = [&](std::int64_t tokens) { return static_cast<int>((tokens + P - 1) / P); };
  const int cap = c.budget.tokens > 0 ? std::min(pages, std::max(count, pages_for(c.budget.tokens))) : pages;
  const bool top_p = c.budget.kind == select::Budget::Kind::top_p;
  const int floor = top_p ? std::min(cap, std::max(count, pages_for(c.budget.min_tokens))) : count;
  double have = 0;
  for (int j = 0; j < pages; ++j) have += in[static_cast<std::size_t>(j)] ? mass[static_cast<std::size_t>(j)] : 0.0;
  std::vector<int> order;
  for (int j = 0; j < pages; ++j) {
    if (!in[static_cast<std::size_t>(j)]) order.push_back(j);
  }
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
    return mass[static_cast<std::size_t>(x)] > mass[static_cast<std::size_t>(y)];
  });
  for (const int j : order) {
    if (count >= cap) break;
    if (top_p && have >= c.budget.p && count >= floor) break;
    in[static_cast<std::size_t>(j)] = 1;
    have += mass[static_cast<std::size_t>(j)];
    ++count;
  }
  *held = have;
  std::vector<std::int32_t> ids;
  for (int j = 0; j < pages; ++j) {
    if (in[static_cast<std::size_t>(j)]) ids.push_back(j);
  }
  return ids;
}

TEST(LearnedSelect, MatchesF64ReferenceOnRandomShapes) {
  const std::vector<Shape> shapes{
      {1, 1, 16, 4, 1, 0, {1, 15}, kv::RowFormat::f32},
      {2, 2, 32, 16, 1, 20, {17, 113}, kv::RowFormat::f32},
      {3, 1, 64, 16, 0, 0, {200, 257}, kv::RowFormat::bf16},
      {4, 4, 20, 8, 2, 9, {33, 90}, kv::RowFormat::f32},  // d_s off the 8-lane kernels
      {2, 1, 32, 1, 1, 0, {40, 41}, kv::RowFormat::bf16},
  };
  struct Rule {
    select::Budget::Kind kind;
    std::int64_t tokens, min_tokens;
    double p;
  };
  const std::vector<Rule> rules{
      {select::Budget::Kind::fixed, 1, 0, 0.9},    // below the kept pages: the kept pages only
      {select::Budget::Kind::fixed, 48, 0, 0.9},
      {select::Budget::Kind::fixed, 100000, 0, 0.9},
      {select::Budget::Kind::top_p, 0, 0, 0.5},    // no cap
      {select::Budget::Kind::top_p, 0, 0, 0.9},
      {select::Budget::Kind::top_p, 0, 0, 1.0},    // every page
      {select::Budget::Kind::top_p, 64, 0, 0.9},   // capped
      {select::Budget::Kind::top_p, 64, 64, 0.5},  // K_min = K_max: a fixed budget
      {select::Budget::Kind::top_p, 0, 40, 0.5},   // K_min only
      {select::Budget::Kind::top_p, 32, 1, 1.0},   // K_min below the kept pages
  };
  std::mt19937 rng(19);
  int checked = 0, differed_from_fixed = 0;
  for (const Shape& sh : shapes) {
    kv::CacheConfig cc;
    cc.num_kv_heads = sh.hkv;
    cc.head_dim = 8;
    cc.page_size = sh.page;
    cc.dtype = DType::f32;
    cc.capacity_pages = 2 * (sh.lengths[1] / sh.page + 2);
    cc.key_row_groups = sh.groups;
    cc.key_row_dim = sh.dim;
    cc.key_row_format = sh.format;
    kv::PagedKVCache cache(cc);
    const int tok = sh.hkv * 8, rtok = sh.groups * sh.dim;
    // Scores of spread ~3: peaked enough that top-p stops early, flat enough to need pages.
    const auto fill = [&](kv::SeqId s, int n) {
      const auto k = randn(static_cast<std::size_t>(n * tok), rng), v = randn(k.size(), rng);
      const auto r = randn(static_cast<std::size_t>(n * rtok), rng, 3.0f / std::sqrt(static_cast<float>(sh.dim)));
      cache.append(s, k, v, n, r);
    };
    const kv::SeqId a = cache.create();
    fill(a, sh.lengths[0]);
    const kv::SeqId b = cache.fork(a);  // shares a's pages, then grows on its own
    fill(b, sh.lengths[1] - sh.lengths[0]);
    const std::vector<kv::SeqId> seqs{a, b};
    const kv::PageTableStorage table = cache.page_table(seqs);
    const auto q = randn(static_cast<std::size_t>(2 * sh.groups * sh.dim), rng);
    const std::vector<float> qh(static_cast<std::size_t>(2 * 3 * sh.hkv * 8), 0.5f);  // model q: unused
    select::SelectArgs sa;
    sa.q = View3<const float>::contiguous(qh.data(), 2, 3 * sh.hkv, 8);
    sa.cache = cache.view(table);
    sa.summaries = cache.summaries();
    sa.learned_q = View3<const float>::contiguous(q.data(), 2, sh.groups, sh.dim);
    sa.learned_keys = cache.key_rows();
    for (const Rule& r : rules) {
      select::SelectorConfig c;
      c.method = select::Method::learned;
      c.sink_pages = sh.sinks;
      c.window_tokens = sh.window;
      c.budget.kind = r.kind;
      c.budget.tokens = r.tokens;
      c.budget.min_tokens = r.min_tokens;
      c.budget.p = r.p;
      select::SelectOutput one, three;
      omp_set_num_threads(1);
      select::run_selector(sa, c, one);
      omp_set_num_threads(3);
      select::run_selector(sa, c, three);
      omp_set_num_threads(1);
      EXPECT_EQ(one.selection.ids, three.selection.ids);
      EXPECT_EQ(one.selection.count, three.selection.count);
      EXPECT_EQ(0, std::memcmp(one.estimate.data(), three.estimate.data(), one.estimate.size() * sizeof(double)));
      const SelectionView sv = one.selection.view();
      for (int bi = 0; bi < 2; ++bi) {
        for (int h = 0; h < sh.hkv; ++h) {
          SCOPED_TRACE(testing::Message() << "hkv " << sh.hkv << " groups " << sh.groups << " d_s "
                                          << sh.dim << " page " << sh.page << " len "
                                          << sh.lengths[static_cast<std::size_t>(bi)] << " kind "
                                          << static_cast<int>(r.kind) << " K " << r.tokens << " Kmin "
                                          << r.min_tokens << " p " << r.p << " kv head " << h);
          const int g = sh.groups == 1 ? 0 : h;
          double held = 0;
          const auto want = reference_selection(sa.learned_keys, sa.cache.table, bi, g,
                                                q.data() + (bi * sh.groups + g) * sh.dim, c, &held);
          const auto got = sv.list(bi, h);
          EXPECT_EQ(std::vector<std::int32_t>(got.begin(), got.end()), want);
          for (int i = 0; i < 3; ++i) {
            EXPECT_NEAR(one.estimate[static_cast<std::size_t>(bi * 3 * sh.hkv + h * 3 + i)], held, 1e-12);
          }
          if (r.kind == select::Budget::Kind::top_p && r.min_tokens == 0 &&
              static_cast<int>(want.size()) < sa.cache.table.num_pages(bi)) {
            ++differed_from_fixed;  // top-p stopped before taking every page
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(differed_from_fixed, 10);  // the p rule really cut somewhere
  std::printf("[ learned ] %d (shape, rule, sequence, kv head) selections equal the f64 reference\n",
              checked);
}

TEST(LearnedSelect, BadArgumentsThrow) {
  kv::CacheConfig cc = rows_config(kv::RowFormat::f32, 1, 4);
  kv::PagedKVCache cache(cc);
  const kv::SeqId s = cache.create();
  std::vector<float> k(16, 0.1f), rows(4, 1.0f);
  cache.append(s, k, k, 1, rows);
  const kv::PageTableStorage table = cache.page_table(std::span<const kv::SeqId>(&s, 1));
  const std::vector<float> qh(2 * 8, 0.5f), q(4, 1.0f);
  select::SelectArgs sa;
  sa.q = View3<const float>::contiguous(qh.data(), 1, 2, 8);
  sa.cache = cache.view(table);
  sa.summaries = cache.summaries();
  select::SelectorConfig c;
  c.method = select::Method::learned;
  c.budget.tokens = 8;
  select::SelectOutput out;
  expect_error([&] { select::run_selector(sa, c, out); }, ErrorCode::invalid_argument, "learned_keys");
  sa.learned_keys = cache.key_rows();
  expect_error([&] { select::run_selector(sa, c, out); }, ErrorCode::shape_mismatch, "learned_q");
  sa.learned_q = View3<const float>::contiguous(q.data(), 1, 1, 4);
  select::run_selector(sa, c, out);
  c.budget.kind = select::Budget::Kind::adaptive;
  expect_error([&] { select::run_selector(sa, c, out); }, ErrorCode::invalid_argument, "budget");
  c.budget.kind = select::Budget::Kind::top_p;
  c.budget.min_tokens = 9;
  expect_error([&] { select::run_selector(sa, c, out); }, ErrorCode::invalid_argument, "budget", "exceeds");
  c.budget.kind = select::Budget::Kind::fixed;
  c.budget.min_tokens = 4;
  expect_error([&] { select::run_selector(sa, c, out); }, ErrorCode::invalid_argument, "budget", "top-p");
  EXPECT_EQ(select::parse_method("learned", "--selector"), select::Method::learned);
}

// ---- on the real model ----------------------------------------------------------------------

using model::Session;
using model::SessionOptions;
using model::TokenId;

std::vector<TokenId> long_text(const model::Model& m) {
  return m.tokenizer().encode(
      "A special magic number is hidden in this text. The grass is green. The sky is blue. "
      "The special magic number for zebra-lamp is 4829301. Here we go. There and back again. "
      "The sun is yellow and the night is dark. What is the special magic number?",
      m.tokenizer().add_bos_default());
}

select::SelectorConfig learned_config(select::Budget::Kind kind, std::int64_t tokens, double p = 0.9) {
  select::SelectorConfig c;
  c.method = select::Method::learned;
  c.budget.kind = kind;
  c.budget.tokens = tokens;
  c.budget.p = p;
  return c;
}

double max_abs_diff(std::span<const float> a, std::span<const float> b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(static_cast<double>(a[i]) - b[i]));
  return d;
}

// Logits of the last `steps` tokens decoded one by one after prefilling the rest.
std::vector<std::vector<float>> decode_tail(const model::Model& m, const std::vector<TokenId>& toks,
                                            int steps, const SessionOptions& so,
                                            std::vector<model::DecodeStats>* stats = nullptr) {
  Session s(m, so);
  const std::size_t V = static_cast<std::size_t>(m.config().n_vocab);
  std::vector<float> logits(V);
  s.prefill(std::span(toks).first(toks.size() - static_cast<std::size_t>(steps)), logits);
  std::vector<std::vector<float>> out;
  for (std::size_t i = toks.size() - static_cast<std::size_t>(steps); i < toks.size(); ++i) {
    out.emplace_back(V);
    s.decode(toks[i], out.back());
    if (stats) stats->push_back(s.last_decode_stats());
  }
  return out;
}

TEST(LearnedDecode, SmolLM2CoveringEveryPageIsDenseAndTwoPagesReadLess) {
  REQUIRE_MODEL(m, "smollm2");
  const auto toks = long_text(*m);
  SessionOptions dense;
  dense.max_tokens = 128;
  dense.page_size = 4;
  dense.kv_dtype = DType::f32;
  const auto a = decode_tail(*m, toks, 4, dense);
  const model::ModelConfig& c = m->config();
  const std::vector<std::pair<learn::Selector, kv::RowFormat>> cases{
      {learn::mean_score_selector(c, 1), kv::RowFormat::f32},
      {learn::mean_score_selector(c, c.n_head_kv), kv::RowFormat::bf16},
      {learn::random_selector(c, learn::Input::hidden, 1, 32, true, 9), kv::RowFormat::f32},
      {learn::random_selector(c, learn::Input::hidden, c.n_head_kv, 16, false, 4), kv::RowFormat::bf16}};
  for (const auto& [sel, f] : cases) {
    {
      SCOPED_TRACE(testing::Message() << "groups " << sel.layers[0].groups << " d_s " << sel.layers[0].dim
                                      << " format " << to_string(f));
      SessionOptions so = dense;
      so.learned_selector = std::make_shared<const learn::Selector>(sel);
      so.learned_key_format = f;
      so.diagnostics = true;
      so.selector = learned_config(select::Budget::Kind::fixed, 128);
      std::vector<model::DecodeStats> all_st, few_st, p1_st;
      const auto all = decode_tail(*m, toks, 4, so, &all_st);
      so.selector = learned_config(select::Budget::Kind::top_p, 0, 1.0);  // p = 1: every page
      const auto p1 = decode_tail(*m, toks, 4, so, &p1_st);
      so.selector = learned_config(select::Budget::Kind::fixed, 8);  // sink + last page
      const auto few = decode_tail(*m, toks, 4, so, &few_st);
      double moved = 0;
      for (std::size_t i = 0; i < a.size(); ++i) {
        // Sparse decode over every page sums like the dense kernel up to f32 order.
        EXPECT_LE(max_abs_diff(a[i], all[i]), 1e-3) << "step " << i;
        EXPECT_LE(max_abs_diff(a[i], p1[i]), 1e-3) << "step " << i;
        moved = std::max(moved, max_abs_diff(a[i], few[i]));
        EXPECT_EQ(all_st[i].kv_tokens_read, all_st[i].kv_tokens_total);
        EXPECT_EQ(p1_st[i].kv_tokens_read, p1_st[i].kv_tokens_total);
        EXPECT_LT(few_st[i].kv_tokens_read, 0.4 * few_st[i].kv_tokens_total);
        EXPECT_EQ(all_st[i].delta_bound_sum, 0.0);  // nothing dropped, certified
        EXPECT_EQ(all_st[i].heads, static_cast<double>(c.n_layer * c.n_head));
        EXPECT_GT(few_st[i].delta_bound_sum, 0.0);
      }
      EXPECT_GT(moved, 0.05);
    }
  }
}

// The mean-score selector ranks pages like the mean-attention oracle of the same scores: at
// every layer the chosen pages are the kept ones plus the top pages by the f64 softmax mass of
// mean_h scale q_h·k_t (computed here from the captured q and k), up to near-ties.
TEST(LearnedDecode, SmolLM2MeanScoreSelectorPicksTheMeanScoreOraclesPages) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ModelConfig& c = m->config();
  const auto toks = long_text(*m);
  const int P = 4, Hq = c.n_head, Hkv = c.n_head_kv, D = c.head_dim, gsize = Hq / Hkv;
  for (const int groups : {1, Hkv}) {
    SCOPED_TRACE(testing::Message() << "groups " << groups);
    SessionOptions so;
    so.max_tokens = 128;
    so.page_size = P;
    so.kv_dtype = DType::f32;  // the captured keys are the stored ones
    so.learned_selector = std::make_shared<const learn::Selector>(learn::mean_score_selector(c, groups));
    so.selector = learned_config(select::Budget::Kind::fixed, 5 * P);
    std::map<int, std::vector<float>> keys, q_last;  // per layer: every k row; the step's q
    so.capture = [&](const model::LayerCapture& cap) {
      auto& k = keys[cap.layer];
      k.insert(k.end(), cap.k.begin(), cap.k.end());
      q_last[cap.layer].assign(cap.q.begin(), cap.q.end());
    };
    std::map<int, SelectionStorage> chosen;
    so.on_selection = [&](int layer, const SelectionView& sv) {
      chosen[layer].assign(sv);
    };
    Session s(*m, so);
    std::vector<float> logits(static_cast<std::size_t>(c.n_vocab));
    s.prefill(std::span(toks).first(toks.size() - 1), logits);
    s.decode(toks.back(), logits);
    ASSERT_EQ(static_cast<int>(chosen.size()), c.n_layer);
    const std::int64_t L = static_cast<std::int64_t>(toks.size());
    const int pages = static_cast<int>((L + P - 1) / P);
    int near_ties = 0;
    for (int layer = 0; layer < c.n_layer; ++layer) {
      const auto& k = keys[layer];
      const auto& q = q_last[layer];
      for (int g = 0; g < groups; ++g) {
        const int h0 = groups == 1 ? 0 : g * gsize, h1 = groups == 1 ? Hq : h0 + gsize;
        std::vector<double> sc(static_cast<std::size_t>(L));
        for (std::int64_t t = 0; t < L; ++t) {
          double acc = 0;
          for (int h = h0; h < h1; ++h) {
            for (int x = 0; x < D; ++x) {
              acc += static_cast<double>(q[static_cast<std::size_t>(h * D + x)]) *
                     k[static_cast<std::size_t>((t * Hkv + h / gsize) * D + x)];
            }
          }
          sc[static_cast<std::size_t>(t)] = c.attn_scale * acc / (h1 - h0);
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double z = 0;
        for (double& v : sc) z += (v = std::exp(v - mx));
        std::vector<double> mass(static_cast<std::size_t>(pages), 0.0);
        for (std::int64_t t = 0; t < L; ++t) mass[static_cast<std::size_t>(t / P)] += sc[static_cast<std::size_t>(t)] / z;
        const SelectionView sv = chosen[layer].view();
        for (int h = (groups == 1 ? 0 : g); h < (groups == 1 ? Hkv : g + 1); ++h) {
          const auto list = sv.list(0, h);
          ASSERT_EQ(static_cast<int>(list.size()), 5);
          std::set<int> in(list.begin(), list.end());
          EXPECT_TRUE(in.count(0) && in.count(pages - 1)) << "layer " << layer;  // sink, last page
          // Every chosen middle page holds at least the mass of every page left out.
          double worst_in = 1, best_out = 0;
          for (int j = 1; j < pages - 1; ++j) {
            (in.count(j) ? worst_in : best_out) =
                in.count(j) ? std::min(worst_in, mass[static_cast<std::size_t>(j)]) : std::max(best_out, mass[static_cast<std::size_t>(j)]);
          }
          EXPECT_GE(worst_in, best_out - 1e-6) << "layer " << layer << " group " << g;
          near_ties += worst_in < best_out ? 1 : 0;
        }
      }
    }
    std::printf("[ learned ] mean-score selector, groups %d: %d layers x kv heads match the oracle's "
                "ranking (%d near-ties within 1e-6)\n", groups, c.n_layer * Hkv, near_ties);
  }
}

TEST(LearnedDecode, SmolLM2UnlistedLayersDecodeDenselyAndMismatchesThrow) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ModelConfig& c = m->config();
  const auto toks = long_text(*m);
  const std::vector<int> only{3};
  SessionOptions so;
  so.max_tokens = 128;
  so.page_size = 4;
  so.learned_selector = std::make_shared<const learn::Selector>(learn::mean_score_selector(c, 1, only));
  so.selector = learned_config(select::Budget::Kind::fixed, 8);
  std::vector<model::DecodeStats> st;
  std::vector<int> layers_selected;
  so.on_selection = [&](int layer, const SelectionView&) { layers_selected.push_back(layer); };
  (void)decode_tail(*m, toks, 1, so, &st);
  EXPECT_EQ(layers_selected, only);
  const double L = static_cast<double>(toks.size());
  EXPECT_EQ(st[0].kv_tokens_total, L * c.n_layer * c.n_head_kv);
  EXPECT_EQ(st[0].kv_tokens_read, L * (c.n_layer - 1) * c.n_head_kv + (4 + (L - 1 - std::floor((L - 1) / 4) * 4 + 1)) * c.n_head_kv);
  // Only the listed layer keeps a key cache.
  Session s(*m, so);
  EXPECT_EQ(s.learned_key_bytes_per_token(), static_cast<double>(c.n_head_kv * c.head_dim * 4));

  // Mismatches: another model's selector, learned without a key cache, a broken selector.
  model::ModelConfig other = c;
  other.n_layer = c.n_layer - 1;
  other.is_local.assign(static_cast<std::size_t>(other.n_layer), 0);
  SessionOptions bad = so;
  bad.learned_selector = std::make_shared<const learn::Selector>(learn::mean_score_selector(other, 1));
  expect_error([&] { Session x(*m, bad); }, ErrorCode::invalid_argument, "selector", "distilled on");
  bad.learned_selector = nullptr;
  expect_error([&] { Session x(*m, bad); }, ErrorCode::invalid_argument, "selector", "learned_selector");
  SessionOptions plain;
  plain.max_tokens = 16;
  Session p(*m, plain);
  expect_error([&] { p.set_selector(learned_config(select::Budget::Kind::fixed, 8)); },
               ErrorCode::invalid_argument, "selector");
  learn::Selector broken = learn::mean_score_selector(c, 1, only);
  broken.layers[0].wq.resize(3);
  bad.learned_selector = std::make_shared<const learn::Selector>(broken);
  expect_error([&] { Session x(*m, bad); }, ErrorCode::invalid_argument, "selector");
}

// Forks of one prefilled root (the key cache shared copy-on-write) decoding in one batch give
// what separate, unforked sessions give: same KV read, logits within the GEMM-vs-mat-vec
// tolerance of DecodeBatch.* (f32 cache), and the pair-batch bits.
TEST(LearnedDecode, SmolLM2ForksAndDecodeBatchEqualSeparateRuns) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ModelConfig& c = m->config();
  const auto toks = long_text(*m);
  const std::size_t V = static_cast<std::size_t>(c.n_vocab);
  SessionOptions so;
  so.max_tokens = 128;
  so.page_size = 4;
  so.kv_dtype = DType::f32;
  so.fork_pages = 64;
  so.diagnostics = true;
  so.decode_activations = model::Activations::f32;
  so.learned_selector = std::make_shared<const learn::Selector>(
      learn::random_selector(c, learn::Input::hidden, 1, 32, true, 21));
  const std::vector<std::optional<select::SelectorConfig>> configs{
      learned_config(select::Budget::Kind::fixed, 12), learned_config(select::Budget::Kind::top_p, 24, 0.5),
      std::nullopt, learned_config(select::Budget::Kind::fixed, 16)};
  const std::size_t prompt = toks.size() - 6;
  std::vector<float> logits(V);
  Session root(*m, so);
  root.prefill(std::span(toks).first(prompt), logits);
  std::vector<Session> forks;
  for (const auto& cfg : configs) {
    forks.push_back(root.fork());
    forks.back().set_selector(cfg);
  }
  forks.push_back(forks[0].fork());  // a fork's fork
  forks.back().set_selector(configs[1]);
  std::vector<Session> separate;
  for (std::size_t i = 0; i < forks.size(); ++i) {
    SessionOptions own = so;
    own.selector = configs[i < configs.size() ? i : 1];
    separate.emplace_back(*m, own);
    separate.back().prefill(std::span(toks).first(prompt), logits);
  }
  std::vector<Session*> ptrs;
  for (Session& s : forks) ptrs.push_back(&s);
  std::vector<float> batch_logits(forks.size() * V), own(V);
  double worst = 0;
  for (int step = 0; step < 3; ++step) {
    std::vector<TokenId> tokens(forks.size(), toks[prompt + static_cast<std::size_t>(step)]);
    model::decode_batch(ptrs, tokens, batch_logits);
    for (std::size_t i = 0; i < forks.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "step " << step << " session " << i);
      separate[i].decode(tokens[i], own);
      const double d = max_abs_diff(std::span<const float>(batch_logits).subspan(i * V, V), own);
      worst = std::max(worst, d);
      EXPECT_LE(d, 2e-3);
      EXPECT_EQ(forks[i].last_decode_stats().kv_tokens_read, separate[i].last_decode_stats().kv_tokens_read);
      EXPECT_NEAR(forks[i].last_decode_stats().delta_bound_sum, separate[i].last_decode_stats().delta_bound_sum,
                  1e-4 * std::max(1.0, separate[i].last_decode_stats().heads));
    }
  }
  EXPECT_LT(forks[0].last_decode_stats().kv_tokens_read, forks[0].last_decode_stats().kv_tokens_total);
  std::printf("[ learned ] forks in one batch vs separate sessions: max |dlogit| %.2e\n", worst);
}

}  // namespace
}  // namespace masskv
