// `masskv run` (generate text) and `masskv perplexity` (perplexity and the KL divergence of
// sparse against dense logits) on a GGUF model, in llama.cpp's option conventions.
#include <fmt/core.h>
#include <fmt/os.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/model/chat_template.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "progress.hpp"

namespace masskv::cli {
namespace {

using Clock = std::chrono::steady_clock;
using model::TokenId;

// ---- run ------------------------------------------------------------------------------------

struct RunOptions {
  ModelOptions m;
  std::string prompt = "The meaning of life is";
  std::string file;
  int n_predict = 64;
  std::int64_t ctx = 0;  // 0: prompt + n_predict
  bool chat = false;
  std::string system;
  float temperature = 0;
  int top_k = 40;
  float top_p = 0.95f;
  std::uint64_t seed = 0;
  bool verbose = false;
  bool dry_run = false;
};

void run_generate(const RunOptions& o, const CLI::App& app) {
  // Everything that needs no model first: a bad option never costs a model load or a prefill.
  validate(o.m, o.ctx > 0 ? o.ctx : 4096);
  require(o.file.empty() || std::filesystem::is_regular_file(o.file), ErrorCode::io, "-f",
          "cannot read ", o.file);
  if (dry_run_plan(o.dry_run, app, {{"model_path", model::resolve_model(o.m.model).string()}})) {
    return;
  }
  set_threads(o.m.threads);
  const std::string path = model::resolve_model(o.m.model).string();
  auto mdl = model::Model::load(path);
  const model::Tokenizer& tok = mdl->tokenizer();
  std::string text = o.prompt;
  if (!o.file.empty()) {
    std::ifstream in(o.file, std::ios::binary);
    require(in.good(), ErrorCode::io, "-f", "cannot read ", o.file);
    std::ostringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  std::vector<TokenId> prompt;
  std::string_view stop_text;
  std::optional<model::ChatTemplate> tmpl;
  if (o.chat) {
    tmpl = model::ChatTemplate::from_gguf(mdl->file());
    std::vector<model::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", text});
    prompt = tok.encode(tmpl->format_chat(msgs, true), tok.add_bos_default(), true);
    stop_text = tmpl->end_of_turn();
  } else {
    prompt = tok.encode(text, tok.add_bos_default(), false);
  }
  require(!prompt.empty(), ErrorCode::invalid_argument, "-p", "the prompt has no tokens");
  const std::int64_t n_ctx = mdl->config().n_ctx_train;
  // Past the trained context the model's output is garbage (a 15K-token prompt on an 8K model
  // took 297 s to print nonsense), so refuse it before the prefill.
  require(static_cast<std::int64_t>(prompt.size()) + o.n_predict <= n_ctx,
          ErrorCode::invalid_argument, o.file.empty() ? "-p" : "-f", "the prompt (",
          prompt.size(), " tokens) plus -n ", o.n_predict, " exceeds the model's context of ",
          n_ctx, " tokens");
  require(o.ctx <= n_ctx, ErrorCode::invalid_argument, "--ctx-size", o.ctx,
          " exceeds the model's context of ", n_ctx, " tokens");
  const std::int64_t ctx =
      o.ctx > 0 ? o.ctx : static_cast<std::int64_t>(prompt.size()) + o.n_predict;
  require(ctx >= static_cast<std::int64_t>(prompt.size()) + o.n_predict,
          ErrorCode::invalid_argument, "--ctx-size", "context ", ctx,
          " is smaller than the prompt (", prompt.size(), " tokens) plus -n ", o.n_predict);
  model::SessionOptions so;
  so.max_tokens = ctx;
  so.page_size = o.m.page_size;
  const std::string attention = set_attention(o.m, *mdl, so);
  apply_selector(o.m, ctx, so);
  model::Session session(*mdl, so);
  const TokenId stop_id = stop_text.empty() ? -1 : tok.find_token(stop_text);

  std::vector<float> logits(static_cast<std::size_t>(mdl->config().n_vocab));
  const auto t0 = Clock::now();
  prefill_with_progress(session, prompt, logits, "prefill");
  const double t_prefill = seconds_since(t0);
  if (!o.chat) fmt::print("{}", text);
  std::fflush(stdout);
  model::Sampler sampler({o.temperature, o.top_k, o.top_p, o.seed});
  std::vector<TokenId> out;
  const auto t1 = Clock::now();
  double kv_read = 0, kv_total = 0, sel_read = 0;
  for (int i = 0; i < o.n_predict; ++i) {
    const TokenId next = sampler.sample(logits);
    if (next == tok.eos() || next == stop_id) break;
    out.push_back(next);
    fmt::print("{}", tok.token_to_piece(next, false));
    std::fflush(stdout);
    if (i + 1 == o.n_predict) break;
    session.decode(next, logits);
    kv_read += session.last_decode_stats().kv_tokens_read;
    kv_total += session.last_decode_stats().kv_tokens_total;
    sel_read += session.last_decode_stats().selector_rows;
  }
  const double t_decode = seconds_since(t1);
  fmt::print("\n");
  const auto decoded = static_cast<double>(out.size() > 0 ? out.size() - 1 : 0);
  fmt::print(stderr,
             "masskv run: {} ({}), prompt {} tokens in {:.2f} s ({:.1f} tok/s), generated {} "
             "tokens, decode {:.1f} tok/s",
             path, model::to_string(mdl->config().arch), prompt.size(), t_prefill,
             static_cast<double>(prompt.size()) / t_prefill, out.size(),
             decoded > 0 ? decoded / t_decode : 0.0);
  // The budget's two parts: rows attention read, and what the selector read to choose them
  // (select/read_cost.hpp), both against dense decode's KV bytes.
  if (kv_total > 0) {
    fmt::print(stderr, ", KV read {:.1f}% of dense + selector {:.1f}%", 100.0 * kv_read / kv_total,
               100.0 * sel_read / kv_total);
  }
  if (so.mapping.is_entmax()) fmt::print(stderr, ", attention {}", attention);
  fmt::print(stderr, "\n");
}

// ---- perplexity ---------------------------------------------------------------------------

struct PplOptions {
  ModelOptions m;
  std::string file;
  std::int64_t ctx = 512;
  int chunks = 0;  // 0: all
  bool kl = false;
  Output out;
  bool dry_run = false;
};

// -log p(target) and the distribution (f64) of one row of logits.
double log_softmax_at(const float* logits, std::size_t V, TokenId target, std::vector<double>* p) {
  const float mx = *std::max_element(logits, logits + V);
  double sum = 0;
  for (std::size_t i = 0; i < V; ++i) sum += std::exp(static_cast<double>(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  if (p != nullptr) {
    p->resize(V);
    for (std::size_t i = 0; i < V; ++i) (*p)[i] = static_cast<double>(logits[i]) - lse;
  }
  return lse - static_cast<double>(logits[target]);
}

// KL(P || Q) from log-probabilities.
double kl_divergence(const std::vector<double>& lp, const std::vector<double>& lq) {
  double kl = 0;
  for (std::size_t i = 0; i < lp.size(); ++i) kl += std::exp(lp[i]) * (lp[i] - lq[i]);
  return std::max(0.0, kl);
}

void run_perplexity(const PplOptions& o, const CLI::App& app) {
  validate(o.m, o.ctx);
  require(std::filesystem::is_regular_file(o.file), ErrorCode::io, "-f", "cannot read ", o.file);
  if (dry_run_plan(o.dry_run, app, {{"model_path", model::resolve_model(o.m.model).string()}})) {
    return;
  }
  set_threads(o.m.threads);
  const std::string path = model::resolve_model(o.m.model).string();
  auto mdl = model::Model::load(path);
  const model::Tokenizer& tok = mdl->tokenizer();
  std::ifstream in(o.file, std::ios::binary);
  require(in.good(), ErrorCode::io, "-f", "cannot read ", o.file);
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::vector<TokenId> all = tok.encode(ss.str(), tok.add_bos_default(), false);
  require(o.ctx <= mdl->config().n_ctx_train, ErrorCode::invalid_argument, "--ctx-size",
          o.ctx, " exceeds the model's context of ", mdl->config().n_ctx_train, " tokens");
  const std::int64_t n_chunks_avail = static_cast<std::int64_t>(all.size()) / o.ctx;
  require(n_chunks_avail > 0, ErrorCode::invalid_argument, "-f", "has ", all.size(),
          " tokens, fewer than one context of ", o.ctx);
  const std::int64_t n_chunks =
      o.chunks > 0 ? std::min<std::int64_t>(o.chunks, n_chunks_avail) : n_chunks_avail;
  // The reference is the model as trained (dense softmax); the compared session runs the
  // selector and/or the converted entmax attention.
  model::SessionOptions ref_so;
  ref_so.max_tokens = o.ctx;
  ref_so.page_size = o.m.page_size;
  model::SessionOptions cmp_so = ref_so;
  const std::string attention = set_attention(o.m, *mdl, cmp_so);
  apply_selector(o.m, o.ctx, cmp_so);
  cmp_so.diagnostics = cmp_so.selector.has_value();
  const bool sparse = cmp_so.selector.has_value();
  const bool compare = sparse || cmp_so.mapping.is_entmax();
  const auto V = static_cast<std::size_t>(mdl->config().n_vocab);
  // As llama.cpp's perplexity: each chunk of ctx tokens is evaluated alone (bos first when the
  // model adds one) and the second half is scored, so every scored token sees >= ctx/2 context.
  const std::int64_t first = o.ctx / 2;
  double nll_dense = 0, nll_cmp = 0, kl_sum = 0, kl_max = 0, kv_read = 0, kv_total = 0;
  double delta_sum = 0, heads = 0, certified = 0;
  std::int64_t scored = 0, top1_same = 0;
  Progress bar("perplexity", static_cast<long>(n_chunks * (o.ctx - first)));
  const auto t0 = Clock::now();
  std::vector<float> ld(V), ls(V);
  std::vector<double> lpd, lps;
  for (std::int64_t c = 0; c < n_chunks; ++c) {
    std::vector<TokenId> chunk(all.begin() + c * o.ctx, all.begin() + (c + 1) * o.ctx);
    if (tok.add_bos_default()) chunk[0] = tok.bos();
    const std::span<const TokenId> head(chunk.data(), static_cast<std::size_t>(first));
    model::Session dense(*mdl, ref_so);
    dense.prefill(head, ld);
    std::unique_ptr<model::Session> cmp;
    if (compare) {
      cmp = std::make_unique<model::Session>(*mdl, cmp_so);
      cmp->prefill(head, ls);
    }
    for (std::int64_t i = first; i < o.ctx; ++i) {
      const TokenId target = chunk[static_cast<std::size_t>(i)];
      const bool need_dist = compare && o.kl;
      nll_dense += log_softmax_at(ld.data(), V, target, need_dist ? &lpd : nullptr);
      if (compare) {
        nll_cmp += log_softmax_at(ls.data(), V, target, need_dist ? &lps : nullptr);
        if (need_dist) {
          const double kl = kl_divergence(lpd, lps);
          kl_sum += kl;
          kl_max = std::max(kl_max, kl);
        }
        top1_same += model::argmax(ld) == model::argmax(ls);
      }
      ++scored;
      bar.advance();
      if (i + 1 == o.ctx) break;
      dense.decode(target, ld);
      if (compare) {
        cmp->decode(target, ls);
        const model::DecodeStats& st = cmp->last_decode_stats();
        kv_read += st.kv_tokens_read;
        kv_total += st.kv_tokens_total;
        delta_sum += st.delta_bound_sum;
        heads += st.heads;
        certified += st.certified;
      }
    }
  }
  bar.finish();
  const double secs = seconds_since(t0);
  const double ppl_dense = std::exp(nll_dense / static_cast<double>(scored));
  const double ppl_cmp = compare ? std::exp(nll_cmp / static_cast<double>(scored)) : NAN;
  fmt::print(stderr, "masskv perplexity: {} tokens scored in {:.1f} s\n", scored, secs);
  const std::string name = model::to_string(mdl->config().arch).data();
  Rows j{{"model", path},          {"arch", name},          {"ctx", o.ctx},
         {"chunks", n_chunks},     {"scored", scored},      {"selector", o.m.selector},
         {"attention", attention}, {"ppl_dense", ppl_dense}};
  if (!o.m.entmax_conversion.empty()) j["entmax_conversion"] = o.m.entmax_conversion;
  if (compare) {
    j["ppl"] = ppl_cmp;
    j["top1_same"] = static_cast<double>(top1_same) / static_cast<double>(scored);
    j["kv_read_fraction"] = kv_read / kv_total;
    if (o.kl) {
      j["kl_mean"] = kl_sum / static_cast<double>(scored);
      j["kl_max"] = kl_max;
    }
  }
  if (sparse) {
    j["budget_tokens"] = cmp_so.selector->budget.tokens;
    j["certified_fraction"] = heads > 0 ? certified / heads : 0.0;
    j["delta_bound_mean"] = heads > 0 ? delta_sum / heads : 0.0;
  }
  write_results(o.out, Rows::array({j}), [&](std::FILE* f) {
    fmt::print(
        f,
        "| model | ctx | chunks | scored | attention | selector | budget | ppl dense softmax | "
        "ppl | Δppl % | mean KL | max KL | top-1 same | KV read | certified | δ bound |\n");
    fmt::print(
        f,
        "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: |\n");
    if (!compare) {
      fmt::print(
          f,
          "| {} | {} | {} | {} | softmax | dense | - | {:.4f} | {:.4f} | - | - | - | - | 100% "
          "| - | - |\n",
          name, o.ctx, n_chunks, scored, ppl_dense, ppl_dense);
    } else {
      fmt::print(
          f,
          "| {} | {} | {} | {} | {} | {} | {} | {:.4f} | {:.4f} | {:+.3f} | {} | {} | {:.2f}% "
          "| {:.1f}% | {} | {} |\n",
          name, o.ctx, n_chunks, scored, attention, sparse ? o.m.selector : "dense",
          sparse ? std::to_string(cmp_so.selector->budget.tokens) : "-", ppl_dense, ppl_cmp,
          100.0 * (ppl_cmp / ppl_dense - 1.0),
          o.kl ? fmt::format("{:.3e}", kl_sum / static_cast<double>(scored)) : "-",
          o.kl ? fmt::format("{:.3e}", kl_max) : "-",
          100.0 * static_cast<double>(top1_same) / static_cast<double>(scored),
          100.0 * kv_read / kv_total,
          heads > 0 ? fmt::format("{:.1f}%", 100.0 * certified / heads) : "-",
          heads > 0 ? fmt::format("{:.3g}", delta_sum / heads) : "-");
    }
  });
}

}  // namespace

void register_model_commands(CLI::App& app) {
  auto ro = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand("run", "Generate text with a GGUF model (llama.cpp style)");
  add_model_options(run, ro->m);
  add_prompt_text(run, ro->prompt);
  add_file(run, ro->file, "Read the prompt from this file");
  add_n_predict(run, ro->n_predict);
  add_ctx_size(run, ro->ctx, 0,
               "KV capacity in tokens (0: prompt + n; at most the model's context)");
  run->add_flag("--chat", ro->chat, "Wrap the prompt in the model's chat template");
  run->add_option("--system", ro->system, "System message (with --chat)");
  run->add_option("--temp", ro->temperature, "Temperature (0: greedy)")
      ->check(real_in(0, 100))
      ->capture_default_str();
  run->add_option("--top-k", ro->top_k, "Top-k (0: off)")
      ->check(int_in(0, 1 << 30))
      ->capture_default_str();
  run->add_option("--top-p", ro->top_p, "Top-p (1: off)")
      ->check(real_in(0, 1, true))
      ->capture_default_str();
  add_seed(run, ro->seed, "Sampling seed");
  add_dry_run(run, ro->dry_run);
  run->footer(
      "Examples:\n"
      "  masskv run -p \"The capital of France is\" -n 16\n"
      "  masskv run -f prompt.txt -n 64 --selector quest --budget 1/8 -t 0\n"
      "  masskv run --chat -p \"Name three rivers.\" --dry-run");
  run->callback([ro, run] { run_generate(*ro, *run); });

  auto po = std::make_shared<PplOptions>();
  CLI::App* ppl = app.add_subcommand(
      "perplexity",
      "Perplexity of a text file; with --selector and/or --entmax-conversion also against "
      "dense softmax (KL, top-1, KV read, certified heads, δ bound)");
  add_model_options(ppl, po->m);
  add_file(ppl, po->file, "Text file (e.g. the Debian Policy Manual, see README)")->required();
  add_ctx_size(ppl, po->ctx, 8,
               "Context per chunk, at most the model's; the second half is scored");
  ppl->add_option("--chunks", po->chunks, "Chunks to evaluate (0: all)")
      ->check(int_in(0, 1 << 30))
      ->capture_default_str();
  ppl->add_flag("--kl", po->kl,
                "KL divergence of the compared logits (--selector and/or --entmax-conversion) "
                "against dense softmax");
  add_output(ppl, po->out);
  add_dry_run(ppl, po->dry_run);
  ppl->footer(
      "Examples:\n"
      "  masskv perplexity -f policy.txt -c 512 --chunks 4\n"
      "  masskv perplexity -f policy.txt -c 1024 --selector quest --budget 1/8 --kl\n"
      "  masskv perplexity -f policy.txt --entmax-conversion conv.gguf -o json --out ppl.json");
  ppl->callback([po, ppl] { run_perplexity(*po, *ppl); });
}

}  // namespace masskv::cli
