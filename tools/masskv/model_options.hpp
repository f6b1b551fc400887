// Options shared by the commands that run a GGUF model (run, perplexity, bench): the model, the
// threads and the decode selector, in llama.cpp's option conventions.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "masskv/model/model.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::cli {

struct ModelOptions {
  std::string model = "smollm2";  // a known name or a path
  int threads = 0;                // 0: OpenMP's default
  std::string selector = "dense";
  std::string budget = "1024";  // tokens (K suffix allowed) or a fraction of the context
  int sink_pages = 1;
  int window = 64;
  double top_p_mass = 0.95;
  int page_size = 16;
  std::string entmax_conversion;  // a `masskv convert` file: run the converted entmax model
};

// Registers -m, -t (unless with_threads is false), --selector, --budget, --sink-pages, --window,
// --top-p-mass, --page, --entmax-conversion.
void add_model_options(CLI::App* app, ModelOptions& o, bool with_threads = true);
// The attention of the sessions: softmax (the model as trained), or with --entmax-conversion
// the converted entmax model (mapping entmax(α) + the per-head temperatures), the file checked
// against `model` (errors name --entmax-conversion). Returns the label of that attention for
// tables: "softmax", "converted entmax1.5", or "entmax1.5, t = 1 (unconverted)" for a
// `masskv convert --identity` file.
std::string set_attention(const ModelOptions& o, const model::Model& model,
                          model::SessionOptions& so);
// nullopt for dense; the budget is relative to `context` when given as a fraction. The
// selector serves `mapping` (the session's); entmax_support needs entmax, and under entmax
// entmax_support and gaussian_tau stop by their own rule with the budget as a cap (as the eval).
std::optional<select::SelectorConfig> selector_config(const ModelOptions& o, std::int64_t context,
                                                      const Mapping& mapping);
// OpenMP threads for what follows (0 keeps OpenMP's default).
void set_threads(int threads);
// Session::prefill with a progress bar named `label` (long prompts take minutes).
void prefill_with_progress(model::Session& session, std::span<const model::TokenId> tokens,
                           std::span<float> logits_last, const std::string& label);
// Seconds since t0 on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t0);

}  // namespace masskv::cli
