// Row gathering: turns (sequence, kv head, a range of pages or selected ids) into arrays of
// key / value row pointers for the micro-kernels, whatever the layout (HND, NHD) and unit.
#pragma once

#include <cstdint>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/selection.hpp"

namespace masskv::attn::detail {

class RowSource {
 public:
  RowSource(const kv::PagedKVView& cache, const SelectionView* selection);

  // Units of (b, h): pages (dense or page selection) or tokens (token selection).
  int units(int b, int h) const;
  bool token_units() const { return sel_ != nullptr && sel_->unit == SelectionView::Unit::token; }

  std::int64_t length(int b) const { return c_.table.length(b, c_.page_size); }

  // Number of rows gather() would write for units [begin, end) of (b, h).
  int count(int b, int h, int begin, int end) const;

  // Rows of units [begin, end) of (b, h) in position order; slots >= last_page_len are never
  // listed. Writes positions (token index in the sequence) when `pos` is not null.
  // Returns the number of rows written.
  int gather(int b, int h, int begin, int end, const void** k, const void** v,
             std::int64_t* pos) const;

 private:
  const kv::PagedKVView& c_;
  const SelectionView* sel_;
  std::int64_t esize_;
};

}  // namespace masskv::attn::detail
