// Entmax conversion of a softmax-trained model (docs/design.md §2.10): per layer and q head a
// temperature t such that entmax_α(t·s) stands in for the model's softmax(s). With it the
// model runs α-entmax attention (SessionOptions::mapping + ::score_multipliers) and the §2.2
// certificate makes sparse decoding exact against this converted model.
//
// Fitting (`masskv convert`, src/learn/entmax_fit.cpp):
//   1. the frozen softmax model prefills calibration chunks; its scores s = attn_scale·q·k of
//      sampled queries over their causal (windowed) keys are kept per (layer, q head);
//   2. per head, a 1-D search over log t minimises a finite proxy averaged over those rows:
//      KL(entmax_α(t s) ‖ softmax(s)), or the entmax Fenchel–Young loss L(t s; softmax(s))
//      (KL(softmax ‖ entmax) is +∞ wherever entmax is 0: never used);
//   3. the real objective, the next-token KL(original ‖ converted) on the calibration chunks,
//      picks the proxy and one global multiplier g on every t (t_h ← g·t_h), per α.
// Everything is deterministic: heads fit in parallel, each head's sums in row order.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "masskv/model/model.hpp"

namespace masskv::learn {

// ---- the conversion and its file ----------------------------------------------------------

struct EntmaxConversion {
  double alpha = 1.5;
  // The model it was fitted on (GGUF general.architecture, block count, n_embd, n_head,
  // n_head_kv, head_dim; general.name when the model has one).
  std::string architecture, model_name;
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  std::vector<float> temperature;  // [n_layer][n_head]: head h of layer l scores t·s
  // Provenance (informative): the proxy and global multiplier chosen, the calibration tokens,
  // and the next-token KL(original ‖ converted) measured on them.
  std::string proxy;
  double global_scale = 1;
  std::int64_t calibration_tokens = 0;
  double calibration_kl = std::numeric_limits<double>::quiet_NaN();
  // FNV-1a 64 of the file's bytes, set by load_conversion (0 otherwise): identifies the file
  // in result caches (the eval's key).
  std::uint64_t file_hash = 0;

  // The model's identity fields and t = 1 on every head, proxy "identity": plain α-entmax on
  // the softmax-trained model (the unconverted reference), and the start of every fit.
  static EntmaxConversion identity(const model::Model& model, double alpha);
  // Shapes agree, α in (1, 2], every t finite and > 0; throws Error(invalid_argument, "conversion").
  void validate() const;
  // Throws Error(invalid_argument, option) when `model` is not the model it was fitted on.
  void check_model(const model::Model& model, std::string_view option) const;
  // Sets options.mapping = entmax(α) and options.score_multipliers = temperature.
  void apply(model::SessionOptions& options) const;
};

// A small GGUF (general.architecture = "masskv-entmax"; docs/learned.md lists the keys):
// readable by any GGUF tool. Throws Error(io, "path") for I/O and Error(invalid_argument, "path")
// for a malformed file.
void save(const EntmaxConversion& conversion, const std::string& path);
EntmaxConversion load_conversion(const std::string& path);

// ---- fitting --------------------------------------------------------------------------------

enum class Proxy { kl, fenchel_young };
std::string_view to_string(Proxy proxy);

// Entmax Fenchel–Young loss L(θ; y) = ⟨θ, p − y⟩ + H(p) − H(y), p = entmax_α(θ), with the
// Tsallis entropy H(p) = (1 − Σ p_i^α) / (α(α − 1)) whose regularised argmax is masskv's
// entmax (docs/design.md §2.1; Blondel et al. 2020, Peters et al. 2019). ≥ 0, 0 iff y = p, finite
// for any distribution y, convex in θ (so in t for θ = t·s), gradient p − y.
double entmax_fenchel_young(std::span<const double> theta, std::span<const double> y,
                            double alpha);
// The proxy of one row of scores s (softmax target y = softmax(s)) at temperature t.
double proxy_loss(Proxy proxy, std::span<const double> scores, double alpha, double t);

// Minimises f on [lo, hi]: f at `grid` (>= 3) evenly spaced points, then golden-section search
// between the best grid point's neighbours down to width `tol`. Finds the minimum of a
// unimodal f whose basin is wider than the grid spacing; deterministic.
struct Minimum {
  double x = 0, f = 0;
  int evaluations = 0;
};
Minimum minimize_1d(const std::function<double(double)>& f, double lo, double hi, int grid,
                    double tol);

// The model's scores of sampled queries: per (layer, q head), rows of s = attn_scale·q·k of
// one query over its causal keys (the window on sliding-window layers), each row sorted
// descending (the proxies do not depend on the order).
struct ScoreRows {
  std::vector<float> values;
  std::vector<std::size_t> begin = {0};  // row r is values[begin[r], begin[r+1])
  std::size_t rows() const { return begin.size() - 1; }
  std::span<const float> row(std::size_t r) const {
    return {values.data() + begin[r], begin[r + 1] - begin[r]};
  }
  void add_row(std::span<const double> scores);  // sorts a copy descending
};
struct CalibrationScores {
  int n_layer = 0, n_head = 0;
  std::vector<ScoreRows> heads;  // [n_layer][n_head]
};

// (phase, done, total): long steps report here (the CLI draws a bar per phase).
using FitProgress = std::function<void(std::string_view, std::int64_t, std::int64_t)>;

// Prefills each chunk (its own session, softmax, as the model was trained) and keeps the rows
// of `queries_per_chunk` query positions spread evenly over the chunk (the last one included).
CalibrationScores collect_scores(const model::Model& model,
                                 std::span<const std::vector<model::TokenId>> chunks,
                                 int queries_per_chunk, const FitProgress& progress = {});

// Mean proxy of one head's rows at temperature t (sum in row order).
double mean_proxy(const ScoreRows& rows, Proxy proxy, double alpha, double t);
// Mean over rows of the fraction of scores in entmax_α(t·s)'s support (the converted head's
// sparsity on the calibration rows).
double support_fraction(const ScoreRows& rows, double alpha, double t);
// Per head, the t in [2^-8, 2^8] minimising mean_proxy (minimize_1d over log t); [n_layer][n_head].
std::vector<float> fit_temperatures(const CalibrationScores& scores, double alpha, Proxy proxy,
                                    const FitProgress& progress = {});

// The real objective: mean next-token KL(original ‖ converted) in nats over the second half of
// every chunk (each scored token sees at least half a chunk, as `masskv perplexity`). The
// original model's log-probabilities are computed once and kept in f32 for at most
// `max_bytes` (every k-th scored position beyond that).
class NextTokenKl {
 public:
  NextTokenKl(const model::Model& model, std::vector<std::vector<model::TokenId>> chunks,
              std::size_t max_bytes = std::size_t{256} << 20, const FitProgress& progress = {});
  // `converted` gives the mapping and multipliers (its other fields are ignored).
  double operator()(const model::SessionOptions& converted, const FitProgress& progress = {}) const;
  std::int64_t positions() const { return static_cast<std::int64_t>(where_.size()); }

 private:
  struct Where {
    std::size_t chunk, pos;
  };
  const model::Model* model_;
  std::vector<std::vector<model::TokenId>> chunks_;
  std::vector<Where> where_;         // scored positions kept, in chunk and position order
  std::vector<float> log_probs_;     // [positions][n_vocab] of the original model
};

struct ConvertOptions {
  std::vector<double> alphas = {1.5};
  std::vector<Proxy> proxies = {Proxy::kl, Proxy::fenchel_young};
  // Global multipliers tried on the better proxy's t (1 is always tried first).
  std::vector<double> global_scales = {0.7, 0.85, 1.2, 1.4};
  int queries_per_chunk = 64;
  std::size_t kl_max_bytes = std::size_t{256} << 20;
};
struct ConvertTrial {
  double alpha = 0;
  Proxy proxy = Proxy::kl;
  double global_scale = 1;
  double kl = 0;  // next-token KL(original ‖ converted) on the calibration chunks
};
struct ConvertResult {
  EntmaxConversion conversion;     // the trial with the lowest KL
  std::vector<ConvertTrial> trials;  // every trial, in the order run
  double unconverted_kl = 0;       // t = 1 at the chosen α, for reference
  // Mean over heads of support_fraction on the calibration rows: converted and at t = 1.
  double support = 0, unconverted_support = 0;
};
// Throws Error(invalid_argument, "chunks") when there are none or one has < 16 tokens,
// Error(invalid_argument, "alpha") for α outside (1, 2], Error(invalid_argument,
// "global_scales") for a non-positive multiplier.
ConvertResult convert(const model::Model& model, std::span<const std::vector<model::TokenId>> chunks,
                      const ConvertOptions& options, const FitProgress& progress = {});

}  // namespace masskv::learn
