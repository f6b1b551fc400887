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
  std::string budget = "1024";  // tokens (K suffix), a fraction of the context, or pP[:CAP]
  std::string budget_min;       // top-p budgets: K_min (tokens or a fraction); empty: none
  std::string selector_file;    // --selector learned: the selector (learn::load)
  std::string selector_key_format = "f32";
  int sink_pages = 1;
  int window = 64;
  double top_p_mass = 0.95;
  int page_size = 16;
};

// Registers -m, -t (unless with_threads is false), --selector, --budget, --budget-min,
// --selector-file, --selector-key-format, --sink-pages, --window, --top-p-mass, --page.
void add_model_options(CLI::App* app, ModelOptions& o, bool with_threads = true);
// nullopt for dense; the budget is relative to `context` when given as a fraction.
std::optional<select::SelectorConfig> selector_config(const ModelOptions& o, std::int64_t context);
// The selector of --selector / --budget into `so`, and for --selector learned the selector of
// --selector-file (loaded once, checked against the model when the session is made) and the
// format of its key cache. Throws Error naming the option.
void apply_selector(const ModelOptions& o, std::int64_t context, model::SessionOptions& so);
// Label of the selector and budget for tables: "dense", "quest 512", "learned p0.9:512".
std::string selector_label(const ModelOptions& o, const std::optional<select::SelectorConfig>& c);
// OpenMP threads for what follows (0 keeps OpenMP's default).
void set_threads(int threads);
// Session::prefill with a progress bar named `label` (long prompts take minutes).
void prefill_with_progress(model::Session& session, std::span<const model::TokenId> tokens,
                           std::span<float> logits_last, const std::string& label);
// Seconds since t0 on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t0);

}  // namespace masskv::cli
