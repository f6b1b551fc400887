// The KL-distillation trainer of learned selectors (docs/design.md §2.8, docs/learned.md): per
// layer, W_q and W_k of ŝ_t = (W_q x_q) · (W_k x_k,t) are fitted on a layer's activation file
// (learn/activations.hpp) so that softmax(ŝ) over the causal prefix matches the frozen model's
// dense attention, by Adam on minibatches of query positions, with hand-written gradients:
//   loss = mean over queries and groups of KL(p ‖ softmax(ŝ)) = Σ p log p − Σ p ŝ + logsumexp ŝ
//   ∂loss/∂ŝ_t = softmax(ŝ)_t − p_t; ŝ_t = q'·k'_t with q' = R(pos) W_q x_q, k'_t = R(t) W_k x_k,t
//   (R = the selector's RoPE when rope is on, the identity otherwise), so
//   ∂/∂k'_t = (∂/∂ŝ_t) q', ∂/∂q' = Σ_t (∂/∂ŝ_t) k'_t, and back through R (a rotation: R(−pos))
//   to ∂W_q = Σ (∂/∂(W_q x_q)) x_qᵀ and ∂W_k = Σ_t (∂/∂(W_k x_k,t)) x_k,tᵀ.
// Every sum has one fixed order (OpenMP threads own disjoint outputs), so a run gives the same
// bits for any thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "masskv/learn/activations.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/model/model.hpp"

namespace masskv::learn {

// pca (qk input only): W_k = the top-dim principal directions of the training keys (centred:
// a constant score shift does not change softmax), W_q = those directions mapped through the
// model's own score, so ŝ starts as the mean over the selector's q heads of the model's logits
// restricted to the key subspace. random: N(0, σ²) entries scaled so ŝ has about unit spread.
enum class Init { pca, random };

struct TrainConfig {
  int dim = 32;  // d_s
  bool rope = false;  // hidden input only (selector.hpp)
  int steps = 300;
  double lr = 1e-3;         // Adam step size at the start (docs/learned.md: 3e-4..1e-3 fit best)
  double lr_final = 0.1;    // cosine decay to lr × lr_final at the last step
  int batch = 32;           // query positions per step
  Init init = Init::pca;
  int heldout = 1;          // the last `heldout` sequences of the file are held out
  int eval_every = 25;      // steps between held-out evaluations (the loss curve)
  std::uint64_t seed = 0;

  // Throws Error(invalid_argument) naming "dim", "steps", "lr", "lr_final", "batch",
  // "heldout", "eval_every" or "rope".
  void validate(Input input) const;
};

// How a layer's activation rows feed a selector (groups as in the file's targets).
struct Geometry {
  Input input = Input::qk;
  int groups = 1, dim = 32, q_in = 0, k_in = 0;
  int q_width = 0, k_width = 0;  // of the file's rows
  bool rope = false;
  double attn_scale = 1;   // the model's score scale (pca init)
  int heads_per_kv = 1;    // the model's n_head / n_head_kv (pca init)
  int head_dim = 0;
  std::vector<double> inv_freq;  // [dim / 2] when rope: learn::rope_inv_freq (project.hpp)
  std::vector<double> rope_cs;   // [position][dim / 2][cos, sin] up to the longest sequence

  const double* rope_table(std::int64_t pos) const;  // the row of `pos` in rope_cs
  // First column of group g's slice of an x_q / x_k row: its heads for qk per kv group; the
  // whole row otherwise.
  std::size_t q_offset(int g) const;
  std::size_t k_offset(int g) const;
};

// Throws Error(invalid_argument, "dim"/"rope") for a dim < 1, odd with rope, or rope on qk
// input; Error(invalid_argument, "data") when the file is not of this model.
Geometry make_geometry(const LayerActivations& data, const model::ModelConfig& config, int dim,
                       bool rope);

// W_q [groups][dim][q_in] and W_k [groups][dim][k_in], row-major (LayerSelector's layout).
template <class T>
struct Weights {
  std::vector<T> wq, wk;
};

// Mean over `queries` (indices into data.queries) and groups of KL(target ‖ softmax(ŝ)); with
// grad non-null also its gradient (resized). Computed in T (the f32 trainer, the f64 check).
template <class T>
double kl_loss(const LayerActivations& data, const Geometry& geo,
               std::span<const std::size_t> queries, const Weights<T>& w, Weights<T>* grad);

// Held-out measures over `queries`, means over (query, group):
struct Measures {
  double kl = 0;      // KL(target ‖ softmax(ŝ))
  double recall = 0;  // target mass in the selector's top pages (recall.hpp; pages ranked by
                      // their summed softmax(ŝ)); page size and budget of the file's header
  double quest = 0;   // the same for the Quest page bound (the file's quest masses)
  double oracle = 0;  // the same for the pages of most target mass (the best any selector can)
};
Measures evaluate(const LayerActivations& data, const Geometry& geo,
                  std::span<const std::size_t> queries, const Weights<float>& w);

// Throws Error(invalid_argument, "init") for pca on hidden input.
Weights<float> initial_weights(const LayerActivations& data, const Geometry& geo,
                               std::span<const std::size_t> train, Init init, std::uint64_t seed);

struct CurvePoint {
  int step = 0;
  double train_kl = 0;    // mean minibatch loss since the previous point (step 0: held-out)
  double heldout_kl = 0;
};

struct LayerReport {
  int layer = 0;
  std::size_t train_queries = 0, heldout_queries = 0;
  Measures init;    // the selector at its initialisation (cfg.init)
  Measures random;  // a random-init selector (Init::random, same seed)
  Measures trained;
  double seconds = 0;  // initialisation + training + evaluation
  std::vector<CurvePoint> curve;
};

// Fits one layer's selector. step_done(step, minibatch loss) after every step. Throws
// Error(invalid_argument, "heldout") when the split leaves no training or held-out query.
LayerSelector train_layer(const LayerActivations& data, const model::ModelConfig& config,
                          const TrainConfig& cfg, LayerReport& report,
                          const std::function<void(int, double)>& step_done = {});

// CLI values, errors naming `option`:
// "0-29", "3,5,7", "0-3,8" -> ascending distinct layers, each < n_layer.
std::vector<int> parse_layer_list(std::string_view text, int n_layer,
                                  std::string_view option = "--layers");
Input parse_input(std::string_view text, std::string_view option = "--input");
Init parse_init(std::string_view text, std::string_view option = "--init");
// "collapsed" -> 1, "kv" -> n_head_kv.
int parse_groups(std::string_view text, int n_head_kv, std::string_view option = "--groups");

}  // namespace masskv::learn
