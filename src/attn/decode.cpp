// Decode attention: split-K over fixed chunks of pages (or selected ids), merged in a fixed
// order (docs/design.md §2.6), so results do not depend on the number of threads.
#include "masskv/attn/decode.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attn/entmax_weight.hpp"
#include "attn/microkernels.hpp"
#include "attn/rows.hpp"
#include "attn/validate_args.hpp"
#include "masskv/attn/merge.hpp"

namespace masskv::attn {

std::string_view to_string(Impl impl) {
  switch (impl) {
    case Impl::scalar:
      return "scalar";
    case Impl::simd:
      return "simd";
    case Impl::fast:
      return "fast";
  }
  return "?";
}

namespace {

using detail::Geometry;
using detail::RowSource;

// Chunk c of (b, kv head h) covers units [c * per_chunk, (c + 1) * per_chunk) of the head's
// unit list; its partial result lives in slot first[b * Hkv + h] + c. The chunking depends
// only on the inputs and chunk_pages, never on the thread count (docs/design.md §6).
//
// A work item is chunk c of sequence b for *all* kv heads at once: in HND a page holds every
// head's rows back to back, so walking pages in order and heads inside a page reads the pool
// sequentially (per-head walks stride over the other heads' blocks and lose ~30% bandwidth).
struct Item {
  int b, c;
};

struct Plan {
  int per_chunk = 0;                // units per chunk
  int max_rows = 0;                 // rows of the largest chunk
  std::vector<std::int64_t> first;  // [B * Hkv + 1]: slots of head bh are first[bh]..first[bh+1]
  std::vector<Item> items;
  std::int64_t slots() const { return first.back(); }
};

Plan make_plan(const Geometry& geo, const RowSource& src, int chunk_pages, int page_size) {
  Plan plan;
  // A chunk never holds more rows than the longest sequence (chunk_pages may be huge: one
  // chunk per head); int64 avoids overflow of chunk_pages * page_size.
  std::int64_t longest = 0;
  for (int b = 0; b < geo.batch; ++b) longest = std::max(longest, src.length(b));
  const std::int64_t chunk_rows = std::min(static_cast<std::int64_t>(chunk_pages) * page_size,
                                           std::max<std::int64_t>(longest, 1));
  plan.per_chunk = src.token_units()
                       ? static_cast<int>(chunk_rows)
                       : static_cast<int>(std::min<std::int64_t>(chunk_pages, longest + 1));
  plan.max_rows = static_cast<int>(chunk_rows);
  plan.first.push_back(0);
  for (int b = 0; b < geo.batch; ++b) {
    int most = 0;
    for (int h = 0; h < geo.num_kv_heads; ++h) {
      const int chunks = (src.units(b, h) + plan.per_chunk - 1) / plan.per_chunk;
      most = std::max(most, chunks);
      plan.first.push_back(plan.first.back() + chunks);
    }
    for (int c = 0; c < most; ++c) plan.items.push_back({b, c});
  }
  return plan;
}

int thread_count(Impl impl) { return impl == Impl::fast ? omp_get_max_threads() : 1; }

// Rows are handed to the kernels in blocks of this many, heads interleaved per block.
int block_rows(int page_size) { return std::max(page_size, 16); }

// Per-thread buffers for one item (all kv heads of one chunk).
// Per-thread buffers for one item (all kv heads of one chunk). Kept per thread between calls
// (decode runs once per layer per token: fresh buffers would page-fault on every call); they
// only grow.
struct Scratch {
  int max_rows = 0, g = 0, d = 0;
  std::vector<const void*> k, v;    // [Hkv][max_rows]
  std::vector<int> n;               // [Hkv] rows of the head in this item (0: no chunk)
  std::vector<std::int64_t> slot;   // [Hkv]
  std::vector<float> q, s, w, acc;  // [Hkv][g][d], [Hkv][g][max_rows] x2, [Hkv][g][d]
  std::vector<float> inv_l;         // [Hkv][g]

  static Scratch& get(const Geometry& geo, int rows) {
    thread_local Scratch t;
    t.max_rows = rows;
    t.g = geo.group;
    t.d = geo.head_dim;
    const std::size_t heads = geo.num_kv_heads, qh = geo.num_q_heads;
    t.k.resize(heads * rows);
    t.v.resize(heads * rows);
    t.n.resize(heads);
    t.slot.resize(heads);
    t.q.resize(qh * geo.head_dim);
    t.s.resize(qh * rows);
    t.w.resize(qh * rows);
    t.acc.resize(qh * geo.head_dim);
    t.inv_l.resize(qh);
    return t;
  }
  const void** krows(int h) { return k.data() + static_cast<std::size_t>(h) * max_rows; }
  const void** vrows(int h) { return v.data() + static_cast<std::size_t>(h) * max_rows; }
  float* qh(int h) { return q.data() + static_cast<std::size_t>(h) * g * d; }
  float* sh(int h) { return s.data() + static_cast<std::size_t>(h) * g * max_rows; }
  float* wh(int h) { return w.data() + static_cast<std::size_t>(h) * g * max_rows; }
  float* acch(int h) { return acc.data() + static_cast<std::size_t>(h) * g * d; }
};

// Gathers the rows and the packed [g][d] queries of every kv head that has chunk it.c.
void load_item(const DecodeArgs& args, const Geometry& geo, const RowSource& src, const Plan& plan,
               const Item& it, Scratch& t) {
  for (int h = 0; h < geo.num_kv_heads; ++h) {
    const std::int64_t bh = static_cast<std::int64_t>(it.b) * geo.num_kv_heads + h;
    t.slot[h] = plan.first[bh] + it.c;
    if (t.slot[h] >= plan.first[bh + 1]) {
      t.n[h] = 0;
      continue;
    }
    const int begin = it.c * plan.per_chunk;
    const int end = std::min(src.units(it.b, h), begin + plan.per_chunk);
    t.n[h] = src.gather(it.b, h, begin, end, t.krows(h), t.vrows(h), nullptr);
    for (int j = 0; j < geo.group; ++j) {
      std::memcpy(t.qh(h) + static_cast<std::int64_t>(j) * geo.head_dim,
                  args.q.row(it.b, h * geo.group + j), sizeof(float) * geo.head_dim);
    }
  }
}

// Pages sit anywhere in the pool and the hardware prefetcher stops at 4 KiB boundaries, so
// each kernel call is handed the rows of the next block of the same head to prefetch.
int next_block(int r0, int block, int n) { return std::clamp(n - r0 - block, 0, block); }

// Scores of every head of the item into t.s ([g][max_rows] per kv head), page-major.
void item_scores(const Geometry& geo, int dt, const mk::Kernels& kern, int block, Scratch& t) {
  const int most = *std::max_element(t.n.begin(), t.n.end());
  for (int r0 = 0; r0 < most; r0 += block) {
    for (int h = 0; h < geo.num_kv_heads; ++h) {
      const int m = std::min(block, t.n[h] - r0);
      if (m <= 0) continue;
      kern.scores(dt, t.qh(h), geo.group, geo.head_dim, t.krows(h) + r0, m, geo.scale, t.sh(h) + r0,
                  t.max_rows, t.krows(h) + r0 + block, next_block(r0, block, t.n[h]));
    }
  }
}

// t.acc[h] = sum_r w[h][.][r] v_r over rows [0, rows[h]) of t.vrows(h), page-major.
void item_accumulate(const Geometry& geo, int dt, const mk::Kernels& kern, int block,
                     const std::vector<int>& rows, const float* w, std::int64_t lw, Scratch& t) {
  std::fill(t.acc.begin(), t.acc.end(), 0.0f);
  const int most = *std::max_element(rows.begin(), rows.end());
  for (int r0 = 0; r0 < most; r0 += block) {
    for (int h = 0; h < geo.num_kv_heads; ++h) {
      const int m = std::min(block, rows[h] - r0);
      if (m <= 0) continue;
      kern.accumulate(dt, w + static_cast<std::int64_t>(h) * geo.group * lw + r0, lw, geo.group,
                      geo.head_dim, t.vrows(h) + r0, m, t.acch(h), t.vrows(h) + r0 + block,
                      next_block(r0, block, rows[h]));
    }
  }
}

void write_empty(const DecodeArgs& args, const Geometry& geo, int b, int h) {
  const float fill = args.mapping.is_entmax() ? std::numeric_limits<float>::quiet_NaN()
                                              : -std::numeric_limits<float>::infinity();
  for (int j = 0; j < geo.group; ++j) {
    const int hq = h * geo.group + j;
    std::fill_n(args.out.row(b, hq), geo.head_dim, 0.0f);
    if (!args.lse_or_tau.empty()) args.lse_or_tau[b * geo.num_q_heads + hq] = fill;
  }
}

// The fixed-order merge of every (b, kv head): merge(bh, j, out_row) merges the slots of q head
// j of the group into out_row and returns its lse / tau. Heads without slots get the empty
// result. One loop for both mappings.
template <class Merge>
void merge_heads(const DecodeArgs& args, const Geometry& geo, const Plan& plan, Merge&& merge) {
  const int n_heads = geo.batch * geo.num_kv_heads;
#pragma omp parallel for schedule(static) num_threads(thread_count(args.impl))
  for (int bh = 0; bh < n_heads; ++bh) {
    const int b = bh / geo.num_kv_heads, h = bh % geo.num_kv_heads;
    if (plan.first[bh] == plan.first[bh + 1]) {
      write_empty(args, geo, b, h);
      continue;
    }
    for (int j = 0; j < geo.group; ++j) {
      const int hq = h * geo.group + j;
      const float stat = merge(bh, j, args.out.row(b, hq));
      if (!args.lse_or_tau.empty()) args.lse_or_tau[b * geo.num_q_heads + hq] = stat;
    }
  }
}

float merge_softmax_slots(const float* o_parts, const float* lse_parts, const Plan& plan,
                          std::int64_t bh, int j, int g, int d, float* out) {
  std::vector<SoftmaxPartialView> parts;
  for (std::int64_t i = plan.first[bh]; i < plan.first[bh + 1]; ++i) {
    parts.push_back({o_parts + (i * g + j) * d, lse_parts[i * g + j]});
  }
  return merge_softmax(parts, d, out);
}

// Softmax: each chunk yields (o_c, lse_c) from one pass over its K and V (scores of the chunk,
// its max, exp, then the weighted V sum); partials are merged by §2.6 in chunk order.
void decode_softmax(const DecodeArgs& args, const Geometry& geo, const RowSource& src,
                    const Plan& plan, const mk::Kernels& kern) {
  const int g = geo.group, d = geo.head_dim;
  const int dt = static_cast<int>(args.cache.dtype);
  const int block = block_rows(args.cache.page_size);
  const std::int64_t n_items = static_cast<std::int64_t>(plan.items.size());
  // Partials of every slot; kept on the calling thread between calls (see Scratch).
  thread_local std::vector<float> o_part, lse_part;
  o_part.resize(static_cast<std::size_t>(plan.slots()) * g * d);
  lse_part.resize(static_cast<std::size_t>(plan.slots()) * g);
  float* const o_parts = o_part.data();
  float* const lse_parts = lse_part.data();

#pragma omp parallel num_threads(thread_count(args.impl))
  {
    Scratch& t = Scratch::get(geo, plan.max_rows);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) {
      load_item(args, geo, src, plan, plan.items[i], t);
      item_scores(geo, dt, kern, block, t);
      std::vector<float>& inv_l = t.inv_l;
      for (int h = 0; h < geo.num_kv_heads; ++h) {
        for (int j = 0; j < g && t.n[h] > 0; ++j) {
          // exp in place: the scores become the chunk's unnormalised weights.
          float* w = t.sh(h) + static_cast<std::int64_t>(j) * t.max_rows;
          const float m = *std::max_element(w, w + t.n[h]);
          const float l = kern.exp_sum(w, t.n[h], m);
          lse_parts[t.slot[h] * g + j] = m + std::log(l);
          inv_l[h * g + j] = 1.0f / l;
        }
      }
      item_accumulate(geo, dt, kern, block, t.n, t.s.data(), t.max_rows, t);
      for (int h = 0; h < geo.num_kv_heads; ++h) {
        if (t.n[h] == 0) continue;
        float* o = o_parts + t.slot[h] * g * d;
        const float* a = t.acch(h);
        for (int j = 0; j < g; ++j) {
          for (int c = 0; c < d; ++c) o[j * d + c] = a[j * d + c] * inv_l[h * g + j];
        }
      }
    }
  }

  merge_heads(args, geo, plan, [&](std::int64_t slot, int j, float* out) {
    return merge_softmax_slots(o_parts, lse_parts, plan, slot, j, g, d, out);
  });
}

// Entmax: the two-step exact scheme of §2.6. Pass 1 scores every chunk and solves its local
// threshold; the union of local candidates {z > tau_c} holds the global support, so the exact
// tau per q head is solved on it. Pass 2 reads V only at rows in some head's support.
void decode_entmax(const DecodeArgs& args, const Geometry& geo, const RowSource& src,
                   const Plan& plan, const mk::Kernels& kern) {
  const int g = geo.group, d = geo.head_dim;
  const int dt = static_cast<int>(args.cache.dtype);
  const int block = block_rows(args.cache.page_size);
  const double alpha = args.mapping.alpha;
  const std::int64_t n_items = static_cast<std::int64_t>(plan.items.size());
  const std::int64_t n_slots = plan.slots();
  const int nt = thread_count(args.impl);
  const int n_heads = geo.batch * geo.num_kv_heads;

  // Scores of slot i live at scores[s_off[i] ..] as [g][rows[i]].
  std::vector<std::int64_t> s_off(n_slots + 1, 0);
  std::vector<int> rows(n_slots);
  for (int bh = 0; bh < n_heads; ++bh) {
    const int b = bh / geo.num_kv_heads, h = bh % geo.num_kv_heads;
    const int units = src.units(b, h);
    for (std::int64_t i = plan.first[bh]; i < plan.first[bh + 1]; ++i) {
      const int begin = static_cast<int>(i - plan.first[bh]) * plan.per_chunk;
      rows[i] = src.count(b, h, begin, std::min(units, begin + plan.per_chunk));
      s_off[i + 1] = s_off[i] + static_cast<std::int64_t>(g) * rows[i];
    }
  }
  std::vector<float> scores(static_cast<std::size_t>(s_off[n_slots]));
  // Local candidates of slot i, q head j: cand[i * g + j] (merge.hpp, step 1 of §2.6).
  std::vector<std::vector<double>> cand(static_cast<std::size_t>(n_slots) * g);

#pragma omp parallel num_threads(nt)
  {
    Scratch& t = Scratch::get(geo, plan.max_rows);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) {
      load_item(args, geo, src, plan, plan.items[i], t);
      item_scores(geo, dt, kern, block, t);
      for (int h = 0; h < geo.num_kv_heads; ++h) {
        const int n = t.n[h];
        if (n == 0) continue;
        float* s = scores.data() + s_off[t.slot[h]];
        for (int j = 0; j < g; ++j) {
          const float* sj = t.sh(h) + static_cast<std::int64_t>(j) * t.max_rows;
          std::copy(sj, sj + n, s + static_cast<std::int64_t>(j) * n);
          append_local_candidates(std::span<const float>(sj, n), alpha, cand[t.slot[h] * g + j]);
        }
      }
    }
  }

  // Exact global tau per (b, q head), on the union of local candidates; [B][Hkv][g] is
  // [B][Hq] (hq = h * g + j).
  std::vector<double> tau(static_cast<std::size_t>(n_heads) * g);
  const auto union_of = [&](int bh, int j, std::vector<double>& all) {
    all.clear();
    for (std::int64_t i = plan.first[bh]; i < plan.first[bh + 1]; ++i) {
      all.insert(all.end(), cand[i * g + j].begin(), cand[i * g + j].end());
    }
  };
  if (args.entmax_exchange != nullptr) {
    std::vector<std::vector<double>> per_head(tau.size());
    for (int bh = 0; bh < n_heads; ++bh) {
      for (int j = 0; j < g; ++j) union_of(bh, j, per_head[static_cast<std::size_t>(bh) * g + j]);
    }
    args.entmax_exchange->solve_tau(per_head, tau);
  } else {
#pragma omp parallel num_threads(nt)
    {
      std::vector<double> all;
#pragma omp for schedule(dynamic, 1)
      for (int bh = 0; bh < n_heads; ++bh) {
        for (int j = 0; j < g; ++j) {
          union_of(bh, j, all);
          tau[static_cast<std::size_t>(bh) * g + j] =
              all.empty() ? std::numeric_limits<double>::quiet_NaN()
                          : entmax_threshold(std::span<const double>(all), alpha).tau;
        }
      }
    }
  }

  std::vector<float> o_sum(static_cast<std::size_t>(n_slots) * g * d);
  std::vector<double> p_sum(static_cast<std::size_t>(n_slots) * g);
#pragma omp parallel num_threads(nt)
  {
    Scratch& t = Scratch::get(geo, plan.max_rows);
    std::vector<int> kept(geo.num_kv_heads);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) {
      load_item(args, geo, src, plan, plan.items[i], t);
      for (int h = 0; h < geo.num_kv_heads; ++h) {
        const int n = t.n[h];
        kept[h] = 0;
        if (n == 0) continue;
        const float* s = scores.data() + s_off[t.slot[h]];
        const double* tau_h =
            tau.data() + (static_cast<std::size_t>(plan.items[i].b) * geo.num_kv_heads + h) * g;
        float* w = t.wh(h);
        const void** v = t.vrows(h);
        // Keep rows where some head of the group has p > 0; V is read only there.
        int m = 0;
        for (int r = 0; r < n; ++r) {
          bool any = false;
          for (int j = 0; j < g; ++j) {
            const double p = detail::entmax_weight((alpha - 1.0) * s[j * n + r] - tau_h[j], alpha);
            w[static_cast<std::size_t>(j) * t.max_rows + m] = static_cast<float>(p);
            any = any || p > 0;
          }
          if (any) v[m++] = v[r];
        }
        kept[h] = m;
        double* ps = p_sum.data() + t.slot[h] * g;
        for (int j = 0; j < g; ++j) {
          double sum = 0;
          for (int r = 0; r < m; ++r) sum += w[static_cast<std::size_t>(j) * t.max_rows + r];
          ps[j] = sum;
        }
      }
      item_accumulate(geo, dt, kern, block, kept, t.w.data(), t.max_rows, t);
      for (int h = 0; h < geo.num_kv_heads; ++h) {
        if (t.n[h] == 0) continue;
        std::copy(t.acch(h), t.acch(h) + static_cast<std::int64_t>(g) * d,
                  o_sum.data() + t.slot[h] * g * d);
      }
    }
  }

  const std::span<double> p_out =
      args.entmax_exchange ? args.entmax_exchange->p_sum : std::span<double>();
  std::fill(p_out.begin(), p_out.end(), 0.0);
  merge_heads(args, geo, plan, [&](std::int64_t bh, int j, float* out) {
    std::vector<EntmaxPartialView> parts;
    double total = 0;
    for (std::int64_t i = plan.first[bh]; i < plan.first[bh + 1]; ++i) {
      parts.push_back({o_sum.data() + (i * g + j) * d, p_sum[i * g + j]});
      total += p_sum[i * g + j];
    }
    merge_entmax(parts, d, out);
    if (!p_out.empty()) p_out[static_cast<std::size_t>(bh) * g + j] = total;
    return static_cast<float>(tau[static_cast<std::size_t>(bh) * g + j]);
  });
}

}  // namespace

void decode(const DecodeArgs& args) {
  const Geometry geo = detail::validate(args);
  const RowSource src(args.cache, args.selection);
  const Plan plan = make_plan(geo, src, args.chunk_pages, args.cache.page_size);
  const mk::Kernels& kern = mk::kernels(args.impl != Impl::scalar);
  if (args.mapping.is_entmax()) {
    decode_entmax(args, geo, src, plan, kern);
  } else {
    decode_softmax(args, geo, src, plan, kern);
  }
}

}  // namespace masskv::attn
