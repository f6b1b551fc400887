// Unchecked f64 score helper shared by the selectors and the diagnostics (callers validated
// the ids; safe inside OpenMP regions, it never throws).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/selection.hpp"
#include "select/row_kernels.hpp"

namespace masskv::select::detail {

// Appends scale·q·k (f64) of the keys of logical pages / tokens `ids` of (b, kv head h).
void append_scores(const kv::PagedKVView& c, int b, int h, const float* q, double scale,
                   SelectionView::Unit unit, std::span<const std::int32_t> ids,
                   std::vector<double>& out);

// Appends scale·q·k̂ (f64) of every token of (b, kv head h) from the selector keys, computed
// on their codes (kv::dot_row_kernel of their format), in token order.
void append_selector_key_scores(const kv::SelectorKeysView& keys, const kv::PageTable& table, int b,
                                int h, const float* q, double scale, std::vector<double>& out);

}  // namespace masskv::select::detail
