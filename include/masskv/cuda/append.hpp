// Decode-step append on the GPU (issue 7 item 4; docs/design.md §3, §4): each sequence's new token
// k, v is written into its page slot of the paged pool and folded into that page's summaries —
// f32 min/max (exact), Welford mean/M2 (f64 from the f32 state), max ‖v‖ (rounded up), count —
// and, when given, into the outward-rounded bf16 bound store the GPU selector scans
// (select::BoundStoreView: min/max rounded toward −inf/+inf, W per (page, kv head)). Every
// value has the bits kv::PagedKVCache::append and select::BoundStore give on the CPU for the
// same stored key (the f64 arithmetic is written with explicit _rn intrinsics so nvcc cannot
// contract it into FMAs the CPU does not do). So append, selection and attention of a step run
// on the device with no host round trip, and can be captured in one CUDA graph.
//
// Page allocation stays on the host (free list, copy-on-write of shared pages): the caller
// passes the physical page and the slot of each sequence's token. Slot 0 starts a page: its
// summaries are reset first (the CPU's take_page), other slots continue them. Pages of one call
// must be distinct. Unwritten slots are not zeroed (kernels mask them, §3).
//
// summarize_pages rebuilds the same stores for pages whose tokens someone else wrote (a serving
// engine's own append kernel, docs/engine.md): every listed page's summaries from its stored
// tokens, folded in slot order by the same arithmetic, so they have the bits appending those
// tokens one by one would give.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "masskv/dtype.hpp"
#include "masskv/tensor.hpp"

struct CUstream_st;

namespace masskv::cuda {

// Device-side error flag of the append kernel.
class AppendWorkspace {
 public:
  AppendWorkspace();
  ~AppendWorkspace();
  AppendWorkspace(const AppendWorkspace&) = delete;
  AppendWorkspace& operator=(const AppendWorkspace&) = delete;
  // Waits for `stream`, reads and clears the flag; throws Error(out_of_range, "page" / "slot" /
  // "tokens" / "group_indices") for an id outside the pool or the page (or tables that do not
  // end at the appended page: GroupRefresh — that token is appended, only its group row is
  // not refreshed), Error(non_finite, "k" / "v") for a NaN or
  // inf input or one that overflows the cache dtype. Tokens with bad ids or values were not
  // written.
  void check(CUstream_st* stream) const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// The pool and the summary stores an append or a refresh writes (device memory).
struct SummaryStores {
  // The pool, f16 or bf16, strides in elements as kv::PagedKVView.
  void* k_pool = nullptr;
  void* v_pool = nullptr;
  DType dtype = DType::bf16;
  std::int64_t stride_page = 0, stride_head = 0, stride_slot = 0;
  int num_pages = 0, num_kv_heads = 0, page_size = 0, head_dim = 0;
  // Summaries, kv::SummariesView's layout: [page][kv head][d], [page], [page][kv head].
  float* min = nullptr;
  float* max = nullptr;
  float* mean = nullptr;
  float* m2 = nullptr;
  std::int32_t* count = nullptr;
  float* max_vnorm = nullptr;
  // Optional bf16 bound store, select::BoundStoreView's layout; null: not kept.
  bf16* bound_min = nullptr;
  bf16* bound_max = nullptr;
  float* bound_wmax = nullptr;  // [page][kv head]; required with the store
};

// The group store of hierarchical selection (select::GroupStore's layout, bf16 bits
// [group slot][kv head][d], device memory) refreshed by the append itself: each sequence's last
// group (group_pages pages of the page table, its slot the group table's last entry) rebuilt
// from the bound store once the token is folded in — the bits cuda::update_groups with
// last_only writes, without its launch. The tables are the step's (after this token: each
// sequence's last page is the one appended to, else the flag is set: "group_indices").
struct GroupRefresh {
  bf16* min = nullptr;  // null: no refresh
  bf16* max = nullptr;
  int slots = 0, group_pages = 16;
  std::span<const std::int32_t> indptr, indices;              // the page table (CSR)
  std::span<const std::int32_t> group_indptr, group_indices;  // the group table (CSR)
};

struct AppendArgs : SummaryStores {
  View3<const float> k, v;               // [B][Hkv][d] f32, unit stride on d (device)
  std::span<const std::int32_t> page;    // [B] physical page of each token (device)
  std::span<const std::int32_t> slot;    // [B] its slot in the page (device)
  GroupRefresh groups;                   // optional; needs the bound store
};

// Validates shapes on the host (Error(shape_mismatch / invalid_argument / unsupported) naming
// the argument) and launches one kernel on `stream`. With check_errors, waits and calls
// workspace.check(stream).
void append(const AppendArgs& args, AppendWorkspace& workspace, CUstream_st* stream = nullptr,
            bool check_errors = true);

// The stores of `pages` rebuilt from the pool (device spans, one entry per page): tokens[i] valid
// tokens of page pages[i], in [1, page_size]; pages distinct. One kernel on `stream`; with
// check_errors, waits and calls workspace.check(stream): Error(out_of_range, "page" /
// "tokens") for an id outside the pool or a count outside [1, page_size], Error(non_finite,
// "k" / "v") for a stored NaN or inf; such a page's stores are not written.
void summarize_pages(const SummaryStores& stores, std::span<const std::int32_t> pages,
                     std::span<const std::int32_t> tokens, AppendWorkspace& workspace,
                     CUstream_st* stream = nullptr, bool check_errors = true);

// Page codes (kv/page_codes.hpp's definition, docs/design.md §2.9b), kv::PageCodesView's layout,
// device memory: what token_codes' selection on the GPU reads (cuda::two_stage_select).
struct PageCodesStores {
  std::uint8_t* codes = nullptr;        // [page][kv head][slot][(head_dim + 3) / 4]
  std::uint8_t* range_min = nullptr;    // [page][kv head][head_dim]
  std::uint8_t* range_max = nullptr;    // [page][kv head][head_dim]
  float* grid = nullptr;                // [page][kv head][2]: lo, step
  std::uint8_t* chan_codes = nullptr;   // [kv head][head_dim][page][(page_size + 3) / 4]
  std::uint8_t* chan_ranges = nullptr;  // [kv head][head_dim][page][2]
};

// The page codes of the listed pages (device spans as summarize_pages': pages[i] holds tokens[i]
// tokens; distinct) from the pool and the f32 min/max of `stores` (after append or
// summarize_pages wrote them): each (page, kv head)'s range on its 8-bit grid, the codes of its
// slots [0, tokens[i]) and their channel-major copies (a channel-major word's slots past
// tokens[i] get code 0; the token-major rows past it are not written) — the bits
// kv::PagedKVCache keeps with CacheConfig::page_codes (the arithmetic is
// kv/page_codes_math.hpp's, host and device). A decode step passes the pages it appended to
// (re-encoding a page under an unchanged range gives the same codes). One kernel on `stream`;
// bad ids or counts set the workspace's flag as summarize_pages does.
void encode_page_codes(const SummaryStores& stores, const PageCodesStores& codes,
                       std::span<const std::int32_t> pages, std::span<const std::int32_t> tokens,
                       AppendWorkspace& workspace, CUstream_st* stream = nullptr,
                       bool check_errors = true);

// The spread rows (kv::PageCodesView::chan_spread, [page][kv head][head_dim] f32) of a step:
// for each sequence b of the page table (device spans: indptr [B + 1], indices,
// last_page_len [B]), its last `tokens` keys (or counts[b], device, when given: a padded
// batch's rows of different token counts, 0 allowed) (already in the pool) folded in position order
// into its f64 Welford moments mean / m2 ([B][kv head][head_dim], device, the caller's, kept
// per sequence between steps: zeros for a new one), and at each page's last slot and at the
// sequence's last token the population deviation sqrt(m2 / n), rounded to f32, written to
// that page's row — kv::PagedKVCache's rows. A sequence shorter than `tokens`, or a bad
// last_page_len or page id, sets the workspace's flag ("tokens" / "page").
void update_spread(const SummaryStores& stores, std::span<const std::int32_t> indptr,
                   std::span<const std::int32_t> indices,
                   std::span<const std::int32_t> last_page_len, int tokens, double* mean,
                   double* m2, float* spread, AppendWorkspace& workspace,
                   CUstream_st* stream = nullptr, bool check_errors = true,
                   std::span<const std::int32_t> counts = {});

}  // namespace masskv::cuda
