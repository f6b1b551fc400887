// The recall measure of learned-selector reports (docs/learned.md): how much of the dense
// attention mass the pages a selector picks at a fixed budget cover.
#pragma once

#include <cstdint>
#include <span>

namespace masskv::learn {

// Pages a selection at budget 1/budget_den of a prefix of `length` tokens holds:
// max(1, ceil(pages / budget_den)), pages = ceil(length / page_size).
int budget_pages(std::int64_t length, int page_size, int budget_den);

// Σ p over the tokens of the pages that select::select_topk_pages picks from
// scores [num_q][pages] (pages ranked by the max over the num_q rows, the last page kept, no
// sinks or window) at budget_pages(p.size(), ...). p is a distribution over the prefix
// (one value per token). Throws Error(shape_mismatch, "scores") when the sizes disagree.
double covered_mass(std::span<const float> scores, int num_q, std::span<const float> p,
                    int page_size, int budget_den);

}  // namespace masskv::learn
