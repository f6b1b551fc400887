#include "model_options.hpp"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "masskv/error.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/model/locate.hpp"
#include "parse.hpp"
#include "progress.hpp"

namespace masskv::cli {

void add_model_options(CLI::App* app, ModelOptions& o, bool with_threads) {
  app->add_option("-m,--model", o.model,
                  "Model: smollm2 (SmolLM2-135M-Instruct), gemma3 (Gemma 3 270M) or a GGUF path")
      ->capture_default_str();
  if (with_threads) {
    app->add_option("-t,--threads", o.threads, "Threads (0: all cores)")->capture_default_str();
  }
  app->add_option("--selector", o.selector,
                  "Decode attention: dense, sink_recent, quest, top_p, gaussian_tau, oracle "
                  "(gemma3: global layers only)")
      ->capture_default_str();
  app->add_option("--budget", o.budget,
                  "Selector budget: tokens (e.g. 1024, 2K) or a fraction of the context (1/8)")
      ->capture_default_str();
  app->add_option("--sink-pages", o.sink_pages, "Pages at the start always kept")
      ->capture_default_str();
  app->add_option("--window", o.window, "Most recent tokens always kept")->capture_default_str();
  app->add_option("--top-p-mass", o.top_p_mass, "Target mass of the top_p selector")
      ->capture_default_str();
  app->add_option("--page", o.page_size, "KV page size (tokens)")->capture_default_str();
  app->add_option("--entmax-conversion", o.entmax_conversion,
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
  if (o.selector == "dense") return std::nullopt;
  select::SelectorConfig c;
  c.method = select::parse_method(o.selector, "--selector");
  require(c.method != select::Method::entmax_support || mapping.is_entmax(),
          ErrorCode::unsupported, "--selector",
          "entmax_support needs entmax attention: pass --entmax-conversion FILE");
  c.mapping = mapping;
  c.sink_pages = o.sink_pages;
  c.window_tokens = o.window;
  if (o.budget.find('/') != std::string::npos || o.budget.find('.') != std::string::npos) {
    c.budget.tokens = std::max<std::int64_t>(
        1, static_cast<std::int64_t>(
               std::llround(parse_fraction(o.budget, "--budget") * static_cast<double>(context))));
  } else {
    c.budget.tokens = parse_count(o.budget, "--budget");
  }
  if (c.method == select::Method::top_p) {
    c.budget.kind = select::Budget::Kind::top_p;
    c.budget.p = o.top_p_mass;
  }
  if (mapping.is_entmax() &&
      (c.method == select::Method::entmax_support || c.method == select::Method::gaussian_tau)) {
    c.budget.kind = select::Budget::Kind::adaptive;
  }
  return c;
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
  require(threads >= 0, ErrorCode::invalid_argument, "--threads", "must be >= 0");
  if (threads > 0) omp_set_num_threads(threads);
}

}  // namespace masskv::cli
