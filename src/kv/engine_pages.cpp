// kv::engine_pages (masskv/kv/engine_pages.hpp): the plain host version, and the reference of
// cuda::engine_pages.
#include "masskv/kv/engine_pages.hpp"

#include <algorithm>
#include <cstddef>
#include <vector>

#include "masskv/error.hpp"

namespace masskv::kv {

void check_engine_pages_shape(const SelectionView& sel, int batch, int page_size,
                              EngineLists lists, const EnginePagesOut& out) {
  using enum ErrorCode;
  require(sel.unit == SelectionView::Unit::page, invalid_argument, "selection",
          "must hold page ids (a token selection has no page table to map through)");
  require(sel.batch == batch, shape_mismatch, "selection", "has ", sel.batch,
          " sequences, the page table ", batch);
  require(sel.num_kv_heads >= 1 && sel.max_per_head >= 0, invalid_argument, "selection",
          "needs >= 1 kv head and max_per_head >= 0, got ", sel.num_kv_heads, " and ",
          sel.max_per_head);
  const std::size_t pairs = static_cast<std::size_t>(batch) * sel.num_kv_heads;
  require(sel.count.size() == pairs && sel.ids.size() == pairs * sel.max_per_head, shape_mismatch,
          "selection", "ids / count need [batch][kv heads][max_per_head] / [batch][kv heads] "
          "entries, got ", sel.ids.size(), " / ", sel.count.size());
  require(page_size >= 1, invalid_argument, "page_size", "must be >= 1, got ", page_size);
  require(out.max_per_list >= 0, invalid_argument, "max_per_list", "must be >= 0, got ",
          out.max_per_list);
  const auto L = static_cast<std::size_t>(engine_list_count(lists, batch, sel.num_kv_heads));
  const std::size_t slots = L * static_cast<std::size_t>(out.max_per_list);
  require(out.ids.size() == slots, shape_mismatch, "ids", "needs lists x max_per_list = ", slots,
          " entries, got ", out.ids.size());
  require(out.count.size() == L, shape_mismatch, "count", "needs one entry per list (", L,
          "), got ", out.count.size());
  const bool csr = !out.indptr.empty() || !out.indices.empty() || !out.last_page_len.empty();
  if (!csr) return;
  require(out.indptr.size() == L + 1, shape_mismatch, "indptr", "needs lists + 1 = ", L + 1,
          " entries, got ", out.indptr.size());
  require(out.indices.size() == slots, shape_mismatch, "indices",
          "needs lists x max_per_list = ", slots, " entries, got ", out.indices.size());
  require(out.last_page_len.size() == L, shape_mismatch, "last_page_len",
          "needs one entry per list (", L, "), got ", out.last_page_len.size());
}

void engine_pages(const SelectionView& sel, const PageTable& table, int page_size,
                  EngineLists lists, const EnginePagesOut& out) {
  using enum ErrorCode;
  require(table.indptr.size() >= 1 && table.indptr[0] == 0, invalid_argument, "indptr",
          "needs batch + 1 >= 1 entries starting at 0");
  const int B = table.batch();
  check_engine_pages_shape(sel, B, page_size, lists, out);
  require(table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs one entry per sequence");
  for (int b = 0; b < B; ++b) {
    require(table.indptr[b + 1] >= table.indptr[b], invalid_argument, "indptr",
            "must be non-decreasing at sequence ", b);
    require(table.num_pages(b) == 0 ||
                (table.last_page_len[b] >= 1 && table.last_page_len[b] <= page_size),
            invalid_argument, "last_page_len", "last_page_len[", b, "] = ",
            table.last_page_len[b], " is outside [1, page_size = ", page_size, "]");
  }
  require(static_cast<std::size_t>(table.indptr[B]) <= table.indices.size(), shape_mismatch,
          "indices", "has ", table.indices.size(), " entries, indptr[", B, "] = ",
          table.indptr[B]);

  // A list's logical ids (ascending), checked.
  const auto list_of = [&](int b, int h) {
    const int c = sel.count[static_cast<std::size_t>(b) * sel.num_kv_heads + h];
    require(c >= 0 && c <= sel.max_per_head, invalid_argument, "selection", "count of sequence ",
            b, " kv head ", h, " is ", c, ", outside [0, max_per_head = ", sel.max_per_head, "]");
    const std::span<const std::int32_t> ids = sel.list(b, h);
    for (std::size_t i = 0; i < ids.size(); ++i)
      require(ids[i] >= 0 && ids[i] < table.num_pages(b) && (i == 0 || ids[i] > ids[i - 1]),
              invalid_argument, "selection", "list of sequence ", b, " kv head ", h,
              " is not ascending ids of its ", table.num_pages(b), " pages (entry ", i, " = ",
              ids[i], ")");
    return ids;
  };
  const int L = engine_list_count(lists, B, sel.num_kv_heads);
  std::vector<std::int32_t> merged;
  std::int32_t offset = 0;
  const bool csr = !out.indptr.empty();
  if (csr) out.indptr[0] = 0;
  for (int l = 0; l < L; ++l) {
    const int b = lists == EngineLists::per_kv_head ? l / sel.num_kv_heads : l;
    merged.clear();
    if (lists == EngineLists::per_kv_head) {
      const auto ids = list_of(b, l % sel.num_kv_heads);
      merged.assign(ids.begin(), ids.end());
    } else {
      for (int h = 0; h < sel.num_kv_heads; ++h) {
        const auto ids = list_of(b, h);
        merged.insert(merged.end(), ids.begin(), ids.end());
      }
      std::sort(merged.begin(), merged.end());
      merged.erase(std::unique(merged.begin(), merged.end()), merged.end());
    }
    const auto n = static_cast<int>(merged.size());
    require(n <= out.max_per_list, invalid_argument, "max_per_list", "list ", l, " holds ", n,
            " pages, more than max_per_list = ", out.max_per_list);
    const std::span<std::int32_t> row =
        out.ids.subspan(static_cast<std::size_t>(l) * out.max_per_list, out.max_per_list);
    std::fill(row.begin(), row.end(), -1);
    for (int i = 0; i < n; ++i) row[i] = table.page(b, merged[i]);
    out.count[l] = n;
    if (!csr) continue;
    std::copy(row.begin(), row.begin() + n, out.indices.begin() + offset);
    offset += n;
    out.indptr[l + 1] = offset;
    out.last_page_len[l] = n == 0                                     ? 0
                           : merged[n - 1] + 1 == table.num_pages(b) ? table.last_page_len[b]
                                                                      : page_size;
  }
  if (csr) std::fill(out.indices.begin() + offset, out.indices.end(), -1);
}

}  // namespace masskv::kv
