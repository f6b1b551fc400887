// Selectors built without training (docs/design.md §2.8), for tests, baselines and measurements of
// the decode path before a distilled selector exists (`masskv selector init`).
#pragma once

#include <cstdint>
#include <span>

#include "masskv/learn/selector.hpp"
#include "masskv/model/model.hpp"

namespace masskv::learn {

// The analytic qk selector whose score is the mean of the model's own attention scores over
// the q heads it serves: ŝ_t = mean_h scale · q_h · k_{kv(h),t}, over all heads (groups == 1,
// d_s = n_head_kv · head_dim) or over each kv group's heads (groups == n_head_kv,
// d_s = head_dim). W_k = I; W_q averages the heads sharing a kv head. `layers` empty: all.
// Throws Error(invalid_argument, "groups"/"layers").
Selector mean_score_selector(const model::ModelConfig& config, int groups,
                             std::span<const int> layers = {});

// Weights uniform in ±sqrt(3 / width) (unit variance of a projection of unit-variance
// inputs) from a SplitMix64 stream of `seed`: the same selector on every platform.
Selector random_selector(const model::ModelConfig& config, Input input, int groups, int dim,
                         bool rope, std::uint64_t seed, std::span<const int> layers = {});

}  // namespace masskv::learn
