// The always-kept items of one sequence (docs/design.md §3): the sink pages, the pages covering
// the last window_tokens tokens, and the last page. One rule, host and device, for the CPU
// selectors (group.hpp, topk_rank.hpp), context parallelism (dist/select.cpp, through
// topk_split) and the CUDA kernels (cuda/select_common.cuh, cuda/extend_kept_math.hpp); every
// path must keep the same items for the selections to agree bit for bit.
#pragma once

#include <cstdint>

#include "core/host_device.hpp"

namespace masskv::select {

// Items [0, first_end) and [last_begin, n) of a sequence of n items (pages or tokens); the two
// ranges overlap when first_end >= last_begin.
template <class I>
struct KeptRanges {
  I first_end = 0, last_begin = 0;
  MASSKV_HD I count(I n) const {
    return first_end >= last_begin ? n : first_end + (n - last_begin);
  }
};

// First token of the kept tail of a sequence of `pages` pages and `length` tokens: the last
// window_tokens tokens, moved back to the last page's start when they begin inside it (so the
// last page is always whole). window_tokens == 0 keeps the last page alone, whatever `length`
// says. pages == 0 gives -page_size (no item).
MASSKV_HD inline std::int64_t kept_tail_token(int pages, std::int64_t length, int page_size,
                                              int window_tokens) {
  const std::int64_t last_start = static_cast<std::int64_t>(pages - 1) * page_size;
  if (window_tokens <= 0) return last_start;
  const std::int64_t from = length > window_tokens ? length - window_tokens : 0;
  return from < last_start ? from : last_start;
}

// In pages: [0, min(sink_pages, pages)) and [the tail token's page, pages).
MASSKV_HD inline KeptRanges<int> kept_pages(int pages, std::int64_t length, int page_size,
                                            int sink_pages, int window_tokens) {
  KeptRanges<int> k;
  k.first_end = sink_pages < pages ? sink_pages : pages;
  k.last_begin =
      static_cast<int>(kept_tail_token(pages, length, page_size, window_tokens) / page_size);
  return k;
}

// In tokens: the tokens of the sink pages and those from the tail token on.
MASSKV_HD inline KeptRanges<std::int64_t> kept_tokens(int pages, std::int64_t length,
                                                      int page_size, int sink_pages,
                                                      int window_tokens) {
  const int sinks = sink_pages < pages ? sink_pages : pages;
  const std::int64_t sink_end = static_cast<std::int64_t>(sinks) * page_size;
  return {sink_end < length ? sink_end : length,
          kept_tail_token(pages, length, page_size, window_tokens)};
}

// Candidate pages of a two_stage selection (docs/design.md §3): candidate_factor pages per page
// of the cap (in tokens), among the pages that hold no kept token. One count for the rule
// (rules/two_stage.cpp) and the read accounting (read_cost.cpp).
MASSKV_HD inline std::int64_t two_stage_candidates(int pages, int kept_pages, std::int64_t cap,
                                                   int page_size, int candidate_factor) {
  const std::int64_t want =
      static_cast<std::int64_t>(candidate_factor) * ((cap + page_size - 1) / page_size);
  const std::int64_t eligible = pages - kept_pages;
  return want < eligible ? want : eligible;
}

}  // namespace masskv::select
