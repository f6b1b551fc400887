// kv::PagedKVCache: the owner of one layer's pages, page summaries and per-sequence page
// lists (docs/design.md §3). Single-threaded by contract: callers serialise mutation.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/paged_kv.hpp"

namespace masskv::kv {

using SeqId = std::int32_t;

struct CacheConfig {
  int num_kv_heads = 8;
  int head_dim = 128;
  int page_size = 16;  // power of two in [1, 256]
  DType dtype = DType::f16;
  int capacity_pages = 0;  // size of the pool; > 0
  Layout layout = Layout::HND;
  // Also keep every key in a selector key format (kv/key_formats.hpp, docs/design.md §2.9),
  // quantised from the stored (converted) key on append. Needs head_dim % key_block(format)
  // == 0 (32 for int4 and mxfp4, 16 for nvfp4).
  bool selector_keys = false;
  KeyFormat selector_key_format = KeyFormat::int4;
  // The store's earlier switch, kept for its callers: true turns it on in the int4 format
  // (selector_key_format must then stay int4).
  bool int4_selector_keys = false;
  bool has_selector_keys() const { return selector_keys || int4_selector_keys; }
  // Also keep page codes of every key (kv/page_codes.hpp): what token_codes and two_stage
  // score tokens on. head_dim / 4 bytes per token and kv head, plus each page's 8-bit range
  // (2 head_dim + 8 bytes per page and kv head); the same codes and ranges channel-major; and
  // per page and kv head the f32 spread row (4 head_dim bytes: the keys' standard deviation per
  // channel over the sequence so far, PageCodesView::chan_spread, from per-sequence f64 sums).
  bool page_codes = false;
  // A learned selector's key cache (kv/key_rows.hpp, docs/design.md §2.8): per token
  // key_row_groups rows of key_row_dim projected values, in the KV's pages (shared by forks,
  // copied with a shared partial page). 0 groups: none; otherwise append takes the rows.
  int key_row_groups = 0;
  int key_row_dim = 0;
  RowFormat key_row_format = RowFormat::f32;
  void validate() const;
};

// A page table for a batch of sequences, owning its arrays; `table()` views them.
struct PageTableStorage {
  std::vector<std::int32_t> indptr, indices, last_page_len;
  PageTable table() const { return {indptr, indices, last_page_len}; }
};

class PagedKVCache {
 public:
  explicit PagedKVCache(const CacheConfig& config);
  ~PagedKVCache();
  PagedKVCache(PagedKVCache&&) noexcept;
  PagedKVCache& operator=(PagedKVCache&&) noexcept;

  const CacheConfig& config() const;

  SeqId create();
  // New sequence sharing all of `parent`'s pages. Full pages stay shared; the partial last
  // page (and its summary) is copied on the first write by either sequence.
  SeqId fork(SeqId parent);
  // Releases the sequence; pages return to the free list when no sequence uses them.
  void free(SeqId seq);

  // Appends n tokens: k, v are [n][num_kv_heads][head_dim] f32, converted to the cache dtype
  // (round to nearest even). Summaries are updated in O(d) per token from the stored
  // (converted) keys, and so are the selector keys when configured. Throws
  // Error(out_of_memory) when the pool runs out (nothing is appended then),
  // Error(non_finite, "k"/"v") on NaN/inf input, Error(out_of_range, "k") when a key is
  // beyond the selector key format's range (kv::key_encodable; int4: |k| / 7 > 65504). With
  // key rows configured,
  // `key_rows` is [n][key_row_groups][key_row_dim] (Error(shape_mismatch / non_finite,
  // "key_rows") otherwise); without, it must be empty.
  void append(SeqId seq, std::span<const float> k, std::span<const float> v, int n = 1,
              std::span<const float> key_rows = {});

  std::int64_t length(SeqId seq) const;
  int free_pages() const;
  // Free pages an append of n tokens to `seq` would take (append fails unless <= free_pages).
  std::int64_t pages_needed(SeqId seq, std::int64_t n) const;
  // Free pages appending n tokens to each of `seqs` in turn takes, exactly: a partial page
  // shared by r sequences is copied by each of the first r - 1 that write to it and written in
  // place by the last. Throws Error(invalid_argument, "seqs") on a repeated id.
  std::int64_t pages_needed(std::span<const SeqId> seqs, std::int64_t n) const;
  bool alive(SeqId seq) const;

  // Page table of the given sequences, in order.
  PageTableStorage page_table(std::span<const SeqId> seqs) const;
  // View for kernels; `table` must outlive the view's use.
  PagedKVView view(const PageTableStorage& table) const;
  SummariesView summaries() const;
  // Empty (null) unless config().has_selector_keys().
  SelectorKeysView selector_keys() const;
  // Empty (null) unless config().key_row_groups > 0.
  KeyRowsView key_rows() const;
  // Empty (null) unless config().page_codes.
  PageCodesView page_codes() const;

  // Bytes held per stored token: KV and (separately) summaries, for reports.
  double kv_bytes_per_token() const;
  double summary_bytes_per_token() const;
  // Selector keys: num_kv_heads * row_bytes(format, head_dim) (int4: head_dim / 2 +
  // head_dim / 16 per kv head; 0 when off).
  double selector_key_bytes_per_token() const;
  // Learned selector key rows: groups * row_bytes(format, dim) (0 when off).
  double key_row_bytes_per_token() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Recomputes the summaries of one (page, head) from the stored keys of `view`'s pool
// (the first `count` slots), in f64 for mean/M2. Used by tests and by `fork`'s checks.
struct PageSummary {
  std::vector<float> min, max;
  std::vector<double> mean, m2;
  int count = 0;
  double max_vnorm = 0;
};
PageSummary recompute_summary(const PagedKVView& view, std::int32_t page, int head, int count);

}  // namespace masskv::kv
