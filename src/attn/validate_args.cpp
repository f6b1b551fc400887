#include "attn/validate_args.hpp"

#include <cmath>
#include <cstddef>

#include "attn/microkernels.hpp"
#include "masskv/error.hpp"

namespace masskv::attn::detail {
namespace {

using masskv::ErrorCode;

void require_finite(View3<const float> x, std::string_view name) {
  for (int i = 0; i < x.n0; ++i) {
    for (int j = 0; j < x.n1; ++j) {
      const float* row = x.row(i, j);
      for (int c = 0; c < x.n2; ++c) {
        require(std::isfinite(row[c]), ErrorCode::non_finite, name, "element [", i, "][", j, "][",
                c, "] is not finite");
      }
    }
  }
}

// q / out views: shape and non-negative, non-overlapping-looking strides.
template <class T>
void require_view(const View3<T>& x, int n0, int n1, int n2, std::string_view name) {
  require(x.n0 == n0 && x.n1 == n1 && x.n2 == n2, ErrorCode::shape_mismatch, name, "shape [", x.n0,
          "][", x.n1, "][", x.n2, "], expected [", n0, "][", n1, "][", n2, "]");
  require(n0 * n1 * n2 == 0 || x.data != nullptr, ErrorCode::invalid_argument, name, "null data");
  require(
      x.s1 >= x.n2 && x.s0 >= 0 && (x.n0 <= 1 || x.s0 >= static_cast<std::int64_t>(x.n1) * x.s1),
      ErrorCode::shape_mismatch, name, "strides (", x.s0, ", ", x.s1, ") overlap rows of length ",
      x.n2);
}

void require_common(const kv::PagedKVView& cache, const Mapping& mapping, float scale) {
  mapping.validate();
  cache.validate();
  require_supported_head_dim(cache.head_dim);
  require(std::isfinite(scale), ErrorCode::non_finite, "scale", "must be finite, got ", scale);
}

Geometry geometry(const kv::PagedKVView& cache, int num_q_heads, float scale) {
  Geometry g;
  g.batch = cache.table.batch();
  g.num_q_heads = num_q_heads;
  g.num_kv_heads = cache.num_kv_heads;
  g.group = num_q_heads / cache.num_kv_heads;
  g.head_dim = cache.head_dim;
  g.scale = scale != 0 ? scale : static_cast<float>(1.0 / std::sqrt(double(cache.head_dim)));
  return g;
}

void require_q_heads(int hq, int hkv) {
  require(hq > 0 && hq % hkv == 0, ErrorCode::shape_mismatch, "q", hq,
          " query heads is not a positive multiple of the cache's ", hkv, " kv heads");
}

void require_selection(const SelectionView& sel, const kv::PagedKVView& cache) {
  const int batch = cache.table.batch();
  require(sel.batch == batch && sel.num_kv_heads == cache.num_kv_heads, ErrorCode::shape_mismatch,
          "selection", "shape [", sel.batch, "][", sel.num_kv_heads,
          "] does not match the cache's [", batch, "][", cache.num_kv_heads, "]");
  require(sel.max_per_head >= 0, ErrorCode::invalid_argument, "selection",
          "max_per_head is negative");
  const std::size_t heads = static_cast<std::size_t>(batch) * cache.num_kv_heads;
  require(sel.count.size() >= heads && sel.ids.size() >= heads * sel.max_per_head,
          ErrorCode::shape_mismatch, "selection", "ids/count spans are too short");
  for (int b = 0; b < batch; ++b) {
    const std::int64_t limit = sel.unit == SelectionView::Unit::page
                                   ? cache.table.num_pages(b)
                                   : cache.table.length(b, cache.page_size);
    for (int h = 0; h < cache.num_kv_heads; ++h) {
      const int count = sel.count[b * cache.num_kv_heads + h];
      require(count >= 0 && count <= sel.max_per_head, ErrorCode::out_of_range, "selection",
              "count ", count, " of (", b, ", ", h,
              ") is outside [0, max_per_head=", sel.max_per_head, "]");
      const auto ids = sel.list(b, h);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        require(ids[i] >= 0 && ids[i] < limit, ErrorCode::out_of_range, "selection", "id ", ids[i],
                " of (", b, ", ", h, ") is outside [0, ", limit, ")");
        require(i == 0 || ids[i] > ids[i - 1], ErrorCode::invalid_argument, "selection", "ids of (",
                b, ", ", h, ") are not strictly ascending at position ", i);
      }
    }
  }
}

}  // namespace

void require_supported_head_dim(int d) {
  require(d > 0 && d % 8 == 0 && d <= mk::kMaxHeadDim, ErrorCode::unsupported, "head_dim",
          "kernels support multiples of 8 up to ", mk::kMaxHeadDim, ", got ", d);
}

Geometry validate(const DecodeArgs& args) {
  require_common(args.cache, args.mapping, args.scale);
  const int batch = args.cache.table.batch();
  require_q_heads(args.q.n1, args.cache.num_kv_heads);
  require_view(args.q, batch, args.q.n1, args.cache.head_dim, "q");
  require_view(args.out, batch, args.q.n1, args.cache.head_dim, "out");
  require(args.lse_or_tau.empty() ||
              args.lse_or_tau.size() == static_cast<std::size_t>(batch) * args.q.n1,
          ErrorCode::shape_mismatch, "lse_or_tau", "size ", args.lse_or_tau.size(),
          ", expected 0 or batch * q heads = ", static_cast<std::int64_t>(batch) * args.q.n1);
  require(args.chunk_pages > 0, ErrorCode::invalid_argument, "chunk_pages", "must be > 0, got ",
          args.chunk_pages);
  if (const EntmaxExchange* x = args.entmax_exchange) {
    require(args.mapping.is_entmax(), ErrorCode::invalid_argument, "entmax_exchange",
            "is for entmax only");
    require(static_cast<bool>(x->solve_tau), ErrorCode::invalid_argument, "entmax_exchange",
            "solve_tau is empty");
    require(x->p_sum.size() == static_cast<std::size_t>(batch) * args.q.n1,
            ErrorCode::shape_mismatch, "entmax_exchange", "p_sum has ", x->p_sum.size(),
            " values, expected batch * q heads = ", static_cast<std::size_t>(batch) * args.q.n1);
  }
  if (args.selection != nullptr) require_selection(*args.selection, args.cache);
  require_finite(args.q, "q");
  return geometry(args.cache, args.q.n1, args.scale);
}

Geometry validate(const PrefillArgs& args) {
  require_common(args.cache, args.mapping, args.scale);
  const int batch = args.cache.table.batch();
  require(args.q_indptr.size() == static_cast<std::size_t>(batch) + 1, ErrorCode::shape_mismatch,
          "q_indptr", "size ", args.q_indptr.size(), ", expected batch + 1 = ", batch + 1);
  require(args.q_indptr[0] == 0, ErrorCode::invalid_argument, "q_indptr", "must start at 0");
  for (int b = 0; b < batch; ++b) {
    const std::int64_t n = args.q_indptr[b + 1] - args.q_indptr[b];
    require(n >= 0, ErrorCode::invalid_argument, "q_indptr", "decreases at ", b);
    require(n <= args.cache.table.length(b, args.cache.page_size), ErrorCode::out_of_range,
            "q_indptr", "sequence ", b, " has ", n, " queries but only ",
            args.cache.table.length(b, args.cache.page_size), " tokens in the cache");
  }
  const int total = args.q_indptr[batch];
  require_q_heads(args.q.n1, args.cache.num_kv_heads);
  require_view(args.q, total, args.q.n1, args.cache.head_dim, "q");
  require_view(args.out, total, args.q.n1, args.cache.head_dim, "out");
  require(
      args.lse_or_tau.empty() ||
          args.lse_or_tau.size() == static_cast<std::size_t>(total) * args.q.n1,
      ErrorCode::shape_mismatch, "lse_or_tau", "size ", args.lse_or_tau.size(),
      ", expected 0 or total queries * q heads = ", static_cast<std::int64_t>(total) * args.q.n1);
  if (const BlockMask* m = args.block_mask) {
    require(m->q_block > 0 && m->k_block > 0, ErrorCode::invalid_argument, "block_mask",
            "block sizes must be > 0");
    require(m->mask_offset.size() == static_cast<std::size_t>(batch), ErrorCode::shape_mismatch,
            "block_mask", "mask_offset has ", m->mask_offset.size(), " entries, expected ", batch);
    for (int b = 0; b < batch; ++b) {
      const std::int64_t nq = args.q_indptr[b + 1] - args.q_indptr[b];
      const std::int64_t nk = args.cache.table.length(b, args.cache.page_size);
      const std::int64_t rows = (nq + m->q_block - 1) / m->q_block;
      const std::int64_t cols = (nk + m->k_block - 1) / m->k_block;
      require(m->mask_offset[b] >= 0 &&
                  m->mask_offset[b] + rows * cols <= static_cast<std::int64_t>(m->mask.size()),
              ErrorCode::out_of_range, "block_mask", "sequence ", b, " needs ", rows, " x ", cols,
              " entries at offset ", m->mask_offset[b], " but mask has ", m->mask.size());
    }
  }
  require_finite(args.q, "q");
  return geometry(args.cache, args.q.n1, args.scale);
}

}  // namespace masskv::attn::detail
