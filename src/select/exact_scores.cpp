// f64 scores of listed keys: the exact tau(S) of entmax_support (DESIGN.md §2.2), the oracle
// (§2.7) and the diagnostics (§2.5) all need scores of stored keys, not estimates.
#include <cmath>

#include "masskv/error.hpp"
#include "masskv/select/selector.hpp"
#include "select/scores.hpp"

namespace masskv::select {

namespace detail {

template <class T>
void scores_of(const kv::PagedKVView& c, int b, int h, const float* q, double scale,
               SelectionView::Unit unit, std::span<const std::int32_t> ids,
               std::vector<double>& out) {
  const int d = c.head_dim, P = c.page_size;
  auto one = [&](int logical, int slot) {
    const T* k = c.key<T>(c.table.page(b, logical), h, slot);
    double s = 0;
    for (int x = 0; x < d; ++x) s += static_cast<double>(q[x]) * static_cast<double>(to_f32(k[x]));
    out.push_back(scale * s);
  };
  for (std::int32_t id : ids) {
    if (unit == SelectionView::Unit::page) {
      const int len = c.table.page_len(b, id, P);
      for (int slot = 0; slot < len; ++slot) one(id, slot);
    } else {
      one(id / P, id % P);
    }
  }
}

void append_scores(const kv::PagedKVView& c, int b, int h, const float* q, double scale,
                   SelectionView::Unit unit, std::span<const std::int32_t> ids,
                   std::vector<double>& out) {
  switch (c.dtype) {
    case DType::f32:
      return scores_of<float>(c, b, h, q, scale, unit, ids, out);
    case DType::f16:
      return scores_of<f16>(c, b, h, q, scale, unit, ids, out);
    case DType::bf16:
      return scores_of<bf16>(c, b, h, q, scale, unit, ids, out);
  }
}

}  // namespace detail

void exact_scores(const kv::PagedKVView& cache, int b, int kv_head, const float* q, float scale,
                  SelectionView::Unit unit, std::span<const std::int32_t> ids,
                  std::vector<double>& out) {
  using enum ErrorCode;
  require(b >= 0 && b < cache.table.batch(), out_of_range, "b", b, " is outside the batch");
  require(kv_head >= 0 && kv_head < cache.num_kv_heads, out_of_range, "kv_head", kv_head,
          " is outside [0, ", cache.num_kv_heads, ")");
  const std::int64_t limit = unit == SelectionView::Unit::page
                                 ? cache.table.num_pages(b)
                                 : cache.table.length(b, cache.page_size);
  for (std::int32_t id : ids) {
    require(id >= 0 && id < limit, out_of_range, "ids", "id ", id, " is outside [0, ", limit, ")");
  }
  out.clear();
  detail::append_scores(cache, b, kv_head, q, scale, unit, ids, out);
}

}  // namespace masskv::select
