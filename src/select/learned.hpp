// A learned selector's scores (docs/design.md §2.8): ŝ_t = q · k_t on the selector key rows,
// and their page masses (softmax over every cached token, summed per page). Used by the
// learned scorer (scorers/learned.cpp) and learned_codes' first pass (scorers/page_codes.cpp);
// the tests' reference is their own f64 loop.
#pragma once

#include "masskv/select/selector.hpp"

namespace masskv::select::detail {

// Throws Error naming the argument unless SelectArgs::learned_keys and learned_q are present,
// fit the cache's pool and batch, and the query is finite.
void check_learned_args(const SelectArgs& a);

struct Context;  // select/group.hpp
struct Group;

// What a learned scorer's prepare keeps in Context::prepared[b], [selector groups][items]:
// the page masses of softmax(ŝ) over every cached token (Method::learned), or ŝ of every token
// (learned_codes' first pass).
enum class LearnedItems { page_masses, token_scores };

// Fills Context::prepared with `items` for every sequence and selector group: one task per
// (sequence, group), sequential inside, so the result does not depend on the thread count; a
// head-collapsed selector (groups == 1) scores once for every kv head. Unchecked: the scorer's
// check ran (check_learned_args).
void prepare_learned(Context& X, LearnedItems items);
// Group G's row of Context::prepared (G.n items): its kv head's selector group, or group 0.
const double* learned_row(const Context& X, const Group& G);

}  // namespace masskv::select::detail
