// Forward pass of the two model families masskv is tested with, on the CPU, with the KV cache
// in one kv::PagedKVCache per layer and attention through the masskv kernels:
//   llama   (SmolLM2): RMSNorm, RoPE (adjacent pairs, as llama.cpp's converter permutes Q/K),
//           GQA attention, SiLU-gated FFN, tied or separate output head.
//   gemma3  (Gemma 3): embeddings scaled by sqrt(n_embd); sliding-window local layers and
//           global layers (every 6th layer global, llama.cpp's and HF's rule; window from
//           gemma3.attention.sliding_window); QK-norm; RoPE in NeoX halves with base 10000 on
//           local layers (gemma3.rope.freq_base_swa when present) and gemma3.rope.freq_base on
//           global ones; post-attention and post-FFN norms; GELU(tanh)-gated FFN. The GGUF
//           converter stores Gemma's norm weights as (1 + w), so every norm is x * w here.
// Every hyperparameter comes from the GGUF metadata; a missing or inconsistent key or tensor
// shape throws masskv::Error naming it.
//
// Sparse attention is pluggable at decode: with SessionOptions::selector set, every layer that
// may use it (all llama layers; gemma3's global layers, local layers keep their window) runs
// select::run_selector on the step's queries and attends over the selection only. Prefill is
// dense (causal; windowed on local layers) unless SessionOptions::sparse_prefill picks keys
// per query block (select/prefill_select.hpp, docs/prefill.md) on the layers that may use it
// (all llama layers; gemma3's global layers, local layers keep their window).
// SessionOptions::mapping swaps the attention mapping of every layer (prefill and decode) for
// α-entmax: the models are trained with softmax, so alone that is "entmax mapping on a
// softmax-trained model"; with the per-head temperatures of an entmax conversion
// (SessionOptions::score_multipliers, learn/conversion.hpp, docs/design.md §2.10) it is the
// "converted entmax" model. Reports must label which.
//
// A learned selector (SessionOptions::learned_selector, docs/design.md §2.8) adds a selector key
// cache: for every layer it lists (gemma3's local layers excepted: they keep their window),
// the projected keys W_k x_k,t of every token, appended with the KV at prefill and decode (in
// the KV's pages: forks share them copy-on-write). A decode step under Method::learned (or learned_codes) projects
// its query, scores every cached token, and selects pages by softmax(ŝ) mass (select::
// run_selector); layers the selector does not list decode densely (counted as dense reads).
//
// decode_batch steps several sessions (forks, other selectors, other positions) through one
// forward pass: the weights are read once per step instead of once per session.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "masskv/dtype.hpp"
#include "masskv/kv/key_rows.hpp"
#include "masskv/model/gguf.hpp"
#include "masskv/model/learned_selector.hpp"
#include "masskv/model/tokenizer.hpp"
#include "masskv/select/prefill_select.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::model {

enum class Arch { llama, gemma3 };
std::string_view to_string(Arch arch) noexcept;

struct ModelConfig {
  Arch arch = Arch::llama;
  int n_layer = 0, n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  int n_vocab = 0;
  int n_ctx_train = 0;
  float rms_eps = 1e-5f;
  int rope_dims = 0;                   // leading dims of each head that rotate
  bool rope_neox = false;              // pairs (i, i + rope_dims/2) instead of (2i, 2i+1)
  double rope_base = 10000;            // global layers (all layers for llama)
  double rope_base_local = 10000;      // gemma3 sliding-window layers
  double rope_freq_scale = 1;          // linear scaling on global layers (1 / rope.scaling.factor)
  int sliding_window = 0;              // gemma3: tokens a local layer sees (itself included)
  std::vector<std::uint8_t> is_local;  // [n_layer]: 1 = sliding-window layer
  float attn_scale = 0;                // score scale (1/sqrt(query_pre_attn_scalar or head_dim))
  float embd_scale = 1;                // gemma3: sqrt(n_embd)
  float final_softcap = 0;             // tanh soft-capping of the logits; 0 = none
  bool qk_norm = false;
  bool post_norms = false;  // gemma3's post-attention / post-FFN norms
  bool gelu_ffn = false;    // GELU(tanh) gate instead of SiLU

  // Throws Error(unsupported, "general.architecture") for other architectures.
  static ModelConfig from_gguf(const GgufFile& file);
};

// Weights of one layer, pointing into the mapped file.
struct LayerWeights {
  const GgufTensor* attn_norm = nullptr;
  const GgufTensor* wq = nullptr;
  const GgufTensor* wk = nullptr;
  const GgufTensor* wv = nullptr;
  const GgufTensor* wo = nullptr;
  const GgufTensor* q_norm = nullptr;          // gemma3
  const GgufTensor* k_norm = nullptr;          // gemma3
  const GgufTensor* post_attn_norm = nullptr;  // gemma3
  const GgufTensor* ffn_norm = nullptr;
  const GgufTensor* ffn_gate = nullptr;
  const GgufTensor* ffn_up = nullptr;
  const GgufTensor* ffn_down = nullptr;
  const GgufTensor* post_ffn_norm = nullptr;  // gemma3
};

class Model {
 public:
  // Opens (maps) the GGUF file, reads the config, checks every tensor's type and shape, and
  // builds the tokenizer. Throws masskv::Error.
  static std::unique_ptr<Model> load(const std::string& path);

  const ModelConfig& config() const noexcept { return config_; }
  const Tokenizer& tokenizer() const noexcept { return *tokenizer_; }
  const GgufFile& file() const noexcept { return file_; }
  const std::string& path() const noexcept { return path_; }
  const LayerWeights& layer(int i) const { return layers_.at(static_cast<std::size_t>(i)); }
  const GgufTensor& token_embd() const noexcept { return *token_embd_; }
  const GgufTensor& output_norm() const noexcept { return *output_norm_; }
  const GgufTensor& output() const noexcept { return *output_; }  // token_embd when tied
  // Norm weights as f32 (F32 tensors are used in place; others dequantised once at load).
  const float* norm_weights(const GgufTensor& t) const;
  // Bytes of weights one decode step reads (every layer matrix, the head, one embedding row).
  double weight_bytes_per_token() const noexcept { return weight_bytes_per_token_; }

 private:
  Model(GgufFile file, std::string path);
  // Keeps a float copy of norm weights that cannot be read in place (not f32, or not aligned).
  void keep_norm(const GgufTensor& t);
  GgufFile file_;
  std::string path_;
  ModelConfig config_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::vector<LayerWeights> layers_;
  const GgufTensor* token_embd_ = nullptr;
  const GgufTensor* output_norm_ = nullptr;
  const GgufTensor* output_ = nullptr;
  std::vector<std::pair<const GgufTensor*, std::vector<float>>> dequantised_norms_;
  double weight_bytes_per_token_ = 0;
};

// What SessionOptions::capture sees of one layer for a block of n tokens at positions
// pos0 .. pos0+n-1: q [n][n_head][head_dim] and k [n][n_head_kv][head_dim] after QK-norm,
// RoPE and the score multipliers (what attention scores: q·k × ModelConfig::attn_scale),
// v [n][n_head_kv][head_dim], and x [n][n_embd], the layer's attention input after the
// attention norm (what the q/k/v projections read; the input of a `hidden` learned selector,
// learn/selector.hpp). All are views of the pass's own buffers, valid during the call:
// capturing copies nothing it is not asked to.
struct LayerCapture {
  int layer = 0;
  std::int64_t pos0 = 0;
  int n = 0;
  std::span<const float> q, k, v;
  std::span<const float> x;
};

// SessionOptions::selection_timing.
enum class SelectionTiming { fresh, previous, union_previous };
std::string_view to_string(SelectionTiming t) noexcept;

struct SessionOptions {
  std::int64_t max_tokens = 4096;  // KV capacity per layer, in tokens (> 0)
  int page_size = 16;
  DType kv_dtype = DType::f16;
  // Decode selection on the layers that allow it (see the file comment); nullopt = dense.
  // Its mapping must equal `mapping`.
  std::optional<select::SelectorConfig> selector;
  // Decode steps one selection serves, per layer (>= 1). 1: select at every step. R > 1: a
  // layer selects, then reuses that selection for the next R − 1 steps, with the pages
  // appended since added (select::extend_kept) — the selector's cost paid once every R steps,
  // the quality cost measured by `masskv reuse` and `masskv eval` (method@R). A prefill, or
  // any append of more than one token, makes the next step select again; so does
  // set_selector. Forks keep the parent's selections.
  int reselect_every = 1;
  // With reselect_every > 1, a layer also selects again when a q head's query turned away
  // from the one the selection was made for: cos(q, q_selected) < reselect_cos for any q
  // head (in [-1, 1]; -1: only every reselect_every steps).
  double reselect_cos = -1;
  // Which selection a decode step attends (reselect_every 1 only; issue 33's question of
  // taking selection off a GPU step's critical path, docs/gpu.md): `fresh`, the one its own
  // query makes; `previous`, the one the layer made at the step before (with the pages
  // appended since, select::extend_kept), so that a GPU could select for the next step while
  // this one attends; `union_previous`, both (the previous pages attended while this step's
  // selection runs, then only the new ones). Every step still runs the selector. The first
  // step after a prefill (or a set_selector / set_reselect) has no previous: it attends fresh.
  SelectionTiming selection_timing = SelectionTiming::fresh;
  // The learned selector whose key cache the session keeps from its first token (so forks can
  // decode with Method::learned or learned_codes; set_selector may switch to it later).
  // Checked against the model: Error(invalid_argument, "selector"). Null: no key cache, those
  // methods refused.
  std::shared_ptr<const learn::Selector> learned_selector;
  kv::RowFormat learned_key_format = kv::RowFormat::f32;  // row format of that key cache
  Mapping mapping = Mapping::softmax();                   // attention mapping of every layer
  // Per (layer, q head) score multiplier t, [n_layer][n_head] row-major (an entmax conversion's
  // temperatures, docs/design.md §2.10): head h of layer l scores t·q·k × attn_scale. Applied by
  // scaling the head's q before anything reads it, so the selectors, kernels, certificates,
  // δ bounds, forks and decode_batch all see the converted scores. Empty: every t = 1 (the
  // same bits as before). Each t must be finite and > 0.
  std::vector<float> score_multipliers;
  // Per decode step, the certified δ bound of every selected head (select::diagnose, no
  // unselected key read) into DecodeStats; costs about one more bound pass per layer.
  bool diagnostics = false;
  // Extra pages in each layer's pool for sessions forked from this one (each fork copies the
  // partial last page on its first append and then needs pages for what it appends).
  int fork_pages = 0;
  // Keep 2-bit page codes of every key (kv/page_codes.hpp) from the first token, so that this
  // session or its forks can select with Method::two_stage (set_selector refuses it otherwise).
  // A session created with a two_stage selector keeps them anyway. Costs head_dim / 4 bytes per
  // token and kv head, and O(page_size · head_dim) per append when a page's range moves.
  bool page_codes = false;
  int prefill_block = 64;  // tokens per prefill step (weight rows reused across them)
  // Sparse prefill (select/prefill_select.hpp): per prefill step and layer the keys each query
  // block attends (oracles: token, block, shared; the mean-pooled indexer: index). method
  // dense = off. Softmax only. Decode is not affected (forks keep the setting, unused).
  select::PrefillSelectConfig sparse_prefill;
  // Activations of decode's mat-vecs (quant.hpp): q8 quantises them per mat-vec and runs
  // integer dot products (llama.cpp's scheme, the faster decode); f32 keeps them f32 like
  // prefill's matmul, so decode and prefill compute one function up to f32 rounding.
  Activations decode_activations = Activations::q8;
  // Sliding window of the local layers: 0 = the model's; > 0 overrides it (tests exercise the
  // window on short sequences this way).
  int sliding_window = 0;
  // Called for every layer of every prefill block and decode step, before attention (for
  // `masskv dump`: real q/k/v for `masskv study`). Empty: nothing called.
  std::function<void(const LayerCapture&)> capture;
  // Called at every decode step for every layer that ran the selector, with the selection
  // attention used (tests and studies: which pages a selector chose). Empty: nothing called.
  std::function<void(int layer, const SelectionView&)> on_selection;
};

// Per-step counters for reports (bench, run --verbose).
struct DecodeStats {
  double kv_tokens_read = 0;   // KV rows read by attention, summed over layers and kv heads
  double kv_tokens_total = 0;  // what dense attention would have read
  // With SessionOptions::diagnostics, over the q heads of the layers that ran the selector:
  double delta_bound_sum = 0;  // Σ certified δ upper bounds (§2.5)
  double heads = 0;            // heads diagnosed
  double certified = 0;        // heads whose selection is certified exact (§2.2)
  // Wall time of this session's attention in the step (selection, diagnostics, kernel), all
  // layers: in a batched step the rest of the time is shared by the rows, this is not.
  double attention_seconds = 0;
  // Layers that ran the selector this step (selector_layers) and of those, the ones that
  // selected rather than reused a selection (SessionOptions::reselect_every).
  double selector_layers = 0, fresh_selections = 0;
  // What the selectors read besides the selected rows (select/read_cost.hpp), in units of one
  // dense f16 K+V row: compare with kv_tokens_total. A reused selection reads nothing.
  double selector_rows = 0;
};

// Counters of the last Session::prefill call (bench, eval): attention over all layers.
struct PrefillStats {
  double keys_attended = 0;      // (query, key) pairs attended, all layers, mean over kv heads
  double keys_dense = 0;         // what dense (windowed on local layers) attention attends
  double attention_seconds = 0;  // attention of all layers, selection included
  double select_seconds = 0;     // of which: selection (dense probabilities, choices, indexer)
  double seconds = 0;            // the whole call
};

class Session;

// One decode step of several sessions in one forward pass: row i is tokens[i] appended to
// sessions[i] at that session's own position. The linear layers run once over all B rows (the
// prefill GEMM instead of B mat-vecs: the weights are read once per step, not B times); RoPE,
// the K/V append and attention are each row's own, exactly as Session::decode: its caches, its
// selector and mapping, its diagnostics, its sliding window, its last_decode_stats(). logits
// gets [B][n_vocab], row-major. Sessions may be forks of one another and sit at different
// positions; they must run the same Model, be distinct and not run concurrently elsewhere.
// The logits equal each session's own decode() up to the GEMM's f32 summation order (the same
// bits for a row whatever B > 1 is; against decode()'s mat-vec see docs/model.md). B = 1 is
// Session::decode. Throws before anything is appended: Error(invalid_argument, "sessions")
// for an empty batch, a null, moved-from or repeated session, or another model;
// Error(shape_mismatch, "tokens"/"logits") for sizes; Error(out_of_range, "tokens") for an id
// outside the vocabulary or a full session; Error(out_of_memory, "fork_pages") when a shared
// pool cannot hold the rows of the sessions that use it.
void decode_batch(std::span<Session* const> sessions, std::span<const TokenId> tokens,
                  std::span<float> logits);

// One sequence being generated. Not thread-safe; the kernels inside use OpenMP.
class Session {
 public:
  Session(const Model& model, SessionOptions options);
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // A session continuing from this one's state that shares its KV pages copy-on-write (the
  // pool of SessionOptions::fork_pages): prefill a prompt once, then decode different
  // continuations (or selectors: see set_selector) from it. Parent and forks must not run
  // concurrently (they share the pool); either may be destroyed first.
  Session fork() const;
  // Replaces the decode selector (nullopt = dense). Throws like the constructor.
  void set_selector(std::optional<select::SelectorConfig> selector);
  // Replaces SessionOptions::reselect_every, reselect_cos and selection_timing (checked as the
  // constructor); the next step of every layer selects again.
  void set_reselect(int every, double min_cos = -1,
                    SelectionTiming timing = SelectionTiming::fresh);

  const Model& model() const noexcept { return *model_; }
  std::int64_t position() const noexcept { return position_; }

  // Appends `tokens` (dense causal attention) in blocks of prefill_block. logits_last gets the
  // logits after the last token (n_vocab; may be empty to skip the head). When all_logits is
  // set it receives [tokens.size()][n_vocab]. progress(done, total) is called per block.
  // Throws Error(out_of_range, "tokens") when the cache capacity would be exceeded and
  // Error(out_of_range, "tokens") for an id outside the vocabulary (nothing appended then).
  void prefill(std::span<const TokenId> tokens, std::span<float> logits_last,
               std::vector<float>* all_logits = nullptr,
               const std::function<void(std::int64_t, std::int64_t)>& progress = {});
  // One token through the decode path (selector applied), logits into `logits` (n_vocab).
  // decode_batch of this session alone.
  void decode(TokenId token, std::span<float> logits);

  const DecodeStats& last_decode_stats() const noexcept { return stats_; }
  const PrefillStats& last_prefill_stats() const noexcept;
  struct Impl;  // opaque: caches and scratch (model.cpp)
  // KV + summary (+ learned selector key) bytes currently held, all layers.
  double kv_bytes() const;
  double kv_bytes_per_token() const;  // KV bytes per stored token, all layers
  double summary_bytes_per_token() const;
  double learned_key_bytes_per_token() const;  // the learned selector's key cache, all layers

 private:
  friend void decode_batch(std::span<Session* const>, std::span<const TokenId>, std::span<float>);
  Session(const Model& model, std::unique_ptr<Impl> impl, std::int64_t position);
  void release() noexcept;  // frees this session's sequences in the shared pools
  const Model* model_;
  std::unique_ptr<Impl> impl_;
  std::int64_t position_ = 0;
  DecodeStats stats_;
};

// Token choice from logits (llama.cpp's sampler order: top-k, then top-p, then temperature).
struct SamplerConfig {
  float temperature = 0;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 40;         // <= 0: whole vocabulary
  float top_p = 0.95f;    // 1: off
  std::uint64_t seed = 0;
};

class Sampler {
 public:
  // Throws Error(invalid_argument, "temperature"/"top_p") for non-finite or out-of-range values.
  explicit Sampler(SamplerConfig config);
  TokenId sample(std::span<const float> logits);

 private:
  double uniform();  // [0, 1) from the seeded generator, same on every platform
  SamplerConfig config_;
  std::uint64_t state_;
  std::vector<std::pair<float, TokenId>> scratch_;
};

TokenId argmax(std::span<const float> logits);

}  // namespace masskv::model
