// A page selection in the shape a serving engine's paged decode kernel takes (docs/engine.md):
// physical page ids in sequence order, per (sequence, kv head) or per sequence (the union of its
// kv heads' lists), padded and in FlashInfer's CSR form (kv_indptr, kv_indices,
// kv_last_page_len). masskv's selections (masskv/selection.hpp) hold *logical* page ids; this is
// the one place that turns them into the engine's physical ones. cuda::engine_pages
// (masskv/cuda/select.hpp) computes the same arrays on the device, entry for entry.
#pragma once

#include <cstdint>
#include <span>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/selection.hpp"

namespace masskv::kv {

// How the lists are grouped.
enum class EngineLists {
  // One list per (sequence b, kv head h), list b * num_kv_heads + h: each kv head reads only its
  // own pages (the budget holds per head). Engines run it as a batch of B * Hkv one-head rows.
  per_kv_head,
  // One list per sequence: the union of its kv heads' lists, for kernels that take one page list
  // per sequence for all heads (FlashInfer, vLLM). Reads up to Hkv times the budget's pages.
  head_union,
};

// Lists of `lists` grouping for a selection of `batch` sequences and `num_kv_heads` kv heads.
constexpr int engine_list_count(EngineLists lists, int batch, int num_kv_heads) {
  return lists == EngineLists::per_kv_head ? batch * num_kv_heads : batch;
}

// The output arrays (host memory for kv::engine_pages, device memory for cuda::engine_pages).
// L = engine_list_count(...) lists of at most max_per_list pages each.
struct EnginePagesOut {
  int max_per_list = 0;
  std::span<std::int32_t> ids;    // [L][max_per_list]: physical ids in logical order, -1 padded
  std::span<std::int32_t> count;  // [L]
  // FlashInfer's page table of the selection (optional: leave all three empty to skip):
  // indptr [L + 1] (indptr[0] = 0), indices [L * max_per_list] (the first indptr[L] hold the
  // lists back to back, the rest -1), last_page_len [L]: the valid tokens of each list's last
  // page (its sequence's last_page_len when that is the sequence's last page, else page_size;
  // 0 for an empty list).
  std::span<std::int32_t> indptr;
  std::span<std::int32_t> indices;
  std::span<std::int32_t> last_page_len;
};

// Maps a page selection (SelectionView::Unit::page, logical ids, lists ascending) through the
// page table (its spans on the host) into `out`. Throws masskv::Error naming the argument:
// "selection" (not pages, a batch other than the table's, a count outside [0, max_per_head],
// or a list that is not ascending ids of its sequence's pages), "indptr" / "last_page_len" /
// "indices" (a malformed table), "page_size", "max_per_list" (a list longer than the output's
// lists), "ids" / "count" / "indptr" / "indices" / "last_page_len" (wrong sizes).
void engine_pages(const SelectionView& selection, const PageTable& table, int page_size,
                  EngineLists lists, const EnginePagesOut& out);

// The checks of shapes and sizes alone, which the host can make whatever memory the arrays live
// in (cuda::engine_pages makes them too; the lists' contents are checked on the device): the
// selection's unit and shape against `batch` sequences, page_size >= 1, the output's sizes.
void check_engine_pages_shape(const SelectionView& selection, int batch, int page_size,
                              EngineLists lists, const EnginePagesOut& out);

}  // namespace masskv::kv
