// The index arithmetic of cuda::extend_kept, shared by its kernel and a CPU test that checks it
// against select::extend_kept (tests/test_selectors.cpp): no CUDA types, so g++ compiles it.
// The extended list of a sequence with n pages is [0, s) ∪ (old ∩ [s, w)) ∪ [w, n); with an
// ascending old list, old ∩ [s, w) is its run [below_s, below_w) (items below s, below w).
#pragma once

#include <cstdint>

#include "core/host_device.hpp"
#include "select/kept.hpp"

namespace masskv::cuda::detail {

struct KeptRange {
  int s = 0;  // sink pages kept: [0, s)
  int w = 0;  // first page of the kept tail [w, n), w >= s
};

// n pages, `last` tokens in the last page (1..page_size; unused when n == 0). The kept pages
// are select::kept_pages's (select/kept.hpp, docs/design.md §3), the tail raised to s.
MASSKV_HD inline KeptRange kept_range(int n, int last, int page_size, int sink_pages,
                                      int window_tokens) {
  KeptRange r;
  if (n <= 0) return r;
  const std::int64_t length = static_cast<std::int64_t>(n - 1) * page_size + last;
  const select::KeptRanges<int> k =
      select::kept_pages(n, length, page_size, sink_pages, window_tokens);
  r.s = k.first_end;
  r.w = k.last_begin > r.s ? k.last_begin : r.s;
  return r;
}

// Slot i of the extended list (i < r.s + mid + n - r.w, mid = below_w - below_s).
MASSKV_HD inline std::int32_t extended_item(int i, KeptRange r, int mid, int below_s,
                                            const std::int32_t* old) {
  if (i < r.s) return i;
  if (i < r.s + mid) return old[below_s + i - r.s];
  return r.w + (i - r.s - mid);
}

}  // namespace masskv::cuda::detail
