// f64 scores of listed keys: the exact tau(S) of entmax_support (docs/design.md §2.2), the oracle
// (§2.7) and the diagnostics (§2.5) all need scores of stored keys, not estimates. Also the
// estimates of the selector keys (§2.9), the scores MassSource::quant_keys maps.
#include <cmath>

#include "core/cpu_features.hpp"
#include "kv/row_scores.hpp"
#include "masskv/error.hpp"
#include "masskv/select/selector.hpp"
#include "select/scores.hpp"

namespace masskv::select {

namespace detail {

namespace {

const std::uint16_t* bits(const f16* p) { return reinterpret_cast<const std::uint16_t*>(p); }
const std::uint16_t* bits(const bf16* p) { return reinterpret_cast<const std::uint16_t*>(p); }

// The row kernels are kv's (kv/row_scores.hpp): one summation order with the selector keys.
void score_rows(const float* k, std::int64_t st, int n, int d, const float* q, double scale,
                double* out, bool simd) {
  using namespace kv::detail;
  (simd ? score_rows_avx2_f32 : score_rows_portable_f32)(k, st, n, d, q, scale, out);
}
void score_rows(const f16* k, std::int64_t st, int n, int d, const float* q, double scale,
                double* out, bool simd) {
  using namespace kv::detail;
  (simd ? score_rows_avx2_f16 : score_rows_portable_f16)(bits(k), st, n, d, q, scale, out);
}
void score_rows(const bf16* k, std::int64_t st, int n, int d, const float* q, double scale,
                double* out, bool simd) {
  using namespace kv::detail;
  (simd ? score_rows_avx2_bf16 : score_rows_portable_bf16)(bits(k), st, n, d, q, scale, out);
}

template <class T>
void scores_of(const kv::PagedKVView& c, int b, int h, const float* q, double scale,
               SelectionView::Unit unit, std::span<const std::int32_t> ids,
               std::vector<double>& out) {
  const int d = c.head_dim, P = c.page_size;
  const bool simd = d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed();
  for (std::int32_t id : ids) {
    const bool page = unit == SelectionView::Unit::page;
    const int logical = page ? id : id / P;
    const int rows = page ? c.table.page_len(b, id, P) : 1;
    const T* k = c.key<T>(c.table.page(b, logical), h, page ? 0 : id % P);
    const std::size_t at = out.size();
    out.resize(at + static_cast<std::size_t>(rows));
    score_rows(k, c.stride_slot, rows, d, q, scale, out.data() + at, simd);
  }
}

}  // namespace

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

void append_selector_key_scores(const kv::SelectorKeysView& keys, const kv::PageTable& table, int b,
                                int h, const float* q, double scale, std::vector<double>& out) {
  const kv::DotRowFn dot = kv::dot_row_kernel(keys.format);
  const int n = table.num_pages(b);
  for (int j = 0; j < n; ++j) {
    const std::int32_t page = table.page(b, j);
    const int len = table.page_len(b, j, keys.page_size);
    for (int slot = 0; slot < len; ++slot) {
      out.push_back(scale *
                    static_cast<double>(dot(q, keys.row(page, h, slot),
                                            keys.row_scales(page, h, slot), keys.head_dim)));
    }
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

namespace masskv::select {

void selector_key_scores(const kv::SelectorKeysView& keys, const kv::PageTable& table, int b,
                         int kv_head, const float* q, float scale, std::vector<double>& out) {
  using enum ErrorCode;
  require(!keys.empty(), invalid_argument, "keys", "no selector keys (the cache keeps none)");
  kv::check_key_dim(keys.format, keys.head_dim, "keys");
  require(b >= 0 && b < table.batch(), out_of_range, "b", b, " is outside the batch");
  require(kv_head >= 0 && kv_head < keys.num_kv_heads, out_of_range, "kv_head", kv_head,
          " is outside [0, ", keys.num_kv_heads, ")");
  for (int j = 0; j < table.num_pages(b); ++j) {
    require(table.page(b, j) >= 0 && table.page(b, j) < keys.num_pages, out_of_range, "table",
            "page ", table.page(b, j), " is outside the selector keys' pool");
  }
  out.clear();
  detail::append_selector_key_scores(keys, table, b, kv_head, q, scale, out);
}

}  // namespace masskv::select
