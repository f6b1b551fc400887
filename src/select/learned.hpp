// Page masses of a learned selector (docs/design.md §2.8): softmax over every cached token of
// the scores ŝ_t = q · k_t on the selector key rows, summed per page. Used by the learned
// scorer (scorers/learned.cpp) and nothing else: the tests' reference is their own f64 loop.
#pragma once

#include <span>
#include <vector>

#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/paged_kv.hpp"

namespace masskv::select::detail {

// out[j] (j < pages of sequence b) = Σ_{t in page j} softmax(ŝ)_t for selector group `group`,
// q of keys.dim floats. `scores` is scratch. Deterministic (sequential; callers split work over
// (b, group) only). Unchecked: callers validated the shapes.
void learned_page_masses(const kv::KeyRowsView& keys, const kv::PageTable& table, int b,
                         int group, const float* q, std::vector<double>& scores,
                         std::span<double> out);

}  // namespace masskv::select::detail
