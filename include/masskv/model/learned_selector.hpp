// Learned selectors at inference (docs/design.md §2.8, §2.9): the data a distilled selector is
// made of and its projections of the query side and the key side. The trainer (`masskv distill`,
// src/learn/) produces it; the decode path scores with it (the selector key cache of
// model::Session, `--selector learned --selector-file F`).
//
// It lives in model/ because the forward pass computes it (model's mat-vec, GEMM and RoPE), so
// model never includes learn/: learn/ (which runs the model to collect activations) includes
// model/, not the reverse. The namespace stays `learn`, the artifact's name in the CLI, Python
// and the trainer. Its file format is learn/selector.hpp's.
//
// One selector per chosen model layer. It projects the query side and the key side into d_s
// dims; ŝ_t = (W_q x_q) · (W_k x_k,t) estimates the log of the layer's attention over tokens t
// (softmax(ŝ) is trained to match the frozen model's dense attention by KL(p_dense ‖ softmax(ŝ))).
//   input = qk:     x_q = the q heads of the group after QK-norm and RoPE, concatenated
//                   ([heads_per_group · head_dim]); x_k = the group's k after RoPE ([head_dim]).
//                   Head-collapsed (groups == 1): all q heads and all kv heads concatenated.
//   input = hidden: x_q = x_k = the layer's attention input (after the attention norm, [n_embd]);
//                   `rope` applies the model's RoPE (this layer's base) to both projections,
//                   in adjacent pairs, so the selector sees relative position.
// groups == 1 is head-collapsed: one score per token, one selection for every kv head, target
// the mean over all q heads. groups == n_head_kv: a selector per kv group, target the mean over
// the group's q heads.
// The budget rule at decode is top-K ∧ top-p (§2.8): pages ranked by their summed softmax(ŝ)
// mass, the smallest prefix with mass >= p, clamped to [K_min, K_max] pages (plus the sinks,
// window and last page that every selection keeps).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace masskv::model {
struct ModelConfig;  // model.hpp, which includes this header for SessionOptions
}

namespace masskv::learn {

enum class Input { qk, hidden };
std::string_view to_string(Input input) noexcept;  // "qk", "hidden"

struct LayerSelector {
  int layer = 0;   // model layer index
  int groups = 1;  // 1 (head-collapsed) or the model's n_head_kv
  int dim = 32;    // d_s
  int q_in = 0;    // width of x_q
  int k_in = 0;    // width of x_k
  bool rope = false;
  std::vector<float> wq;  // [groups][dim][q_in], row-major
  std::vector<float> wk;  // [groups][dim][k_in]
};

struct Selector {
  Input input = Input::qk;
  // The model it was distilled on (GGUF general.architecture, block count, n_embd, n_head,
  // n_head_kv, head_dim): loading it for another model throws Error(invalid_argument, "selector").
  std::string architecture;
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  std::vector<LayerSelector> layers;  // ascending layer; layers not listed decode densely

  const LayerSelector* find(int layer) const;
  // Shapes agree with the header fields; throws Error(invalid_argument, "selector").
  void validate() const;
};

// Throws Error(invalid_argument, "selector") unless the selector is valid and was distilled on a
// model of this architecture and shape (layers, n_embd, heads, kv heads, head_dim).
void check_model(const Selector& selector, const model::ModelConfig& config);

// RoPE of a `rope` selector's d_s projections at layer `layer`: the model's frequencies for that
// layer (global: rope_base and rope_freq_scale; gemma3's local layers: rope_base_local) spread
// over d_s dims, inv_freq[j] = scale * base^(-2j / d_s), rotating adjacent pairs (2j, 2j+1).
std::vector<double> rope_inv_freq(const model::ModelConfig& config, int layer, int dim);

enum class Side { query, key };

// out[t][g][d_s] = W_side[g] x_t^(g) for n rows, then RoPE at positions[t] when layer.rope,
// then, when d_s % 32 == 0, the normalised Walsh-Hadamard transform of each 32-value block: an
// orthonormal map applied to both sides, so every score q_s · k_s is unchanged up to rounding,
// while an outlier dimension is spread over its block before the 4-bit key row formats
// quantise it with one scale per block (docs/design.md §2.9).
// x rows: qk input, query side: the q heads [n][n_head][head_dim] (group g takes its heads);
// qk input, key side: the k heads [n][n_head_kv][head_dim]; hidden input: the attention input
// [n][n_embd] (every group reads all of it). One row: f32 mat-vec; more: the prefill GEMM
// (model/quant.hpp; both within 1e-5 * Σ|w x| of fp64). `scratch` is reused between calls.
void project(const Selector& selector, const LayerSelector& layer, Side side, const float* x,
             std::size_t n, std::span<const std::int64_t> positions,
             const std::vector<double>& inv_freq, float* out, std::vector<float>& scratch);

}  // namespace masskv::learn
