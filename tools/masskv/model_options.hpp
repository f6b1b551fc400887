// Options shared by the commands that run a GGUF model (run, perplexity, bench): the model, the
// threads and the decode selector, in llama.cpp's option conventions.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "masskv/learn/selector.hpp"
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
  int candidate_factor = 8;  // two_stage: candidate pages per budget page
  int page_size = 16;
  int reselect_every = 1;         // decode steps one selection serves (SessionOptions)
  double reselect_cos = -1;       // ... unless a query turns past this cosine
  std::string entmax_conversion;  // a `masskv convert` file: run the converted entmax model
};

// Which of the shared options a command registers itself instead (bench: several -m, a list
// of -t).
struct OwnOptions {
  bool model = false;
  bool threads = false;
};
// Registers -m, -t (unless the command owns them), --selector, --budget, --budget-min,
// --selector-file, --selector-key-format, --sink-pages, --window, --top-p-mass, --candidates,
// --page, --reselect-every, --reselect-cos, --entmax-conversion.
void add_model_options(CLI::App* app, ModelOptions& o, OwnOptions own = {});
// The options of the model commands that eval shares (one definition each); help texts where
// eval's reading differs.
CLI::Option* add_selector_file(CLI::App* app, std::string& file, const std::string& help);
CLI::Option* add_selector_key_format(CLI::App* app, std::string& format);
CLI::Option* add_candidates(CLI::App* app, int& factor);
CLI::Option* add_entmax_conversion(CLI::App* app, std::string& file, const std::string& help);
// The attention of the sessions: softmax (the model as trained), or with --entmax-conversion
// the converted entmax model (mapping entmax(α) + the per-head temperatures), the file checked
// against `model` (errors name --entmax-conversion). Returns the label of that attention for
// tables: "softmax", "converted entmax1.5", or "entmax1.5, t = 1 (unconverted)" for a
// `masskv convert --identity` file. Call it before apply_selector.
std::string set_attention(const ModelOptions& o, const model::Model& model,
                          model::SessionOptions& so);
// Every check of the options that needs no model: ranges (CLI11 validators, checks.hpp, at
// parse time) and here the combinations (selector and budget, selector files, entmax-only
// selectors without --entmax-conversion), with budgets as fractions of `context`. Commands call
// it first, before loading the model, so nothing is refused after a prefill. Throws Error naming
// the option.
void validate(const ModelOptions& o, std::int64_t context);
// nullopt for dense; the budget is relative to `context` when given as a fraction. The
// selector serves `mapping` (the session's); entmax_support needs entmax, and under entmax
// entmax_support and gaussian_tau stop by their own rule with the budget as a cap (as the eval).
std::optional<select::SelectorConfig> selector_config(const ModelOptions& o, std::int64_t context,
                                                      const Mapping& mapping);
// The selector of --selector / --budget (serving so.mapping) into `so`, and for --selector learned
// the selector of
// --selector-file (loaded once, checked against the model when the session is made) and the
// format of its key cache. Throws Error naming the option.
void apply_selector(const ModelOptions& o, std::int64_t context, model::SessionOptions& so);
// The selector of a `masskv distill` file, loaded once per path for the process.
std::shared_ptr<const learn::Selector> load_selector(const std::string& path);
// Label of the selector and budget for tables: "dense", "quest 512", "learned p0.9:512",
// "quest 512 @8" (--reselect-every 8).
std::string selector_label(const ModelOptions& o, const std::optional<select::SelectorConfig>& c);
// OpenMP threads for what follows (0 keeps OpenMP's default).
void set_threads(int threads);
// Session::prefill with a progress bar named `label` (long prompts take minutes).
void prefill_with_progress(model::Session& session, std::span<const model::TokenId> tokens,
                           std::span<float> logits_last, const std::string& label);
// Seconds since t0 on the steady clock.
double seconds_since(std::chrono::steady_clock::time_point t0);

}  // namespace masskv::cli
