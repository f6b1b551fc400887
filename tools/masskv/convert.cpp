// `masskv convert`: fits an entmax conversion of a softmax-trained model (docs/design.md §2.10,
// include/masskv/learn/conversion.hpp) on calibration text and writes it as a small GGUF that
// `run`, `perplexity`, `bench` and `eval` load with --entmax-conversion.
#include <fmt/core.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "progress.hpp"
#include "text.hpp"

namespace masskv::cli {
namespace {

struct ConvertCliOptions {
  std::string model = "smollm2";
  std::string text;  // default: the Debian Policy Manual
  std::vector<double> alphas = {1.5};
  std::string tokens = "4096";
  std::int64_t ctx = 1024;
  int queries = 64;
  std::string proxy = "both";
  std::vector<double> scales = {0.7, 0.85, 1.2, 1.4};
  int threads = 0;
  bool identity = false;
  std::string out;
  bool dry_run = false;
};

// t = 1 on every head at one α: plain entmax on the softmax-trained model, as a file, so the
// commands that take --entmax-conversion can run the unconverted reference too.
void write_identity(const model::Model& m, double alpha, const std::string& out) {
  save(learn::EntmaxConversion::identity(m, alpha), out);
  fmt::print(stderr, "masskv convert: wrote {} (identity: t = 1, α {:g}, not fitted)\n", out, alpha);
}

// The calibration chunks: `tokens` tokens from the middle of the text on (the first half stays
// held out: `masskv perplexity -f` scores the text's first chunks), ctx tokens each, bos first
// when the model adds one (as perplexity's chunks).
std::vector<std::vector<model::TokenId>> calibration_chunks(const model::Model& m,
                                                            const std::string& text,
                                                            std::int64_t tokens, std::int64_t ctx) {
  const model::Tokenizer& tok = m.tokenizer();
  const std::vector<model::TokenId> all = tok.encode(text, tok.add_bos_default(), false);
  const auto start = static_cast<std::int64_t>(all.size()) / 2;
  require(ctx >= 16 && ctx <= tokens, ErrorCode::invalid_argument, "--ctx-size",
          "the chunk length must be in [16, --tokens], got ", ctx);
  require(start + tokens <= static_cast<std::int64_t>(all.size()), ErrorCode::invalid_argument,
          "--tokens", tokens, " calibration tokens from the middle of the text need ",
          start + tokens, " tokens, the text has ", all.size());
  std::vector<std::vector<model::TokenId>> chunks;
  for (std::int64_t c = 0; (c + 1) * ctx <= tokens; ++c) {
    auto b = all.begin() + start + c * ctx;
    chunks.emplace_back(b, b + ctx);
    if (tok.add_bos_default()) chunks.back()[0] = tok.bos();
  }
  return chunks;
}

void run_convert(const ConvertCliOptions& o, const CLI::App& app) {
  // Ranges (α, scales, counts, threads) are checked as the options are parsed (checks.hpp).
  set_threads(o.threads);
  require(!o.out.empty(), ErrorCode::invalid_argument, "--out", "an output file is required");
  learn::ConvertOptions co;
  co.alphas = o.alphas;
  if (o.proxy == "kl") {
    co.proxies = {learn::Proxy::kl};
  } else if (o.proxy == "fenchel_young") {
    co.proxies = {learn::Proxy::fenchel_young};
  } else {
    require(o.proxy == "both", ErrorCode::invalid_argument, "--proxy",
            "must be kl, fenchel_young or both, got '", o.proxy, "'");
  }
  co.global_scales = o.scales;
  co.queries_per_chunk = o.queries;
  const std::int64_t tokens = parse_count(o.tokens, "--tokens");
  const std::int64_t ctx = o.ctx;
  require(o.identity || ctx <= tokens, ErrorCode::invalid_argument, "--ctx-size",
          "the chunk length must be in [16, --tokens], got ", ctx);
  const std::string path = model::resolve_model(o.model).string();
  auto mdl = model::Model::load(path);
  require(o.identity || ctx <= mdl->config().n_ctx_train, ErrorCode::invalid_argument,
          "--ctx-size", ctx, " exceeds the model's context of ", mdl->config().n_ctx_train,
          " tokens");
  if (dry_run_plan(o.dry_run, app, {{"model_path", path}})) return;
  if (o.identity) {
    require(co.alphas.size() == 1, ErrorCode::invalid_argument, "--alpha",
            "--identity takes one α, got ", co.alphas.size());
    write_identity(*mdl, co.alphas.front(), o.out);
    return;
  }
  const auto chunks = calibration_chunks(*mdl, load_text(o.text, "-f"), tokens, ctx);

  std::map<std::string, std::unique_ptr<Progress>, std::less<>> bars;
  const auto progress = [&](std::string_view phase, std::int64_t done, std::int64_t total) {
    auto it = bars.find(phase);
    if (it == bars.end() || done == 1) {
      bars[std::string(phase)] = std::make_unique<Progress>(std::string(phase), static_cast<long>(total));
      it = bars.find(phase);
    }
    it->second->advance();
    if (done == total) it->second->finish();
  };
  const auto t0 = std::chrono::steady_clock::now();
  const learn::ConvertResult r = learn::convert(*mdl, chunks, co, progress);
  save(r.conversion, o.out);

  fmt::print("| α | proxy | global multiplier | next-token KL (calibration) |\n");
  fmt::print("| ---: | --- | ---: | ---: |\n");
  for (const learn::ConvertTrial& t : r.trials) {
    fmt::print("| {:g} | {} | {:g} | {:.4f} |\n", t.alpha, learn::to_string(t.proxy),
               t.global_scale, t.kl);
  }
  std::vector<float> t = r.conversion.temperature;
  std::sort(t.begin(), t.end());
  fmt::print(
      "\nchosen: α {:g}, proxy {}, multiplier {:g}: KL {:.4f} nats (unconverted entmax, t = 1: "
      "{:.4f}); t over {} heads: min {:.3g}, median {:.3g}, max {:.3g}; mean support {:.1f}% of "
      "the keys on the calibration rows ({:.1f}% at t = 1)\n",
      r.conversion.alpha, r.conversion.proxy, r.conversion.global_scale,
      r.conversion.calibration_kl, r.unconverted_kl, t.size(), t.front(), t[t.size() / 2],
      t.back(), 100 * r.support, 100 * r.unconverted_support);
  fmt::print(stderr, "masskv convert: {} calibration tokens ({} chunks of {}), {:.0f} s, wrote {}\n",
             r.conversion.calibration_tokens, chunks.size(), ctx, seconds_since(t0), o.out);
}

}  // namespace

void register_convert(CLI::App& app) {
  auto o = std::make_shared<ConvertCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Fit an entmax conversion of a softmax-trained model (per-head temperatures, "
      "docs/design.md §2.10) on calibration text; use it with --entmax-conversion");
  add_model(cmd, o->model);
  add_out_file(cmd, o->out, "Output file (GGUF, general.architecture masskv-entmax)")->required();
  add_alpha(cmd, o->alphas,
            "Entmax α in (1, 2]; a list (1.25,1.5,2) fits each and keeps the lowest KL");
  cmd->add_option("--tokens", o->tokens,
                  "Calibration tokens, taken from the middle of the text on (the first half "
                  "stays held out for perplexity)")
      ->check(count_in(16, kMaxTokens))
      ->capture_default_str();
  add_ctx_size(cmd, o->ctx, 16,
               "Calibration chunk length (each chunk runs alone; at most --tokens and the "
               "model's context)");
  cmd->add_option("--queries", o->queries,
                  "Query positions per chunk whose attention rows the per-head fit uses")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--proxy", o->proxy,
                  "Per-head proxy: kl (KL(entmax ‖ softmax)), fenchel_young, or both (the "
                  "next-token KL picks)")
      ->capture_default_str();
  cmd->add_option("--scales", o->scales,
                  "Global multipliers on every t tried against the next-token KL (besides 1)")
      ->delimiter(',')
      ->check(real_in(0, 1000, true))
      ->capture_default_str();
  add_file(cmd, o->text, "Calibration text (default: the Debian Policy Manual, debian-policy)");
  add_threads(cmd, o->threads);
  cmd->add_flag("--identity", o->identity,
                "Fit nothing: write t = 1 on every head (plain α-entmax on the softmax-trained "
                "model, the unconverted reference for perplexity and eval)");
  cmd->footer(
      "Examples:\n"
      "  masskv convert --out out/conv.gguf\n"
      "  masskv convert --alpha 1.25,1.5,2 --tokens 8K -c 1024 --out out/conv.gguf\n"
      "  masskv convert --identity --alpha 1.5 --out out/identity.gguf");
  add_dry_run(cmd, o->dry_run);
  cmd->callback([o, cmd] { run_convert(*o, *cmd); });
}

}  // namespace masskv::cli
