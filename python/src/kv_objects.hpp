// The Python-side owners of caches and KV views (shared by bind_cache / bind_attn /
// bind_select).
#pragma once

#include <cstdint>
#include <optional>

#include "arrays.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/selection.hpp"

namespace masskv::py {

// kv::PagedKVCache plus a generation counter bumped by every mutation, so a KV view taken
// before an append / fork / free is detected as stale instead of being read silently (its page
// table would no longer describe the cache).
struct Cache {
  kv::PagedKVCache cache;
  std::uint64_t generation = 0;
  explicit Cache(const kv::CacheConfig& c) : cache(c) {}
};

// What kernels read: a page table over a pool. Either taken from a Cache (owns its page table,
// has summaries for the selectors) or built over caller arrays (an engine's own pool:
// borrowed, zero-copy; no summaries).
struct KV {
  kv::PagedKVView view;
  kv::PageTableStorage table;  // from a Cache
  const Cache* cache = nullptr;
  std::uint64_t generation = 0;
  // Borrowed arrays (from_arrays): held so their memory outlives the view.
  std::optional<InArray> k, v, indptr, indices, last_page_len;
  // Where the pool and page table live: kCpu, or a CUDA device (from_arrays over device
  // tensors in a CUDA build; the page table is then validated by the kernels, which cannot
  // be read from the host, see cuda::decode).
  Device device = kCpu;

  // The view for a kernel call (page table spans re-pointed at `table`, which moves with this
  // object). Raises ValueError when the cache changed after this view was taken.
  kv::PagedKVView checked() const;
  // Raises ValueError when there is no cache (selectors need its summaries).
  const Cache& require_cache(const char* what) const;
};

// A Selection (docs/design.md §3): owned (a selector's output) or borrowed from caller arrays.
struct Selection {
  SelectionStorage storage;           // owned lists
  std::optional<InArray> ids, count;  // borrowed lists
  nb::object ids_obj, count_obj;      // the caller's objects, returned by .ids / .count
  Device device = kCpu;               // of the borrowed lists
  SelectionView::Unit unit = SelectionView::Unit::page;
  int batch = 0, num_kv_heads = 0, max_per_head = 0;

  SelectionView view() const;
};

}  // namespace masskv::py
