// Sparse prefill selection and the prefill attention-mass oracle (prefill_select.hpp).
// The dense probabilities use the attention micro-kernels (f32 scores of a packed query tile
// against the gathered key rows, as attn::prefill scores them), so the oracle costs about one
// dense prefill more; everything after them (masses, choices) is f64.
#include "masskv/select/prefill_select.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "attn/microkernels.hpp"
#include "attn/rows.hpp"
#include "core/gemm.hpp"
#include "masskv/error.hpp"

namespace masskv::select {

namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

constexpr PrefillMethod kMethods[] = {PrefillMethod::dense, PrefillMethod::token,
                                      PrefillMethod::block, PrefillMethod::shared,
                                      PrefillMethod::index, PrefillMethod::learned};

struct Shape {
  int n = 0, hq = 0, hkv = 0, group = 0, d = 0;
  std::int64_t length = 0;
  float scale = 0;
};

Shape check(const PrefillSelectArgs& a) {
  const kv::PagedKVView& c = a.cache;
  require(c.table.batch() == 1, ErrorCode::invalid_argument, "cache",
          "sparse prefill selection takes one sequence, got ", c.table.batch());
  Shape s;
  s.n = a.q.n0;
  s.hq = a.q.n1;
  s.hkv = c.num_kv_heads;
  s.d = c.head_dim;
  s.length = c.table.length(0, c.page_size);
  require(a.q.n2 == s.d, ErrorCode::shape_mismatch, "q", "head_dim ", a.q.n2, ", the cache's ",
          s.d);
  require(s.hkv > 0 && s.hq % s.hkv == 0, ErrorCode::shape_mismatch, "q", s.hq,
          " q heads are not a multiple of ", s.hkv, " kv heads");
  require(s.n > 0 && s.n <= s.length, ErrorCode::shape_mismatch, "q", s.n,
          " queries for a sequence of ", s.length, " tokens");
  s.group = s.hq / s.hkv;
  s.scale = a.scale != 0 ? a.scale : static_cast<float>(1.0 / std::sqrt(double(s.d)));
  return s;
}

// Sinks and the diagonal of a query block, in items of `unit` tokens: the first sink_blocks ×
// k_block tokens and the block's own queries from `first` (a position) on.
void forced_items(const PrefillSelectConfig& c, std::int64_t unit, std::int64_t first,
                  std::int64_t visible_items, std::vector<std::uint8_t>& forced) {
  forced.assign(sz(visible_items), 0);
  const std::int64_t sinks = std::int64_t{c.sink_blocks} * c.k_block;
  for (std::int64_t j = 0; j < visible_items; ++j) {
    const std::int64_t start = j * unit;
    forced[sz(j)] = start < sinks || start + unit > first ? 1 : 0;
  }
}

void key_to_f32(DType dt, const void* src, float* out, int d) {
  for (int x = 0; x < d; ++x) {
    switch (dt) {
      case DType::f32:
        out[x] = static_cast<const float*>(src)[x];
        break;
      case DType::f16:
        out[x] = to_f32(static_cast<const f16*>(src)[x]);
        break;
      case DType::bf16:
        out[x] = to_f32(static_cast<const bf16*>(src)[x]);
        break;
    }
  }
}

// Budget in items of `unit` tokens for `visible` keys: the items that cover it (a partial
// last block counts whole, so budget = visible keeps everything).
std::int64_t budget_items(const PrefillBudget& b, std::int64_t visible, std::int64_t unit) {
  return (b.keys(visible) + unit - 1) / unit;
}

}  // namespace

std::string_view to_string(PrefillMethod m) noexcept {
  switch (m) {
    case PrefillMethod::dense:
      return "dense";
    case PrefillMethod::token:
      return "token";
    case PrefillMethod::block:
      return "block";
    case PrefillMethod::shared:
      return "shared";
    case PrefillMethod::index:
      return "index";
    case PrefillMethod::learned:
      return "learned";
  }
  return "?";
}

PrefillMethod parse_prefill_method(std::string_view name, std::string_view what) {
  for (const PrefillMethod m : kMethods) {
    if (name == to_string(m)) return m;
  }
  fail(ErrorCode::invalid_argument, what, "unknown sparse prefill method '", name,
       "' (dense, token, block, shared, index, learned)");
}

std::int64_t PrefillBudget::keys(std::int64_t visible) const {
  std::int64_t k = tokens;
  if (k <= 0) {
    k = std::max(min_keys, static_cast<std::int64_t>(std::ceil(fraction * double(visible))));
  }
  return std::min(k, visible);
}

void PrefillSelectConfig::validate() const {
  require(q_block > 0, ErrorCode::invalid_argument, "sparse_prefill", "q_block must be > 0, got ",
          q_block);
  require(k_block > 0, ErrorCode::invalid_argument, "sparse_prefill", "k_block must be > 0, got ",
          k_block);
  require(sink_blocks >= 0, ErrorCode::invalid_argument, "sparse_prefill",
          "sink_blocks must be >= 0, got ", sink_blocks);
  require(budget.tokens > 0 ||
              (std::isfinite(budget.fraction) && budget.fraction > 0 && budget.fraction <= 1),
          ErrorCode::invalid_argument, "sparse_prefill",
          "the budget needs a fraction in (0, 1] or a positive token count, got fraction ",
          budget.fraction, " and ", budget.tokens, " tokens");
  require(budget.min_keys >= 0, ErrorCode::invalid_argument, "sparse_prefill",
          "min_keys must be >= 0, got ", budget.min_keys);
  require(head_collapsed || method == PrefillMethod::token || method == PrefillMethod::block ||
              method == PrefillMethod::dense,
          ErrorCode::invalid_argument, "sparse_prefill",
          "per-group supports are the token and block oracles' only (a block mask serves all "
          "heads)");
}

void prefill_probabilities(const PrefillSelectArgs& args, std::vector<float>& p) {
  const Shape s = check(args);
  const attn::detail::RowSource src(args.cache, nullptr);
  const attn::mk::Kernels& kern = attn::mk::kernels(true);
  const int dt = static_cast<int>(args.cache.dtype);
  const std::int64_t L = s.length, first = L - s.n;
  p.assign(sz(s.hq) * sz(s.n) * sz(L), 0.0f);
  constexpr int kTile = 16;  // queries per packed tile
  const int tiles = (s.n + kTile - 1) / kTile;
  const int items = tiles * s.hkv;
  const int pages = args.cache.table.num_pages(0);
#pragma omp parallel if (items > 1)
  {
    std::vector<const void*> k(sz(pages) * sz(args.cache.page_size)), v(k.size());
    std::vector<std::int64_t> pos(k.size());
    std::vector<float> q, sc;
#pragma omp for schedule(dynamic, 1)
    for (int item = 0; item < items; ++item) {
      const int h = item % s.hkv, i0 = (item / s.hkv) * kTile;
      const int tq = std::min(kTile, s.n - i0);
      const std::int64_t last = first + i0 + tq - 1;
      const int nk = static_cast<int>(last + 1);  // keys in position order
      src.gather(0, h, 0, pages, k.data(), v.data(), pos.data());
      const int rows = tq * s.group;
      q.resize(sz(rows) * sz(s.d));
      for (int i = 0; i < tq; ++i) {
        for (int j = 0; j < s.group; ++j) {
          std::memcpy(q.data() + (sz(i) * sz(s.group) + sz(j)) * sz(s.d),
                      args.q.row(i0 + i, h * s.group + j), sizeof(float) * sz(s.d));
        }
      }
      sc.resize(sz(rows) * sz(nk));
      kern.scores(dt, q.data(), rows, s.d, k.data(), nk, s.scale, sc.data(), nk, nullptr, 0);
      for (int i = 0; i < tq; ++i) {
        const int visible = static_cast<int>(first + i0 + i + 1);
        for (int j = 0; j < s.group; ++j) {
          float* row = sc.data() + (sz(i) * sz(s.group) + sz(j)) * sz(nk);
          const float m = *std::max_element(row, row + visible);
          const float sum = kern.exp_sum(row, visible, m);
          const float inv = 1.0f / sum;
          float* out = p.data() + (sz(h * s.group + j) * sz(s.n) + sz(i0 + i)) * sz(L);
          for (int r = 0; r < visible; ++r) out[r] = row[r] * inv;
        }
      }
    }
  }
}

void prefill_token_mass(std::span<const float> p, int num_q_heads, int num_kv_heads, int n,
                        std::int64_t length, bool head_collapsed, std::vector<double>& mass) {
  require(num_kv_heads > 0 && num_q_heads % num_kv_heads == 0 &&
              p.size() == sz(num_q_heads) * sz(n) * sz(length),
          ErrorCode::shape_mismatch, "p", "has ", p.size(), " values for ", num_q_heads,
          " heads x ", n, " queries x ", length, " keys");
  const int groups = head_collapsed ? 1 : num_kv_heads;
  const int per = num_q_heads / groups;  // heads averaged into one mass
  const std::size_t row = sz(n) * sz(length);
  mass.assign(sz(groups) * row, 0.0);
  for (int g = 0; g < groups; ++g) {
    double* m = mass.data() + sz(g) * row;
    for (int h = g * per; h < (g + 1) * per; ++h) {
      const float* ph = p.data() + sz(h) * row;
      for (std::size_t x = 0; x < row; ++x) m[x] += ph[x];
    }
    for (std::size_t x = 0; x < row; ++x) m[x] /= per;
  }
}

void choose_items(std::span<const double> score, std::span<const std::uint8_t> forced,
                  std::int64_t visible, std::int64_t budget, std::vector<std::uint8_t>& keep) {
  keep.assign(score.size(), 0);
  std::int64_t kept = 0;
  std::vector<std::int32_t> rest;
  for (std::int64_t j = 0; j < visible; ++j) {
    if (forced[sz(j)] != 0) {
      keep[sz(j)] = 1;
      ++kept;
    } else {
      rest.push_back(static_cast<std::int32_t>(j));
    }
  }
  const std::int64_t take = std::clamp<std::int64_t>(budget - kept, 0, std::ssize(rest));
  const auto better = [&](std::int32_t a, std::int32_t b) {
    return score[sz(a)] > score[sz(b)] || (score[sz(a)] == score[sz(b)] && a < b);
  };
  std::partial_sort(rest.begin(), rest.begin() + take, rest.end(), better);
  for (std::int64_t x = 0; x < take; ++x) keep[sz(rest[sz(x)])] = 1;
}

void per_query_support(std::span<const double> mass, int groups, int n, std::int64_t length,
                       const PrefillSelectConfig& config, std::vector<std::uint8_t>& keep) {
  config.validate();
  require(mass.size() == sz(groups) * sz(n) * sz(length), ErrorCode::shape_mismatch, "mass", "has ",
          mass.size(), " values for ", groups, " x ", n, " x ", length);
  const bool tokens = config.method == PrefillMethod::token;
  const std::int64_t unit = tokens ? 1 : config.k_block;
  const std::int64_t first = length - n;
  const std::int64_t blocks = (length + unit - 1) / unit;
  keep.assign(mass.size(), 0);
  const int rows = groups * n;
#pragma omp parallel if (double(rows) * double(length) > 1e5)
  {
    std::vector<double> score;
    std::vector<std::uint8_t> forced, chosen;
#pragma omp for schedule(dynamic, 4)
    for (int r = 0; r < rows; ++r) {
      const int i = r % n;
      const std::int64_t pos = first + i;
      const std::int64_t visible = pos + 1, items = (visible + unit - 1) / unit;
      const double* m = mass.data() + sz(r) * sz(length);
      score.assign(sz(blocks), 0.0);
      for (std::int64_t j = 0; j < visible; ++j) score[sz(j / unit)] += m[j];
      const std::int64_t qb_first = first + (i / config.q_block) * config.q_block;
      forced_items(config, unit, qb_first, items, forced);
      choose_items(score, forced, items, budget_items(config.budget, visible, unit), chosen);
      std::uint8_t* out = keep.data() + sz(r) * sz(length);
      for (std::int64_t j = 0; j < visible; ++j) out[j] = chosen[sz(j / unit)];
    }
  }
}

std::int64_t BlockMaskStorage::keys_attended(int n, std::int64_t length) const {
  const std::int64_t first = length - n;
  std::int64_t total = 0;
  for (int i = 0; i < n; ++i) {
    const std::uint8_t* row = mask.data() + sz(i / q_block) * sz(cols);
    const std::int64_t pos = first + i;
    for (std::int64_t c = 0; c < cols && c * k_block <= pos; ++c) {
      if (row[c] != 0) total += std::min<std::int64_t>(k_block, pos + 1 - c * k_block);
    }
  }
  return total;
}

namespace {

// Rows of a BlockMask from per-query-block key-block scores: sinks, diagonal, then the best.
void fill_mask(std::span<const double> scores, int n, std::int64_t length,
               const PrefillSelectConfig& c, BlockMaskStorage& out) {
  out.q_block = c.q_block;
  out.k_block = c.k_block;
  out.rows = (n + c.q_block - 1) / c.q_block;
  out.cols = (length + c.k_block - 1) / c.k_block;
  out.mask.assign(sz(out.rows) * sz(out.cols), 0);
  const std::int64_t first = length - n;
  std::vector<std::uint8_t> forced, chosen;
  for (std::int64_t r = 0; r < out.rows; ++r) {
    const std::int64_t qb_first = first + r * c.q_block;
    const std::int64_t last = std::min<std::int64_t>(first + n, qb_first + c.q_block) - 1;
    const std::int64_t visible = last + 1, items = (visible + c.k_block - 1) / c.k_block;
    forced_items(c, c.k_block, qb_first, items, forced);
    choose_items(scores.subspan(sz(r) * sz(out.cols), sz(out.cols)), forced, items,
                 budget_items(c.budget, visible, c.k_block), chosen);
    std::copy(chosen.begin(), chosen.end(), out.mask.begin() + r * out.cols);
  }
}

}  // namespace

void shared_block_mask(std::span<const double> mass, int n, std::int64_t length,
                       const PrefillSelectConfig& config, BlockMaskStorage& out) {
  config.validate();
  require(mass.size() == sz(n) * sz(length), ErrorCode::shape_mismatch, "mass", "has ", mass.size(),
          " values for ", n, " x ", length, " (head-collapsed)");
  const std::int64_t rows = (n + config.q_block - 1) / config.q_block;
  const std::int64_t cols = (length + config.k_block - 1) / config.k_block;
  std::vector<double> scores(sz(rows) * sz(cols), 0.0);
  for (int i = 0; i < n; ++i) {
    double* s = scores.data() + sz(i / config.q_block) * sz(cols);
    const double* m = mass.data() + sz(i) * sz(length);
    for (std::int64_t j = 0; j < length; ++j) s[j / config.k_block] += m[j];
  }
  fill_mask(scores, n, length, config, out);
}

void index_block_mask(const PrefillSelectArgs& args, const PrefillSelectConfig& config,
                      BlockMaskStorage& out, KeyBlockSums* sums) {
  config.validate();
  const Shape s = check(args);
  const std::int64_t L = s.length;
  const std::int64_t rows = (s.n + config.q_block - 1) / config.q_block;
  const std::int64_t cols = (L + config.k_block - 1) / config.k_block;
  KeyBlockSums local;
  KeyBlockSums& ks = sums != nullptr ? *sums : local;
  if (ks.k_block != config.k_block || ks.tokens > L) ks = {config.k_block, 0, 0, {}};
  if (ks.blocks < cols) {  // grow [h][blocks][d], keeping the sums
    std::vector<double> grown(sz(s.hkv) * sz(cols) * sz(s.d), 0.0);
    for (int h = 0; h < s.hkv; ++h) {
      std::copy_n(ks.sums.begin() + sz(h) * sz(ks.blocks) * sz(s.d), sz(ks.blocks) * sz(s.d),
                  grown.begin() + sz(h) * sz(cols) * sz(s.d));
    }
    ks.sums = std::move(grown);
    ks.blocks = cols;
  }
  const attn::detail::RowSource src(args.cache, nullptr);
  const int P = args.cache.page_size;
  const int p0 = static_cast<int>(ks.tokens / P), pages = args.cache.table.num_pages(0);
  std::vector<const void*> k(sz(pages - p0) * sz(P)), v(k.size());
  std::vector<std::int64_t> pos(k.size());
  std::vector<float> row(sz(s.d));
  for (int h = 0; h < s.hkv; ++h) {
    const int nk = src.gather(0, h, p0, pages, k.data(), v.data(), pos.data());
    for (int r = 0; r < nk; ++r) {
      if (pos[sz(r)] < ks.tokens) continue;  // summed by an earlier step
      key_to_f32(args.cache.dtype, k[sz(r)], row.data(), s.d);
      double* m =
          ks.sums.data() + (sz(h) * sz(ks.blocks) + sz(pos[sz(r)] / config.k_block)) * sz(s.d);
      for (int x = 0; x < s.d; ++x) m[x] += row[sz(x)];
    }
  }
  ks.tokens = L;
  // Mean k of every key block per kv head: kmean[(h * cols + c) * d + x].
  std::vector<double> kmean(sz(s.hkv) * sz(cols) * sz(s.d));
  for (int h = 0; h < s.hkv; ++h) {
    for (std::int64_t c = 0; c < cols; ++c) {
      const double cnt = double(std::min<std::int64_t>(config.k_block, L - c * config.k_block));
      const double* in = ks.sums.data() + (sz(h) * sz(ks.blocks) + sz(c)) * sz(s.d);
      double* m = kmean.data() + (sz(h) * sz(cols) + sz(c)) * sz(s.d);
      for (int x = 0; x < s.d; ++x) m[x] = in[x] / cnt;
    }
  }
  // Score of key block c for query block r: the mean over the q heads of q̄_h · k̄_{c, kv(h)}
  // (q̄_h: the block's mean q of head h; by linearity the mean of the pooled scores).
  std::vector<double> scores(sz(rows) * sz(cols), 0.0), qmean(sz(s.d));
  for (std::int64_t r = 0; r < rows; ++r) {
    const int i0 = static_cast<int>(r * config.q_block);
    const int i1 = std::min(s.n, i0 + config.q_block);
    for (int h = 0; h < s.hq; ++h) {
      std::fill(qmean.begin(), qmean.end(), 0.0);
      for (int i = i0; i < i1; ++i) {
        const float* q = args.q.row(i, h);
        for (int x = 0; x < s.d; ++x) qmean[sz(x)] += q[x];
      }
      const int kvh = h / s.group;
      for (std::int64_t c = 0; c < cols; ++c) {
        const double* m = kmean.data() + (sz(kvh) * sz(cols) + sz(c)) * sz(s.d);
        double dot = 0;
        for (int x = 0; x < s.d; ++x) dot += qmean[sz(x)] * m[x];
        scores[sz(r) * sz(cols) + sz(c)] += dot / (i1 - i0) / s.hq;
      }
    }
  }
  fill_mask(scores, s.n, L, config, out);
}

void learned_block_mask(std::span<const float> q_sel, const kv::KeyRowsView& keys,
                        const kv::PageTable& table, int n, const PrefillSelectConfig& config,
                        BlockMaskStorage& out) {
  config.validate();
  require(table.batch() == 1, ErrorCode::invalid_argument, "table",
          "sparse prefill selection takes one sequence, got ", table.batch());
  const int P = keys.page_size, G = keys.groups, D = keys.dim;
  const std::int64_t L = table.length(0, P);
  require(!keys.empty() && n > 0 && n <= L, ErrorCode::shape_mismatch, "q_sel", n,
          " queries for a sequence of ", L, " tokens with ", keys.empty() ? "no" : "its",
          " selector key rows");
  require(q_sel.size() == sz(n) * sz(G) * sz(D), ErrorCode::shape_mismatch, "q_sel", "has ",
          q_sel.size(), " values, not [", n, "][", G, "][", D, "]");
  const std::int64_t rows = (n + config.q_block - 1) / config.q_block;
  const std::int64_t cols = (L + config.k_block - 1) / config.k_block;
  const std::int64_t first = L - n;
  // The selector keys as f32 rows per group, kf[(g * L + t) * D], decoded once: every query
  // block multiplies against them with the f32 GEMM the model's prefill uses (core/gemm.hpp;
  // OpenMP over key rows), one query block at a time, so the scores keep one fixed order
  // whatever the thread count.
  std::vector<float> kf(sz(G) * sz(L) * sz(D));
#pragma omp parallel for schedule(static)
  for (int j = 0; j < table.num_pages(0); ++j) {
    const int len = table.page_len(0, j, P);
    for (int g = 0; g < G; ++g) {
      for (int t = 0; t < len; ++t) {
        kv::decode_row(keys.format, keys.row(table.page(0, j), g, t), D,
                       kf.data() + (sz(g) * sz(L) + sz(std::int64_t{j} * P + t)) * sz(D));
      }
    }
  }
  std::vector<double> scores(sz(rows) * sz(cols), 0.0);
  std::vector<float> qb(sz(config.q_block) * sz(D)), y(sz(config.q_block) * sz(L));
  // Per query of the block, its softmax mass per key block (already / G): the queries run in
  // parallel, each into its own row, and the rows are added in query order (fixed sums).
  std::vector<double> qmass(sz(config.q_block) * sz(cols));
  const int kb = config.k_block;
  const attn::mk::Kernels& kern = attn::mk::kernels(true);
  for (std::int64_t r = 0; r < rows; ++r) {
    double* row = scores.data() + sz(r) * sz(cols);
    const int i0 = static_cast<int>(r * config.q_block);
    const int i1 = static_cast<int>(std::min<std::int64_t>(n, (r + 1) * config.q_block));
    const std::int64_t keys_last = first + i1;  // keys the block's last query sees
    for (int g = 0; g < G; ++g) {
      for (int i = i0; i < i1; ++i) {
        std::copy_n(q_sel.data() + (sz(i) * sz(G) + sz(g)) * sz(D), D,
                    qb.data() + sz(i - i0) * sz(D));
      }
      linalg::matmul_f32(kf.data() + sz(g) * sz(L) * sz(D), sz(keys_last), sz(D), qb.data(),
                         sz(i1 - i0), y.data());
      // Per query: the max (vector kernel), then one pass per key block (exp of the block's
      // scores and their sum): full-length passes and f64 exps were most of the selection's
      // time (docs/prefill.md, "The learned indexer").
#pragma omp parallel for schedule(static) if (i1 - i0 > 1)
      for (int i = i0; i < i1; ++i) {
        const std::int64_t visible = first + i + 1;  // causal: keys 0 .. the query itself
        float* yw = y.data() + sz(i - i0) * sz(keys_last);
        const float mx = kern.max(yw, static_cast<int>(visible));
        double* mass = qmass.data() + sz(i - i0) * sz(cols);
        // exp in f32 (8 lanes), each block's sum in f32 and the sums of blocks in f64: the
        // masses only rank key blocks, and f32 keeps them within ~1e-6 relative.
        double total = 0;
        const std::int64_t nb = (visible + kb - 1) / kb;
        for (std::int64_t c = 0; c < nb; ++c) {
          const std::int64_t t0 = c * kb, m = std::min<std::int64_t>(visible, t0 + kb) - t0;
          mass[c] = kern.exp_sum(yw + t0, static_cast<int>(m), mx);
          total += mass[c];
        }
        const double w = 1.0 / (total * G);
        for (std::int64_t c = 0; c < nb; ++c) mass[c] *= w;
      }
      for (int i = i0; i < i1; ++i) {
        const std::int64_t nb = (first + i + 1 + kb - 1) / kb;
        const double* mass = qmass.data() + sz(i - i0) * sz(cols);
        for (std::int64_t c = 0; c < nb; ++c) row[c] += mass[c];
      }
    }
  }
  fill_mask(scores, n, L, config, out);
}

void support_attention(const PrefillSelectArgs& args, std::span<const float> p,
                       std::span<const std::uint8_t> keep, int groups, View3<float> out) {
  const Shape s = check(args);
  const std::int64_t L = s.length, first = L - s.n;
  require(p.size() == sz(s.hq) * sz(s.n) * sz(L), ErrorCode::shape_mismatch, "p", "has ", p.size(),
          " values");
  require((groups == 1 || groups == s.hkv) && keep.size() == sz(groups) * sz(s.n) * sz(L),
          ErrorCode::shape_mismatch, "keep", "has ", keep.size(), " values for ", groups,
          " group(s)");
  require(out.n0 == s.n && out.n1 == s.hq && out.n2 == s.d, ErrorCode::shape_mismatch, "out",
          "must be [", s.n, "][", s.hq, "][", s.d, "]");
  const attn::detail::RowSource src(args.cache, nullptr);
  const attn::mk::Kernels& kern = attn::mk::kernels(true);
  const int dt = static_cast<int>(args.cache.dtype);
  const int pages = args.cache.table.num_pages(0);
  const int items = s.n * s.hkv;
#pragma omp parallel if (items > 1)
  {
    std::vector<const void*> k(sz(pages) * sz(args.cache.page_size)), v(k.size()), vv;
    std::vector<float> w, acc(sz(s.group) * sz(s.d));
    int gathered = -1;
#pragma omp for schedule(dynamic, 8)
    for (int item = 0; item < items; ++item) {
      const int h = item / s.n, i = item % s.n;
      if (gathered != h) {
        src.gather(0, h, 0, pages, k.data(), v.data(), nullptr);
        gathered = h;
      }
      const std::int64_t visible = first + i + 1;
      const std::uint8_t* kp = keep.data() + (sz(groups == 1 ? 0 : h) * sz(s.n) + sz(i)) * sz(L);
      vv.clear();
      for (std::int64_t j = 0; j < visible; ++j) {
        if (kp[j] != 0) vv.push_back(v[sz(j)]);
      }
      const int m = static_cast<int>(vv.size());
      w.resize(sz(s.group) * sz(std::max(m, 1)));
      std::vector<double> sum(sz(s.group), 0.0);
      for (int j = 0; j < s.group; ++j) {
        const float* ph = p.data() + (sz(h * s.group + j) * sz(s.n) + sz(i)) * sz(L);
        int c = 0;
        for (std::int64_t x = 0; x < visible; ++x) {
          if (kp[x] == 0) continue;
          w[sz(j) * sz(m) + sz(c++)] = ph[x];
          sum[sz(j)] += ph[x];
        }
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (m > 0)
        kern.accumulate(dt, w.data(), m, s.group, s.d, vv.data(), m, acc.data(), nullptr, 0);
      for (int j = 0; j < s.group; ++j) {
        float* o = out.row(i, h * s.group + j);
        const float inv = sum[sz(j)] > 0 ? static_cast<float>(1.0 / sum[sz(j)]) : 0.0f;
        for (int x = 0; x < s.d; ++x) o[x] = acc[sz(j) * sz(s.d) + sz(x)] * inv;
      }
    }
  }
}

}  // namespace masskv::select
