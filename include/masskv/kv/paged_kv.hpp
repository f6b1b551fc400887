// Views of a paged KV cache (docs/design.md §3). Kernels take these by value; nothing here owns
// memory. The owner is kv::PagedKVCache (kv/cache.hpp), but any engine's cache with the same
// page table can be viewed: strides let an NHD cache (vLLM, FlashInfer's default) pass too.
#pragma once

#include <cstdint>
#include <span>

#include "masskv/dtype.hpp"
#include "masskv/kv/key_formats.hpp"
#include "masskv/kv/page_codes.hpp"

namespace masskv::kv {

// HND: [page][kv_head][slot][dim] (masskv's own: one head's page is one burst).
// NHD: [page][slot][kv_head][dim].
enum class Layout { HND, NHD };

// FlashInfer's CSR page table, int32. Sequence b owns physical pages
// indices[indptr[b] .. indptr[b+1]) in token order; its last page holds last_page_len[b]
// tokens (1..page_size), every other page is full.
struct PageTable {
  std::span<const std::int32_t> indptr;         // [B + 1], indptr[0] == 0, non-decreasing
  std::span<const std::int32_t> indices;        // [indptr[B]]
  std::span<const std::int32_t> last_page_len;  // [B]

  int batch() const { return indptr.empty() ? 0 : static_cast<int>(indptr.size()) - 1; }
  int num_pages(int b) const { return indptr[b + 1] - indptr[b]; }
  std::int32_t page(int b, int logical) const { return indices[indptr[b] + logical]; }
  // Tokens stored in sequence b.
  std::int64_t length(int b, int page_size) const {
    const int n = num_pages(b);
    return n == 0 ? 0 : static_cast<std::int64_t>(n - 1) * page_size + last_page_len[b];
  }
  // Valid slots of logical page `logical` of sequence b.
  int page_len(int b, int logical, int page_size) const {
    return logical + 1 == num_pages(b) ? last_page_len[b] : page_size;
  }
};

struct PagedKVView {
  const void* k = nullptr;
  const void* v = nullptr;
  DType dtype = DType::f16;
  int num_pages = 0;  // physical pages in the pool
  int num_kv_heads = 0;
  int page_size = 16;  // power of two, 1..256
  int head_dim = 128;
  // Element strides, shared by K and V; the dim axis is contiguous.
  std::int64_t stride_page = 0, stride_head = 0, stride_slot = 0;
  PageTable table;

  // Strides of a contiguous pool in `layout`.
  void set_layout(Layout layout);
  std::int64_t offset(std::int32_t page, int head, int slot) const {
    return page * stride_page + head * stride_head + slot * stride_slot;
  }
  template <class T>
  const T* key(std::int32_t page, int head, int slot) const {
    return static_cast<const T*>(k) + offset(page, head, slot);
  }
  template <class T>
  const T* value(std::int32_t page, int head, int slot) const {
    return static_cast<const T*>(v) + offset(page, head, slot);
  }

  // Checks geometry and the page table: indptr monotone starting at 0, ids in
  // [0, num_pages), every sequence non-empty with last_page_len in [1, page_size].
  // Throws masskv::Error naming the offending argument. O(nnz).
  void validate() const;
  // The pool's geometry alone (page size, dims, non-overlapping strides): what the host can
  // check of a pool whose page table lives in device memory.
  void validate_geometry() const;
};

// Per page and kv head statistics of the keys (docs/design.md §3), f32, laid out
// [page][kv_head][head_dim] (count: [page]; max_vnorm: [page][kv_head]).
// min/max are bit-equal to a recomputation from the stored keys; mean/M2 follow Welford.
struct SummariesView {
  const float* min = nullptr;
  const float* max = nullptr;
  const float* mean = nullptr;
  const float* m2 = nullptr;
  const std::int32_t* count = nullptr;
  const float* max_vnorm = nullptr;  // max over the page's tokens of ||v||_2
  int num_pages = 0, num_kv_heads = 0, head_dim = 0;

  std::int64_t at(std::int32_t page, int head) const {
    return (static_cast<std::int64_t>(page) * num_kv_heads + head) * head_dim;
  }
};

// Per-token selector keys in one of the formats of kv/key_formats.hpp (docs/design.md §2.9), kept
// beside the paged KV: row (page, kv head, slot) of codes and of block scales.
struct SelectorKeysView {
  KeyFormat format = KeyFormat::int4;
  const std::uint8_t* codes = nullptr;   // [page][kv_head][slot][code_bytes(format, head_dim)]
  const std::uint8_t* scales = nullptr;  // [page][kv_head][slot][scale_bytes(format, head_dim)]
  int num_pages = 0, num_kv_heads = 0, page_size = 0, head_dim = 0;

  bool empty() const { return codes == nullptr; }
  std::int64_t row_index(std::int32_t page, int head, int slot) const {
    return (static_cast<std::int64_t>(page) * num_kv_heads + head) * page_size + slot;
  }
  const std::uint8_t* row(std::int32_t page, int head, int slot) const {
    return codes + row_index(page, head, slot) * code_bytes(format, head_dim);
  }
  // Null for bf16 (no scales).
  const std::uint8_t* row_scales(std::int32_t page, int head, int slot) const {
    return scales == nullptr ? nullptr
                             : scales + row_index(page, head, slot) * scale_bytes(format, head_dim);
  }
};

// Page codes of every stored key (kv/page_codes.hpp), beside the paged KV: row (page, kv head,
// slot) of page_code_bytes(head_dim) bytes of 2-bit codes, relative to the (page, kv head)'s
// range on its 8-bit grid (range_min / range_max codes, grid lo and step).
struct PageCodesView {
  const std::uint8_t* codes = nullptr;  // [page][kv_head][slot][page_code_bytes(head_dim)]
  int num_pages = 0, num_kv_heads = 0, page_size = 0, head_dim = 0;
  const std::uint8_t* range_min = nullptr;  // [page][kv_head][head_dim]
  const std::uint8_t* range_max = nullptr;  // [page][kv_head][head_dim]
  const float* grid = nullptr;              // [page][kv_head][2]: lo, step

  // The same codes and ranges channel-major, so that a scorer reading a subset of the channels
  // (token_codes' first pass, SelectorConfig::code_channels) reads each chosen channel of every
  // page as one contiguous run: chan_codes [kv_head][channel][page][(page_size + 3) / 4] (slot s
  // at byte s / 4, bits 2 (s % 4)), chan_ranges [kv_head][channel][page][2] (a, b).
  const std::uint8_t* chan_codes = nullptr;
  const std::uint8_t* chan_ranges = nullptr;
  // Per (page, kv head) the standard deviation of each channel over every key of the sequence
  // up to that page's last written slot (population, from f64 Welford sums, rounded to f32):
  // [page][kv_head][head_dim]. The first pass weighs channels by it
  // (SelectorConfig::code_channel_spread), reading the row of the sequence's last page only.
  // Pages are shared only between sequences with the same prefix, so a row is every sharer's.
  const float* chan_spread = nullptr;

  bool empty() const { return codes == nullptr; }
  const std::uint8_t* row(std::int32_t page, int head, int slot) const {
    return codes + ((static_cast<std::int64_t>(page) * num_kv_heads + head) * page_size + slot) *
                       ((head_dim + 3) / 4);
  }
  int chan_word_bytes() const { return (page_size + 3) / 4; }
  // Channel c of kv head `head`: every page's code bytes ([page][chan_word_bytes()]) and ranges
  // ([page][2]).
  const std::uint8_t* chan_row(int head, int c) const {
    return chan_codes + (static_cast<std::int64_t>(head) * head_dim + c) * num_pages *
                            chan_word_bytes();
  }
  const std::uint8_t* chan_range_row(int head, int c) const {
    return chan_ranges + (static_cast<std::int64_t>(head) * head_dim + c) * num_pages * 2;
  }
  const float* spread_row(std::int32_t page, int head) const {
    return chan_spread + (static_cast<std::int64_t>(page) * num_kv_heads + head) * head_dim;
  }
  PageRange8 range(std::int32_t page, int head) const {
    const std::int64_t ph = static_cast<std::int64_t>(page) * num_kv_heads + head;
    return {grid[2 * ph], grid[2 * ph + 1], range_min + ph * head_dim, range_max + ph * head_dim};
  }
};

}  // namespace masskv::kv
