// A learned selector's scores (docs/design.md §2.8): ŝ_t = q · k_t on the selector key rows,
// and their page masses (softmax over every cached token, summed per page). Used by the
// learned scorer (scorers/learned.cpp) and learned_codes' first pass (scorers/page_codes.cpp);
// the tests' reference is their own f64 loop.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::select::detail {

// Throws Error naming the argument unless SelectArgs::learned_keys and learned_q are present,
// fit the cache's pool and batch, and the query is finite.
void check_learned_args(const SelectArgs& a);

// out[t] = ŝ_t for the n tokens of the pages `phys` (logical order, page_size each, the last
// one partial) of selector group `group`. Deterministic, sequential.
void learned_token_scores(const kv::KeyRowsView& keys, std::span<const std::int32_t> phys,
                          std::int64_t n, int group, const float* q, double* out);

// out[j] (j < pages of sequence b) = Σ_{t in page j} softmax(ŝ)_t for selector group `group`,
// q of keys.dim floats. `scores` is scratch. Deterministic (sequential; callers split work over
// (b, group) only). Unchecked: callers validated the shapes.
void learned_page_masses(const kv::KeyRowsView& keys, const kv::PageTable& table, int b, int group,
                         const float* q, std::vector<double>& scores, std::span<double> out);

}  // namespace masskv::select::detail
