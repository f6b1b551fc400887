// Page-major scans of the page summaries for every q head of a batch (docs/design.md §2.3, §2.4):
// one pass over each summary array, page by page and every kv head of a page in turn, OpenMP
// threads over chunks of pages. Shared by quest_select and run_selector. No checks: callers
// validated. Every value depends on its (page, head) alone, so results do not depend on the
// thread count or the chunking.
//
// Output layout (the batch CSR order of select_topk_pages): sequence b, q head i, logical
// page j at [indptr[b] * Hq + i * num_pages(b) + j].
#pragma once

#include <cstdint>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/tensor.hpp"
#include "select/row_kernels.hpp"

namespace masskv::select::detail {

// §2.3 upper bounds (the values page_upper_bounds gives, same bits) from exactly one of
// `summaries` (f32 min/max) and `bounds_bf16`. w_out (optional, [indptr[b] + j][kv head]):
// W = max_c max(|min_c|, |max_c|) of the values the bound read.
void all_page_bounds(const kv::SummariesView* summaries, const BoundStoreView* bounds_bf16,
                     const kv::PageTable& table, const View3<const float>& q, float scale,
                     float* bounds, float* w_out);

// §2.4 Gaussian page model per q head, f64: m = scale q·μ_j and
// v = scale² Σ_c q_c² max(M2_jc, 0) / n_j (0 for an empty page).
void all_page_moments(const kv::SummariesView& summaries, const kv::PageTable& table,
                      const View3<const float>& q, double scale, double* m, double* v);

}  // namespace masskv::select::detail
