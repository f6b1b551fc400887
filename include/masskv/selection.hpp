// The Selection (docs/design.md §3): the output of every selector and the input of sparse kernels;
// a vocabulary type like tensor.hpp's views, so attn, kv and dist take it without depending on
// select.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace masskv {

// Per (sequence b, kv head h): ids[(b * num_kv_heads + h) * max_per_head + i], i < count,
// strictly ascending, padded with -1. Ids are *logical* (position order within the
// sequence): page ids 0..num_pages(b)-1 or token ids 0..length(b)-1. All q heads of a kv
// group share the kv head's list (the shape vLLM/SGLang/FlashMLA sparse paths take).
struct SelectionView {
  enum class Unit { page, token };
  Unit unit = Unit::page;
  int batch = 0, num_kv_heads = 0, max_per_head = 0;
  std::span<const std::int32_t> ids;    // [batch][num_kv_heads][max_per_head]
  std::span<const std::int32_t> count;  // [batch][num_kv_heads]

  std::span<const std::int32_t> list(int b, int h) const {
    const std::size_t base = (static_cast<std::size_t>(b) * num_kv_heads + h) * max_per_head;
    return ids.subspan(base, static_cast<std::size_t>(count[b * num_kv_heads + h]));
  }
};

// Owner of a Selection's arrays; `view()` lends them to kernels.
struct SelectionStorage {
  SelectionView::Unit unit = SelectionView::Unit::page;
  int batch = 0, num_kv_heads = 0, max_per_head = 0;
  std::vector<std::int32_t> ids;    // [batch][num_kv_heads][max_per_head], -1 padded
  std::vector<std::int32_t> count;  // [batch][num_kv_heads]

  // Sets the shape; every list becomes empty (ids -1, counts 0).
  void reset(SelectionView::Unit u, int b, int heads, int per_head) {
    unit = u;
    batch = b;
    num_kv_heads = heads;
    max_per_head = per_head;
    ids.assign(static_cast<std::size_t>(b) * heads * per_head, -1);
    count.assign(static_cast<std::size_t>(b) * heads, 0);
  }
  std::span<std::int32_t> slots(int b, int h) {
    return std::span<std::int32_t>(ids).subspan(
        (static_cast<std::size_t>(b) * num_kv_heads + h) * max_per_head,
        static_cast<std::size_t>(max_per_head));
  }
  SelectionView view() const { return {unit, batch, num_kv_heads, max_per_head, ids, count}; }
  // A copy of `v`'s shape and lists (a view lent by a step outlives it only copied).
  void assign(const SelectionView& v) {
    reset(v.unit, v.batch, v.num_kv_heads, v.max_per_head);
    ids.assign(v.ids.begin(), v.ids.end());
    count.assign(v.count.begin(), v.count.end());
  }
};

}  // namespace masskv
