// The ranking rule of the top-k page selection (docs/design.md §3), shared by the single-rank
// selector (page_bound.cpp) and the distributed one (dist/select.cpp), which must pick the
// same pages bit for bit.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>
#include <functional>
#include <vector>

#include "masskv/select/page_bound.hpp"
#include "select/kept.hpp"

namespace masskv::select::detail {

// Pages [0, sinks) and [window, n) are always kept (`kept` of them; the rule of kept.hpp);
// `need` more come from [sinks, window) by rank, for `total` in all.
struct TopkSplit {
  int sinks = 0, window = 0, kept = 0, total = 0, need = 0;
};

inline TopkSplit topk_split(int n, std::int64_t length, int page_size, const TopkPolicy& p) {
  TopkSplit s;
  const KeptRanges<int> k = kept_pages(n, length, page_size, p.sink_pages, p.window_tokens);
  s.sinks = k.first_end;
  s.window = k.last_begin;
  s.kept = k.count(n);
  s.total = std::min(n, std::max(p.budget_pages, s.kept));
  s.need = s.total - s.kept;  // > 0 only when sinks < window
  return s;
}

// Order-preserving map of a finite-or-infinite float to an unsigned key (-0 counts as +0).
inline std::uint32_t ordered_key(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Rank of page `page` with group bound `bound`: larger key = better. High bound first; among
// equal bounds the lower id first (its complement is larger). One integer comparison.
inline std::uint64_t topk_key(float bound, int page) {
  return static_cast<std::uint64_t>(ordered_key(bound)) << 32 |
         (0xffffffffu - static_cast<std::uint32_t>(page));
}
inline int topk_key_page(std::uint64_t key) {
  return static_cast<int>(0xffffffffu - static_cast<std::uint32_t>(key));
}
// The bound a key was made from (-0 comes back as +0).
inline float topk_key_bound(std::uint64_t key) {
  const std::uint32_t u = static_cast<std::uint32_t>(key >> 32);
  return std::bit_cast<float>((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

// Keeps the `m` best keys (largest), in no particular order.
inline void keep_best(std::vector<std::uint64_t>& keys, std::size_t m) {
  if (m < keys.size()) {
    std::nth_element(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(m), keys.end(),
                     std::greater<>());
    keys.resize(m);
  }
}

// Writes the selection of one (sequence, kv head) of n pages: the sinks, the split.need best
// of `keys` (candidates from [sinks, window), at least split.need of them), the window pages;
// ascending, padded with -1 up to out_size. Returns the count. Reorders keys.
inline int write_topk(const TopkSplit& split, int n, std::vector<std::uint64_t>& keys,
                      std::int32_t* out, int out_size) {
  int w = 0;
  for (int j = 0; j < split.sinks && j < split.window; ++j) out[w++] = j;
  if (split.need > 0) {
    keep_best(keys, static_cast<std::size_t>(split.need));
    std::sort(keys.begin(), keys.end(),
              [](std::uint64_t x, std::uint64_t y) { return topk_key_page(x) < topk_key_page(y); });
    for (const std::uint64_t key : keys) out[w++] = topk_key_page(key);
  }
  for (int j = split.window; j < n; ++j) out[w++] = j;
  const int count = w;
  for (; w < out_size; ++w) out[w] = -1;
  return count;
}

}  // namespace masskv::select::detail
