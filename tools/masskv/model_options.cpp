#include "model_options.hpp"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

#include "checks.hpp"
#include "dialect.hpp"
#include "eval_rows.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/model/locate.hpp"
#include "parse.hpp"
#include "progress.hpp"

namespace masskv::cli {

CLI::Option* add_selector_file(CLI::App* app, std::string& file, const std::string& help) {
  return app->add_option("--selector-file", file, help);
}

CLI::Option* add_selector_key_format(CLI::App* app, std::string& format) {
  return app
      ->add_option("--selector-key-format", format,
                   "Storage of the learned selector's key cache: f32, bf16, int4, mxfp4, nvfp4 "
                   "or mxfp8 (docs/design.md §2.9; the block formats need d_s % 32 == 0, "
                   "nvfp4 % 16)")
      ->capture_default_str();
}

CLI::Option* add_candidates(CLI::App* app, int& factor) {
  return app
      ->add_option("--candidates", factor,
                   "two_stage: candidate pages (by the page bound) per page of the budget, whose "
                   "tokens are then ranked on 2-bit page codes")
      ->check(int_in(1, 1024))
      ->capture_default_str();
}

CLI::Option* add_entmax_conversion(CLI::App* app, std::string& file, const std::string& help) {
  return app->add_option("--entmax-conversion", file, help);
}

void add_model_options(CLI::App* app, ModelOptions& o, OwnOptions own) {
  if (!own.model) add_model(app, o.model);
  if (!own.threads) add_threads(app, o.threads);
  app->add_option("--selector", o.selector,
                  "Decode attention: dense, token_codes (every token on its 2-bit page code), "
                  "two_stage (candidate pages by the bound, then their tokens on the codes), "
                  "sink_recent, quest, top_p, gaussian_tau, oracle, "
                  "learned (with --selector-file) (gemma3: global layers only), "
                  "learned_codes (token_codes' second pass after the --selector-file "
                  "selector's ranking); modifiers as eval's --methods, e.g. token_codes+twopass")
      ->capture_default_str();
  app->add_option("--budget", o.budget,
                  "Selector budget: tokens (e.g. 1024, 2K) or a fraction of the context (1/8); "
                  "or top-p: pMASS[:CAP], e.g. p0.9 (smallest page set with estimated mass >= "
                  "0.9) or p0.9:1/8 (at most 1/8 of the context)")
      ->capture_default_str();
  app->add_option("--budget-min", o.budget_min,
                  "Top-p budgets: at least this many tokens (K_min; tokens or a fraction)");
  add_selector_file(app, o.selector_file,
                    "--selector learned, learned_codes: the learned selector (GGUF from masskv "
                    "distill, masskv selector init or scripts/indexer_export.py)");
  add_selector_key_format(app, o.selector_key_format);
  add_kept_items(app, o.sink_pages, o.window);
  add_top_p_mass(app, o.top_p_mass, "Target mass of the top_p selector");
  add_candidates(app, o.candidate_factor);
  add_page(app, o.page_size, "KV page size (tokens)");
  app->add_option("--reselect-every", o.reselect_every,
                  "Decode steps one selection serves: each layer selects, then reuses that "
                  "selection (plus the pages appended since) for R - 1 steps")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  app->add_option("--reselect-cos", o.reselect_cos,
                  "With --reselect-every: select again early when a q head's query turns past "
                  "this cosine from the one the selection was made for (-1: never)")
      ->check(real_in(-1, 1))
      ->capture_default_str();
  add_entmax_conversion(app, o.entmax_conversion,
                        "Run the converted entmax model: a `masskv convert` file (α and per-head "
                        "temperatures fitted to this model); enables --selector entmax_support");
}

std::string set_attention(const ModelOptions& o, const model::Model& model,
                          model::SessionOptions& so) {
  so.mapping = Mapping::softmax();
  so.score_multipliers.clear();
  if (o.entmax_conversion.empty()) return "softmax";
  learn::EntmaxConversion conv;
  try {
    conv = learn::load_conversion(o.entmax_conversion);
  } catch (const Error& e) {
    fail(e.code(), "--entmax-conversion", e.what());
  }
  conv.check_model(model, "--entmax-conversion");
  conv.apply(so);
  return conv.proxy == "identity" ? fmt::format("entmax{:g}, t = 1 (unconverted)", conv.alpha)
                                  : fmt::format("converted entmax{:g}", conv.alpha);
}

std::optional<select::SelectorConfig> selector_config(const ModelOptions& o, std::int64_t context,
                                                      const Mapping& mapping) {
  // METHOD+MOD spellings as eval's --methods (eval_rows.cpp's modifier table).
  const auto [base, mods] = split_modifiers(o.selector, "--selector");
  if (base == "dense") return std::nullopt;
  select::SelectorConfig c;
  c.method = select::parse_method(base, "--selector");
  require((c.method != select::Method::entmax_support && c.method != select::Method::gaussian_tau) ||
              mapping.is_entmax(),
          ErrorCode::unsupported, "--selector", o.selector,
          " needs entmax attention: pass --entmax-conversion FILE");
  c.mapping = mapping;
  c.sink_pages = o.sink_pages;
  c.window_tokens = o.window;
  c.candidate_factor = o.candidate_factor;
  c.budget = parse_budget(o.budget, context, "--budget");
  if (c.method == select::Method::top_p && c.budget.kind == select::Budget::Kind::fixed) {
    c.budget.kind = select::Budget::Kind::top_p;  // --budget is then the cap
    c.budget.p = o.top_p_mass;
  }
  require(c.budget.kind == select::Budget::Kind::fixed || select::takes_top_p(c.method),
          ErrorCode::invalid_argument, "--budget",
          "a top-p budget needs a selector with a mass "
          "estimate (top_p, quest, oracle, learned, token_codes, learned_codes), not ",
          o.selector);
  require(!select::needs_budget_cap(c.method) || c.budget.tokens > 0,
          ErrorCode::invalid_argument, "--budget", o.selector,
          " needs a cap on its budget (pMASS:CAP): its learned first pass keeps "
          "learned_candidates x the cap");
  if (!o.budget_min.empty()) {
    require(c.budget.kind == select::Budget::Kind::top_p, ErrorCode::invalid_argument,
            "--budget-min", "applies to top-p budgets (--budget pMASS[:CAP]) only");
    require(!is_top_p_budget(o.budget_min), ErrorCode::invalid_argument, "--budget-min",
            "must be tokens or a fraction, got '", o.budget_min, "'");
    require(c.budget.min_tokens == 0, ErrorCode::invalid_argument, "--budget-min",
            "the --budget already names a floor (pMASS:CAP:MIN): give one of the two");
    c.budget.min_tokens = parse_budget(o.budget_min, context, "--budget-min").tokens;
    require(c.budget.tokens == 0 || c.budget.min_tokens <= c.budget.tokens,
            ErrorCode::invalid_argument, "--budget-min", c.budget.min_tokens,
            " tokens exceed the cap of ", c.budget.tokens);
  }
  require(select::uses_learned_keys(c.method) || o.selector_file.empty(),
          ErrorCode::invalid_argument, "--selector-file",
          "is for --selector learned and learned_codes");
  // Under entmax the support-aware selectors stop by their own rule, the budget a cap (as the
  // eval's entmax rows).
  if (mapping.is_entmax() &&
      (c.method == select::Method::entmax_support || c.method == select::Method::gaussian_tau)) {
    c.budget.kind = select::Budget::Kind::adaptive;
  }
  for (const std::string& mod : mods) modifier_of(o.selector, base, mod, "--selector").apply(c);
  return c;
}

// One load per file for the process (bench and perplexity make many sessions).
std::shared_ptr<const learn::Selector> load_selector(const std::string& path) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const learn::Selector>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto& s = loaded[path];
  if (!s) s = std::make_shared<const learn::Selector>(learn::load(path));
  return s;
}

void validate(const ModelOptions& o, std::int64_t context) {
  // The attention is entmax exactly when a conversion file is given; its α does not change
  // which combinations are valid, so the file is read later, with the model.
  const Mapping mapping = o.entmax_conversion.empty() ? Mapping::softmax() : Mapping::entmax(1.5);
  (void)selector_config(o, context, mapping);
  (void)parse_budget(o.budget, context, "--budget");  // also when --selector dense ignores it
  (void)kv::parse_row_format(o.selector_key_format, "--selector-key-format");
  require(!uses_learned_selector(split_modifiers(o.selector, "--selector").first) ||
              !o.selector_file.empty(),
          ErrorCode::invalid_argument, "--selector-file",
          "--selector ", o.selector, " needs a selector file");
  require(o.selector_file.empty() || std::filesystem::is_regular_file(o.selector_file),
          ErrorCode::io, "--selector-file", "cannot read ", o.selector_file);
  require(o.entmax_conversion.empty() || std::filesystem::is_regular_file(o.entmax_conversion),
          ErrorCode::io, "--entmax-conversion", "cannot read ", o.entmax_conversion);
}

void apply_selector(const ModelOptions& o, std::int64_t context, model::SessionOptions& so) {
  so.selector = selector_config(o, context, so.mapping);
  so.reselect_every = o.reselect_every;
  so.reselect_cos = o.reselect_cos;
  so.learned_key_format = kv::parse_row_format(o.selector_key_format, "--selector-key-format");
  if (!so.selector || !select::uses_learned_keys(so.selector->method)) return;
  require(!o.selector_file.empty(), ErrorCode::invalid_argument, "--selector-file",
          "--selector ", o.selector, " needs a selector file");
  so.learned_selector = load_selector(o.selector_file);
}

std::string selector_label(const ModelOptions& o, const std::optional<select::SelectorConfig>& c) {
  if (!c) return "dense";
  std::string every = o.reselect_every > 1 ? fmt::format(" @{}", o.reselect_every) : "";
  if (o.reselect_every > 1 && o.reselect_cos > -1) every += fmt::format("c{:g}", o.reselect_cos);
  if (c->budget.kind == select::Budget::Kind::top_p && c->method != select::Method::top_p) {
    return c->budget.tokens > 0
               ? fmt::format("{} p{:g}:{}{}", o.selector, c->budget.p, c->budget.tokens, every)
               : fmt::format("{} p{:g}{}", o.selector, c->budget.p, every);
  }
  return fmt::format("{} {}{}", o.selector, c->budget.tokens, every);
}

void prefill_with_progress(model::Session& session, std::span<const model::TokenId> tokens,
                           std::span<float> logits_last, const std::string& label) {
  Progress bar(label, static_cast<long>(tokens.size()));
  std::int64_t shown = 0;
  session.prefill(tokens, logits_last, nullptr, [&](std::int64_t done, std::int64_t) {
    bar.advance(static_cast<long>(done - shown));
    shown = done;
  });
  bar.finish();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void set_threads(int threads) {
  // -t is checked when the command line is parsed (add_threads); this guard is for callers that
  // set threads otherwise: never thousands of OpenMP threads.
  require(threads >= 0 && threads <= max_threads(), ErrorCode::invalid_argument, "--threads",
          "must be in [0, ", max_threads(), "] (4 × the cores; 0: all cores), got ", threads);
  if (threads > 0) omp_set_num_threads(threads);
}

}  // namespace masskv::cli
