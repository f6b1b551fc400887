// PagedKVView: layout strides and the checks every kernel runs before reading a cache
// (docs/design.md §3, §6: errors name the argument).
#include "masskv/kv/paged_kv.hpp"

#include <algorithm>
#include <utility>

#include "masskv/error.hpp"

namespace masskv::kv {

void PagedKVView::set_layout(Layout layout) {
  const std::int64_t d = head_dim;
  stride_page = static_cast<std::int64_t>(num_kv_heads) * page_size * d;
  if (layout == Layout::HND) {
    stride_head = static_cast<std::int64_t>(page_size) * d;
    stride_slot = d;
  } else {
    stride_slot = static_cast<std::int64_t>(num_kv_heads) * d;
    stride_head = d;
  }
}

namespace {

void check_geometry(const PagedKVView& v) {
  using enum ErrorCode;
  require(v.page_size >= 1 && v.page_size <= 256 && (v.page_size & (v.page_size - 1)) == 0,
          invalid_argument, "page_size", "must be a power of two in [1, 256], got ", v.page_size);
  require(v.head_dim > 0, invalid_argument, "head_dim", "must be > 0, got ", v.head_dim);
  require(v.num_kv_heads > 0, invalid_argument, "num_kv_heads", "must be > 0, got ",
          v.num_kv_heads);
  require(v.num_pages >= 0, invalid_argument, "num_pages", "must be >= 0, got ", v.num_pages);
  require(v.k != nullptr, invalid_argument, "k", "null key pool");
  require(v.v != nullptr, invalid_argument, "v", "null value pool");

  // The (head, slot) rows of one page must not overlap: order the two axes by stride and
  // require each to step over the whole extent of the inner one. Axes of extent 1 are free.
  struct Axis {
    const char* name;
    int extent;
    std::int64_t stride;
  };
  Axis a{"stride_head", v.num_kv_heads, v.stride_head};
  Axis b{"stride_slot", v.page_size, v.stride_slot};
  for (const Axis& x : {a, b}) {
    require(x.extent == 1 || x.stride > 0, shape_mismatch, x.name, "must be > 0, got ", x.stride);
  }
  if (a.extent > 1 && b.extent > 1 && b.stride < a.stride) std::swap(a, b);
  std::int64_t inner = v.head_dim;  // elements one step of the next axis must clear
  for (const Axis& x : {a, b}) {
    if (x.extent == 1) continue;
    require(x.stride >= inner, shape_mismatch, x.name, x.stride,
            " overlaps the previous axis (needs >= ", inner, ")");
    inner = x.stride * x.extent;
  }
  const std::int64_t page_span =
      (v.num_kv_heads - 1) * v.stride_head + (v.page_size - 1) * v.stride_slot + v.head_dim;
  require(v.num_pages <= 1 || v.stride_page >= page_span, shape_mismatch, "stride_page",
          v.stride_page, " is smaller than one page's span ", page_span);
}

void validate_table(const PageTable& t, int num_pages, int page_size) {
  using enum ErrorCode;
  require(t.indptr.size() >= 2, shape_mismatch, "indptr",
          "needs batch + 1 >= 2 entries (at least one sequence), got ", t.indptr.size());
  const int batch = t.batch();
  require(t.last_page_len.size() == static_cast<std::size_t>(batch), shape_mismatch,
          "last_page_len", "has ", t.last_page_len.size(), " entries, batch is ", batch);
  require(t.indptr[0] == 0, invalid_argument, "indptr", "indptr[0] must be 0, got ", t.indptr[0]);
  for (int b = 0; b < batch; ++b) {
    require(t.indptr[b + 1] >= t.indptr[b], invalid_argument, "indptr",
            "must be non-decreasing: indptr[", b + 1, "] = ", t.indptr[b + 1], " < indptr[", b,
            "] = ", t.indptr[b]);
    require(t.indptr[b + 1] > t.indptr[b], invalid_argument, "indptr", "sequence ", b,
            " has no pages (indptr[", b, "] == indptr[", b + 1, "] == ", t.indptr[b],
            "); an empty sequence cannot be attended");
    const std::int32_t len = t.last_page_len[b];
    require(len >= 1 && len <= page_size, invalid_argument, "last_page_len", "last_page_len[", b,
            "] = ", len, " is outside [1, page_size = ", page_size, "]");
  }
  require(static_cast<std::size_t>(t.indptr[batch]) == t.indices.size(), shape_mismatch, "indices",
          "has ", t.indices.size(), " entries but indptr[", batch, "] = ", t.indptr[batch]);
  for (std::size_t i = 0; i < t.indices.size(); ++i) {
    const std::int32_t p = t.indices[i];
    require(p >= 0 && p < num_pages, out_of_range, "indices", "indices[", i, "] = ", p,
            " is outside [0, num_pages = ", num_pages, ")");
  }
}

}  // namespace

void PagedKVView::validate_geometry() const { check_geometry(*this); }

void PagedKVView::validate() const {
  check_geometry(*this);
  validate_table(table, num_pages, page_size);
}

}  // namespace masskv::kv
