// The learned selector at inference (docs/design.md §2.8): its projections of the query side and
// the key side, shared by the decode path (model::Session's selector key cache) and anything that
// scores with a selector. learn/selector.hpp says what x_q and x_k are for each input kind.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/learn/selector.hpp"
#include "masskv/model/model.hpp"

namespace masskv::learn {

// Throws Error(invalid_argument, "selector") unless the selector is valid and was distilled on a
// model of this architecture and shape (layers, n_embd, heads, kv heads, head_dim).
void check_model(const Selector& selector, const model::ModelConfig& config);

// RoPE of a `rope` selector's d_s projections at layer `layer`: the model's frequencies for that
// layer (global: rope_base and rope_freq_scale; gemma3's local layers: rope_base_local) spread
// over d_s dims, inv_freq[j] = scale * base^(-2j / d_s), rotating adjacent pairs (2j, 2j+1).
std::vector<double> rope_inv_freq(const model::ModelConfig& config, int layer, int dim);

enum class Side { query, key };

// out[t][g][d_s] = W_side[g] x_t^(g) for n rows, then RoPE at positions[t] when layer.rope.
// x rows: qk input, query side: the q heads [n][n_head][head_dim] (group g takes its heads);
// qk input, key side: the k heads [n][n_head_kv][head_dim]; hidden input: the attention input
// [n][n_embd] (every group reads all of it). One row: f32 mat-vec; more: the prefill GEMM
// (model/quant.hpp; both within 1e-5 * Σ|w x| of fp64). `scratch` is reused between calls.
void project(const Selector& selector, const LayerSelector& layer, Side side, const float* x,
             std::size_t n, std::span<const std::int64_t> positions,
             const std::vector<double>& inv_freq, float* out, std::vector<float>& scratch);

}  // namespace masskv::learn
