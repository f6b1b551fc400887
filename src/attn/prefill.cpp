// Causal prefill, dense or block-sparse. Work items are (sequence, query tile, kv head); a tile
// packs its queries x the group's q heads as one "head" set for the micro-kernels, so every
// key and value row is converted once per tile and group (not once per query head).
// Per tile: scores of all keys any query of the tile may see, masked per query (causal and
// block mask), mapped (softmax or exact entmax per row), then one weighted pass over V that
// skips rows no query of the tile weights (the sparse rows of entmax and of the mask).
// Memory per thread is O(tile * group * keys); the tile shrinks for long sequences.
#include "masskv/attn/prefill.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/entmax_weight.hpp"
#include "attn/microkernels.hpp"
#include "attn/prefill_mask.hpp"
#include "attn/rows.hpp"
#include "attn/validate_args.hpp"

namespace masskv::attn {
namespace {

using detail::Geometry;

struct Item {
  int b, h;
  std::int64_t q0, q1;  // queries [q0, q1) of sequence b
};

// Queries per tile: 32 (each key and value row is converted once per tile and group), fewer
// when the score block tile * group * length would pass ~16 MiB.
std::int64_t tile_queries(const Geometry& geo, std::int64_t length) {
  constexpr std::int64_t kMaxScores = std::int64_t{4} << 20;
  const std::int64_t per_query =
      static_cast<std::int64_t>(geo.group) * std::max<std::int64_t>(length, 1);
  return std::clamp<std::int64_t>(kMaxScores / per_query, 1, 32);
}

// Causal mask of one query row over keys already restricted to its blocks: keys after
// position p become -inf. kpos is ascending (gathered in position order), so the visible keys
// are a prefix. Returns its length.
int causal_mask_row(float* s, const std::int64_t* kpos, int n, std::int64_t p) {
  const int visible = static_cast<int>(std::upper_bound(kpos, kpos + n, p) - kpos);
  std::fill(s + visible, s + n, -std::numeric_limits<float>::infinity());
  return visible;
}

struct Scratch {
  std::vector<const void*> k, v, kk, vv;
  std::vector<std::int64_t> pos, kpos;
  std::vector<float> q, s, acc, row;
  std::vector<double> p_sum;
  std::vector<std::uint8_t> used, blocks;
  std::vector<int> keep;
};

// The keys some query of tile `it` may see (causal up to its last query at position `last`,
// and in a block the mask selects for one of its query blocks) into t.kk / t.vv / t.kpos, in
// position order. Only the pages that hold selected blocks are gathered, so a sparse tile's
// cost follows its selection, not the sequence length.
void tile_keys(const PrefillArgs& args, const detail::RowSource& src,
               const detail::PrefillMask& mask, const Item& it, std::int64_t last, Scratch& t) {
  const int P = args.cache.page_size;
  const int pages = static_cast<int>(last / P) + 1;
  t.k.resize(static_cast<std::size_t>(pages) * P);
  t.v.resize(t.k.size());
  t.pos.resize(t.k.size());
  t.kk.clear();
  t.vv.clear();
  t.kpos.clear();
  const auto take = [&](int p0, int p1, const std::uint8_t* blocks, std::int64_t kb) {
    const int got = src.gather(it.b, it.h, p0, p1, t.k.data(), t.v.data(), t.pos.data());
    for (int r = 0; r < got && t.pos[r] <= last; ++r) {
      if (blocks != nullptr && blocks[t.pos[r] / kb] == 0) continue;
      t.kk.push_back(t.k[r]);
      t.vv.push_back(t.v[r]);
      t.kpos.push_back(t.pos[r]);
    }
  };
  if (args.block_mask == nullptr) {
    take(0, pages, nullptr, 1);
    return;
  }
  mask.blocks_of(it.q0, it.q1, t.blocks);
  const std::int64_t kb = mask.k_block();
  const std::int64_t cols =
      std::min<std::int64_t>(static_cast<std::int64_t>(t.blocks.size()), last / kb + 1);
  // Runs of selected blocks -> page ranges; a page shared by two runs is gathered by the
  // first only (its rows of the second run's block are kept there: the block test is per row).
  int next_page = 0;
  for (std::int64_t c = 0; c < cols;) {
    if (t.blocks[static_cast<std::size_t>(c)] == 0) {
      ++c;
      continue;
    }
    std::int64_t e = c;
    while (e < cols && t.blocks[static_cast<std::size_t>(e)] != 0) ++e;
    const int p0 = std::max(next_page, static_cast<int>(c * kb / P));
    const int p1 = std::min(pages, static_cast<int>((e * kb + P - 1) / P));
    if (p0 < p1) take(p0, p1, t.blocks.data(), kb);
    next_page = std::max(next_page, p1);
    c = e;
  }
}

void run_item(const PrefillArgs& args, const Geometry& geo, const detail::RowSource& src,
              const mk::Kernels& kern, const Item& it, Scratch& t) {
  const int g = geo.group, d = geo.head_dim;
  const int dt = static_cast<int>(args.cache.dtype);
  const std::int64_t length = args.cache.table.length(it.b, args.cache.page_size);
  const std::int64_t nq = args.q_indptr[it.b + 1] - args.q_indptr[it.b];
  const detail::PrefillMask mask(args.block_mask, it.b, length, nq);
  const int tq = static_cast<int>(it.q1 - it.q0);
  const int rows_q = tq * g;  // packed query vectors: (query i, head j) -> i * g + j

  const std::int64_t last = mask.position(it.q1 - 1);
  tile_keys(args, src, mask, it, last, t);
  const int n = static_cast<int>(t.kk.size());
  t.keep.resize(static_cast<std::size_t>(n));

  t.q.resize(static_cast<std::size_t>(rows_q) * d);
  for (int i = 0; i < tq; ++i) {
    for (int j = 0; j < g; ++j) {
      std::memcpy(t.q.data() + (static_cast<std::size_t>(i) * g + j) * d,
                  args.q.row(static_cast<int>(args.q_indptr[it.b] + it.q0 + i), it.h * g + j),
                  sizeof(float) * d);
    }
  }
  t.s.resize(static_cast<std::size_t>(rows_q) * std::max(n, 1));
  if (n > 0)
    kern.scores(dt, t.q.data(), rows_q, d, t.kk.data(), n, geo.scale, t.s.data(), n, nullptr, 0);

  // Map each packed row to weights in place; stat = lse or tau. When the tile's queries share
  // one mask row, the gathered keys are exactly that row's blocks, so only causality is left
  // to test per key (no per-(query, key) block lookup).
  const bool one_row = mask.one_row(it.q0, it.q1);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  std::vector<float> stat(rows_q);
  t.p_sum.assign(rows_q, 0.0);
  for (int i = 0; i < tq; ++i) {
    for (int j = 0; j < g; ++j) {
      float* s = t.s.data() + (static_cast<std::size_t>(i) * g + j) * n;
      int visible = 0;
      if (one_row) {
        visible = causal_mask_row(s, t.kpos.data(), n, mask.position(it.q0 + i));
      } else {
        for (int r = 0; r < n; ++r) {
          if (mask.allowed(it.q0 + i, t.kpos[r])) {
            ++visible;
          } else {
            s[r] = kNegInf;
          }
        }
      }
      const int row = i * g + j;
      if (visible == 0) {
        std::fill_n(s, n, 0.0f);
        stat[row] = args.mapping.is_entmax() ? std::numeric_limits<float>::quiet_NaN() : kNegInf;
        continue;
      }
      if (!args.mapping.is_entmax()) {
        const float m = kern.max(s, n);
        const float l = kern.exp_sum(s, n, m);
        t.p_sum[row] = l;
        stat[row] = m + std::log(l);
        continue;
      }
      t.row.clear();
      for (int r = 0; r < n; ++r) {
        if (s[r] != kNegInf) t.row.push_back(s[r]);
      }
      const double alpha = args.mapping.alpha;
      const double tau = entmax_threshold(std::span<const float>(t.row), alpha).tau;
      double sum = 0;
      for (int r = 0; r < n; ++r) {
        const float p =
            s[r] == kNegInf
                ? 0.0f
                : static_cast<float>(detail::entmax_weight((alpha - 1) * s[r] - tau, alpha));
        s[r] = p;
        sum += p;
      }
      t.p_sum[row] = sum;
      stat[row] = static_cast<float>(tau);
    }
  }

  // One weighted pass over V, skipping rows that no packed query weights. Which rows are
  // weighted is found row by row (contiguous); the columns move only when some row is
  // skipped. Softmax on a one-row tile weights every gathered key (the tile's last query
  // sees them all), so there is nothing to find.
  int m = n;
  if (args.mapping.is_entmax() || !one_row) {
    t.used.assign(static_cast<std::size_t>(n), 0);
    for (int row = 0; row < rows_q; ++row) {
      const float* s = t.s.data() + static_cast<std::size_t>(row) * n;
      for (int r = 0; r < n; ++r) t.used[r] |= s[r] != 0 ? 1 : 0;
    }
    m = 0;
    for (int r = 0; r < n; ++r) {
      if (t.used[r] != 0) t.keep[m++] = r;
    }
  }
  if (m < n) {
    for (int row = 0; row < rows_q; ++row) {
      float* s = t.s.data() + static_cast<std::size_t>(row) * n;
      for (int c = 0; c < m; ++c) s[c] = s[t.keep[c]];
    }
    for (int c = 0; c < m; ++c) t.vv[c] = t.vv[t.keep[c]];
  }
  t.acc.assign(static_cast<std::size_t>(rows_q) * d, 0.0f);
  if (m > 0)
    kern.accumulate(dt, t.s.data(), n, rows_q, d, t.vv.data(), m, t.acc.data(), nullptr, 0);

  for (int i = 0; i < tq; ++i) {
    const std::int64_t qrow = args.q_indptr[it.b] + it.q0 + i;
    for (int j = 0; j < g; ++j) {
      const int row = i * g + j, hq = it.h * g + j;
      float* o = args.out.row(static_cast<int>(qrow), hq);
      const double ps = t.p_sum[row];
      const float inv = ps > 0 ? static_cast<float>(1.0 / ps) : 0.0f;
      for (int c = 0; c < d; ++c) o[c] = t.acc[static_cast<std::size_t>(row) * d + c] * inv;
      if (!args.lse_or_tau.empty()) {
        args.lse_or_tau[static_cast<std::size_t>(qrow) * geo.num_q_heads + hq] = stat[row];
      }
    }
  }
}

}  // namespace

void prefill(const PrefillArgs& args) {
  const Geometry geo = detail::validate(args);
  const detail::RowSource src(args.cache, nullptr);
  const mk::Kernels& kern = mk::kernels(args.impl != Impl::scalar);
  std::vector<Item> items;
  for (int b = 0; b < geo.batch; ++b) {
    const std::int64_t nq = args.q_indptr[b + 1] - args.q_indptr[b];
    const std::int64_t tile = tile_queries(geo, args.cache.table.length(b, args.cache.page_size));
    for (std::int64_t q0 = 0; q0 < nq; q0 += tile) {
      for (int h = 0; h < geo.num_kv_heads; ++h)
        items.push_back({b, h, q0, std::min(nq, q0 + tile)});
    }
  }
  const std::int64_t n_items = static_cast<std::int64_t>(items.size());
  const int nt = args.impl == Impl::fast ? omp_get_max_threads() : 1;
#pragma omp parallel num_threads(nt)
  {
    Scratch t;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) run_item(args, geo, src, kern, items[i], t);
  }
}

}  // namespace masskv::attn
