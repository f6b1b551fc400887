// Quest page bounds (docs/design.md §2.3) and the top-k page selection built on them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/dtype.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::select {

// Compact copy of the key min/max summaries in bf16, [page][kv_head][head_dim], rounded
// outward (min toward -inf, max toward +inf) so a bound computed from it is still an upper
// bound on every score in the page (docs/design.md §2.2). Half the bytes of the f32 summaries.
struct BoundStoreView {
  const bf16* min = nullptr;
  const bf16* max = nullptr;
  int num_pages = 0, num_kv_heads = 0, head_dim = 0;
  // Optional [page][kv_head] W = max_c max(|min_c|, |max_c|) of the bf16 values (the scale of
  // the bound's rounding slack, docs/design.md §2.3), precomputed so the scan need not; null: the
  // kernels compute it. BoundStore::view() always sets it.
  const float* wmax = nullptr;

  std::int64_t at(std::int32_t page, int head) const {
    return (static_cast<std::int64_t>(page) * num_kv_heads + head) * head_dim;
  }
};

class BoundStore {
 public:
  BoundStore() = default;
  // Builds the store for every page of `s`.
  explicit BoundStore(const kv::SummariesView& s);
  // Re-rounds the listed physical pages from `s` (call after appends wrote into them).
  void update(const kv::SummariesView& s, std::span<const std::int32_t> pages);
  BoundStoreView view() const;
  // bf16 min + max and the f32 W of every kv head, per token of a full page:
  // (4 * H * d + 4 * H) / page_size.
  double bytes_per_token(int page_size) const;

 private:
  void round_page(const kv::SummariesView& s, std::int32_t page);

  std::vector<bf16> min_, max_;
  std::vector<float> wmax_;  // [page][kv_head]
  int num_pages_ = 0, num_kv_heads_ = 0, head_dim_ = 0;
};

// Upper bounds of the scaled scores of `num_q` query vectors against every page of one
// sequence for one kv head (the q heads of that head's GQA group):
//   out[i * pages.size() + j] = scale * sum_c max(q_ic * m_jc, q_ic * M_jc) + slack,
// with m, M the min/max summaries of physical page pages[j] (docs/design.md §2.3). The slack is
// a forward-error bound of the f32 evaluation, 2(2d+4)·2^-24·scale·||q_i||_1·W_j with
// W_j = max_c max(|m_jc|, |M_jc|), so out >= scale * q·k in exact arithmetic for every
// stored key k of the page: the bound is rigorous, not only up to rounding (the §2.2
// certificate's ε then only has to cover the kernel's score error). Uses AVX2+FMA when the
// CPU has it and d % 8 == 0. q_i starts at q + i * q_stride; scale > 0.
// Throws Error naming "pages", "kv_head", "q", "num_q", "scale" or "out".
void page_upper_bounds(const kv::SummariesView& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out);
void page_upper_bounds(const BoundStoreView& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out);

// Which pages every selection keeps, and how many it may hold (docs/design.md §3).
struct TopkPolicy {
  int budget_pages = 64;  // pages per (sequence, kv head), kept pages included
  int sink_pages = 1;     // the first pages of the sequence
  int window_tokens = 0;  // pages covering the last W tokens; the last page is always kept
};

// Number of pages a selection of a sequence with `num_pages` pages and `length` tokens
// holds: min(num_pages, max(budget, kept)), kept = |sinks ∪ window pages ∪ last page|.
int topk_selected_pages(int num_pages, std::int64_t length, int page_size,
                        const TopkPolicy& policy);

// Selects pages of one (sequence, kv head) from bounds [num_q][num_pages] (the group's q
// heads). Pages are ranked by the max over the group's heads: a shared selection must keep
// every page some head needs, and a mean would let one head's large bound on a page be
// outvoted by the others (docs/design.md §3: one selection per kv group). Ties go to the lower
// page id. The kept pages are always in; the rest of the budget goes to the highest ranks.
// Writes the ids ascending into out, pads the rest of out with -1, returns the count.
// O(num_q * num_pages) (nth_element, no full sort).
int select_topk_pages(std::span<const float> bounds, int num_q, int num_pages, int last_page_len,
                      int page_size, const TopkPolicy& policy, std::span<std::int32_t> out);

// Batch form. bounds is in the table's CSR order: sequence b, q head i (of num_q_heads,
// head i belongs to kv head i / (num_q_heads / num_kv_heads)), logical page j at
// bounds[indptr[b] * num_q_heads + i * num_pages(b) + j]. `out` is reset to
// [batch][num_kv_heads][max over b of topk_selected_pages].
void select_topk_pages(std::span<const float> bounds, const kv::PageTable& table, int page_size,
                       int num_kv_heads, int num_q_heads, const TopkPolicy& policy,
                       SelectionStorage& out);

// The Quest selector: page bounds and top-k fused per (sequence, kv head), OpenMP threads
// over those pairs (each pair's result is independent of the thread count).
struct QuestArgs {
  View3<const float> q;  // [B][Hq][d], Hq a multiple of the kv heads
  kv::PageTable table;
  int page_size = 16;
  // Exactly one source of min/max: the f32 summaries or the bf16 store.
  const kv::SummariesView* summaries = nullptr;
  const BoundStoreView* bounds_bf16 = nullptr;
  float scale = 0;  // 0 means 1/sqrt(d)
  TopkPolicy policy;
};
void quest_select(const QuestArgs& args, SelectionStorage& out);

}  // namespace masskv::select
