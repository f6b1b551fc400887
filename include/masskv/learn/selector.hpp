// Learned selectors (docs/design.md §2.8, §2.9): the data a distilled selector is made of, shared
// by the trainer (`masskv distill`, src/learn/) and the decode path that scores with it (the
// selector key cache in model::Session, `--selector learned --selector-file F`).
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

#include <string>
#include <vector>

namespace masskv::learn {

enum class Input { qk, hidden };

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

// A small GGUF (general.architecture = "masskv-selector"; docs/learned.md lists the keys and
// tensors): readable by any GGUF tool. Throws Error(io, "path") for I/O and Error(invalid_argument, "path") for a malformed file.
void save(const Selector& selector, const std::string& path);
Selector load(const std::string& path);

}  // namespace masskv::learn
