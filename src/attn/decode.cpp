// Decode attention: split-K over fixed chunks of pages (or selected ids), merged in a fixed
// order (DESIGN.md §2.6), so results do not depend on the number of threads.
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

// One chunk of one (sequence, kv head): units [begin, end) of the head's unit list.
struct Item {
  int b, h, begin, end;
};

// The work list: per (b, kv head) its chunks, contiguous, in position order. Depends only on
// the inputs and chunk_pages, never on the thread count.
struct Plan {
  std::vector<Item> items;
  std::vector<std::int64_t> first;  // [B * Hkv + 1]: items of head bh are first[bh]..first[bh+1]
  int max_rows = 0;                 // rows of the largest chunk
};

Plan make_plan(const Geometry& geo, const RowSource& src, int chunk_pages, int page_size) {
  Plan plan;
  const int per_chunk = src.token_units() ? chunk_pages * page_size : chunk_pages;
  plan.max_rows = chunk_pages * page_size;
  plan.first.push_back(0);
  for (int b = 0; b < geo.batch; ++b) {
    for (int h = 0; h < geo.num_kv_heads; ++h) {
      const int units = src.units(b, h);
      for (int u = 0; u < units; u += per_chunk) {
        plan.items.push_back({b, h, u, std::min(units, u + per_chunk)});
      }
      plan.first.push_back(static_cast<std::int64_t>(plan.items.size()));
    }
  }
  return plan;
}

int thread_count(Impl impl) { return impl == Impl::fast ? omp_get_max_threads() : 1; }

// The g query vectors of kv group (b, h), packed [g][d] for the kernels.
void load_q_group(const View3<const float>& q, const Geometry& geo, int b, int h, float* out) {
  for (int j = 0; j < geo.group; ++j) {
    std::memcpy(out + static_cast<std::int64_t>(j) * geo.head_dim, q.row(b, h * geo.group + j),
                sizeof(float) * geo.head_dim);
  }
}

// Per-thread buffers sized for one chunk.
struct Scratch {
  std::vector<const void*> k, v;
  std::vector<float> q, s, w, acc, inv_l;
  Scratch(const Geometry& geo, int max_rows)
      : k(max_rows),
        v(max_rows),
        q(static_cast<std::size_t>(geo.group) * geo.head_dim),
        s(static_cast<std::size_t>(geo.group) * max_rows),
        w(static_cast<std::size_t>(geo.group) * max_rows),
        acc(static_cast<std::size_t>(geo.group) * geo.head_dim),
        inv_l(geo.group) {}
};

void write_empty(const DecodeArgs& args, const Geometry& geo, int b, int h) {
  const float fill = args.mapping.is_entmax() ? std::numeric_limits<float>::quiet_NaN()
                                              : -std::numeric_limits<float>::infinity();
  for (int j = 0; j < geo.group; ++j) {
    const int hq = h * geo.group + j;
    std::fill_n(args.out.row(b, hq), geo.head_dim, 0.0f);
    if (!args.lse_or_tau.empty()) args.lse_or_tau[b * geo.num_q_heads + hq] = fill;
  }
}

// Softmax: each chunk yields (o_c, lse_c) from one pass over its K and V; merged by §2.6.
void decode_softmax(const DecodeArgs& args, const Geometry& geo, const RowSource& src,
                    const Plan& plan, const mk::Kernels& kern) {
  const int g = geo.group, d = geo.head_dim;
  const int dt = static_cast<int>(args.cache.dtype);
  const std::int64_t n_items = static_cast<std::int64_t>(plan.items.size());
  std::vector<float> o_part(static_cast<std::size_t>(n_items) * g * d);
  std::vector<float> lse_part(static_cast<std::size_t>(n_items) * g);

#pragma omp parallel num_threads(thread_count(args.impl))
  {
    Scratch t(geo, plan.max_rows);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) {
      const Item& it = plan.items[i];
      const int n = src.gather(it.b, it.h, it.begin, it.end, t.k.data(), t.v.data(), nullptr);
      load_q_group(args.q, geo, it.b, it.h, t.q.data());
      kern.scores(dt, t.q.data(), g, d, t.k.data(), n, geo.scale, t.s.data(), n);
      for (int j = 0; j < g; ++j) {
        float* s = t.s.data() + static_cast<std::int64_t>(j) * n;
        const float m = *std::max_element(s, s + n);
        const float l = kern.exp_sum(s, n, m);
        lse_part[i * g + j] = m + std::log(l);
        t.inv_l[j] = 1.0f / l;
      }
      std::fill(t.acc.begin(), t.acc.end(), 0.0f);
      kern.accumulate(dt, t.s.data(), n, g, d, t.v.data(), n, t.acc.data());
      float* o = o_part.data() + i * g * d;
      for (int j = 0; j < g; ++j) {
        for (int c = 0; c < d; ++c) o[j * d + c] = t.acc[j * d + c] * t.inv_l[j];
      }
    }
  }

  const int n_heads = geo.batch * geo.num_kv_heads;
#pragma omp parallel for schedule(static) num_threads(thread_count(args.impl))
  for (int bh = 0; bh < n_heads; ++bh) {
    const int b = bh / geo.num_kv_heads, h = bh % geo.num_kv_heads;
    const std::int64_t i0 = plan.first[bh], i1 = plan.first[bh + 1];
    if (i0 == i1) {
      write_empty(args, geo, b, h);
      continue;
    }
    std::vector<SoftmaxPartialView> parts(static_cast<std::size_t>(i1 - i0));
    for (int j = 0; j < g; ++j) {
      for (std::int64_t i = i0; i < i1; ++i) {
        parts[i - i0] = {o_part.data() + (i * g + j) * d, lse_part[i * g + j]};
      }
      const int hq = h * g + j;
      const float lse = merge_softmax(parts, d, args.out.row(b, hq));
      if (!args.lse_or_tau.empty()) args.lse_or_tau[b * geo.num_q_heads + hq] = lse;
    }
  }
}

// Entmax: the two-step exact scheme of §2.6. Pass 1 scores every chunk and solves its local
// threshold; the union of local candidates {z > tau_c} holds the global support, so the exact
// tau per q head is solved on it. Pass 2 reads V only at support rows.
void decode_entmax(const DecodeArgs& args, const Geometry& geo, const RowSource& src,
                   const Plan& plan, const mk::Kernels& kern) {
  const int g = geo.group, d = geo.head_dim;
  const int dt = static_cast<int>(args.cache.dtype);
  const double alpha = args.mapping.alpha;
  const std::int64_t n_items = static_cast<std::int64_t>(plan.items.size());
  const int nt = thread_count(args.impl);

  // Scores of item i live at scores[s_off[i] ..] as [g][rows_i].
  std::vector<std::int64_t> s_off(n_items + 1, 0);
  std::vector<int> rows(n_items);
  for (std::int64_t i = 0; i < n_items; ++i) {
    const Item& it = plan.items[i];
    rows[i] = src.count(it.b, it.h, it.begin, it.end);
    s_off[i + 1] = s_off[i] + static_cast<std::int64_t>(g) * rows[i];
  }
  std::vector<float> scores(static_cast<std::size_t>(s_off[n_items]));
  std::vector<double> tau_local(static_cast<std::size_t>(n_items) * g);

#pragma omp parallel num_threads(nt)
  {
    Scratch t(geo, plan.max_rows);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) {
      const Item& it = plan.items[i];
      const int n = src.gather(it.b, it.h, it.begin, it.end, t.k.data(), t.v.data(), nullptr);
      load_q_group(args.q, geo, it.b, it.h, t.q.data());
      float* s = scores.data() + s_off[i];
      kern.scores(dt, t.q.data(), g, d, t.k.data(), n, geo.scale, s, n);
      for (int j = 0; j < g; ++j) {
        // tau_lo <= tau_c <= tau_global: candidates above tau_lo cover the global support.
        tau_local[i * g + j] =
            entmax_threshold(std::span<const float>(s + static_cast<std::int64_t>(j) * n, n), alpha)
                .tau_lo;
      }
    }
  }

  // Exact global tau per (b, q head), on the union of local candidates.
  const int n_heads = geo.batch * geo.num_kv_heads;
  std::vector<double> tau(static_cast<std::size_t>(n_heads) * g);
#pragma omp parallel num_threads(nt)
  {
    std::vector<float> cand;
#pragma omp for schedule(dynamic, 1)
    for (int bh = 0; bh < n_heads; ++bh) {
      for (int j = 0; j < g; ++j) {
        cand.clear();
        for (std::int64_t i = plan.first[bh]; i < plan.first[bh + 1]; ++i) {
          const float* s = scores.data() + s_off[i] + static_cast<std::int64_t>(j) * rows[i];
          const double tl = tau_local[i * g + j];
          for (int r = 0; r < rows[i]; ++r) {
            if ((alpha - 1.0) * s[r] > tl) cand.push_back(s[r]);
          }
        }
        tau[static_cast<std::size_t>(bh) * g + j] =
            cand.empty() ? std::numeric_limits<double>::quiet_NaN()
                         : entmax_threshold(std::span<const float>(cand), alpha).tau;
      }
    }
  }

  std::vector<float> o_sum(static_cast<std::size_t>(n_items) * g * d);
  std::vector<double> p_sum(static_cast<std::size_t>(n_items) * g);
#pragma omp parallel num_threads(nt)
  {
    Scratch t(geo, plan.max_rows);
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t i = 0; i < n_items; ++i) {
      const Item& it = plan.items[i];
      const int n = src.gather(it.b, it.h, it.begin, it.end, t.k.data(), t.v.data(), nullptr);
      const float* s = scores.data() + s_off[i];
      const double* tau_h =
          tau.data() + static_cast<std::size_t>(it.b * geo.num_kv_heads + it.h) * g;
      // Keep rows where some head of the group has p > 0; V is read only there.
      int m = 0;
      for (int r = 0; r < n; ++r) {
        bool any = false;
        for (int j = 0; j < g; ++j) {
          const double p = detail::entmax_weight((alpha - 1.0) * s[j * n + r] - tau_h[j], alpha);
          t.w[static_cast<std::size_t>(j) * n + m] = static_cast<float>(p);
          any = any || p > 0;
        }
        if (any) t.v[m++] = t.v[r];
      }
      double* ps = p_sum.data() + i * g;
      for (int j = 0; j < g; ++j) {
        double sum = 0;
        for (int r = 0; r < m; ++r) sum += t.w[static_cast<std::size_t>(j) * n + r];
        ps[j] = sum;
      }
      float* o = o_sum.data() + i * g * d;
      std::fill_n(o, static_cast<std::size_t>(g) * d, 0.0f);
      if (m > 0) kern.accumulate(dt, t.w.data(), n, g, d, t.v.data(), m, o);
    }
  }

#pragma omp parallel for schedule(static) num_threads(nt)
  for (int bh = 0; bh < n_heads; ++bh) {
    const int b = bh / geo.num_kv_heads, h = bh % geo.num_kv_heads;
    const std::int64_t i0 = plan.first[bh], i1 = plan.first[bh + 1];
    if (i0 == i1) {
      write_empty(args, geo, b, h);
      continue;
    }
    std::vector<EntmaxPartialView> parts(static_cast<std::size_t>(i1 - i0));
    for (int j = 0; j < g; ++j) {
      for (std::int64_t i = i0; i < i1; ++i) {
        parts[i - i0] = {o_sum.data() + (i * g + j) * d, p_sum[i * g + j]};
      }
      const int hq = h * g + j;
      merge_entmax(parts, d, args.out.row(b, hq));
      if (!args.lse_or_tau.empty()) {
        args.lse_or_tau[b * geo.num_q_heads + hq] =
            static_cast<float>(tau[static_cast<std::size_t>(bh) * g + j]);
      }
    }
  }
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
