// The shared-prefill, many-decoders loop of runner.hpp.
#include "masskv/eval/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "masskv/error.hpp"

namespace masskv::eval {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool same_mapping(const Mapping& a, const Mapping& b) {
  return a.kind == b.kind && (!a.is_entmax() || a.alpha == b.alpha);
}

// One configuration decoded from a fork of the prefilled session.
Outcome decode_config(const model::Session& root, const DecodeConfig& config,
                      const PromptTokens& prompt, const Sample& sample, const model::Tokenizer& tok,
                      const std::function<void(std::int64_t)>& tick) {
  model::Session s = root.fork();
  s.set_selector(config.selector);
  std::vector<float> logits(static_cast<std::size_t>(root.model().config().n_vocab));
  Outcome out;
  double read = 0, total = 0, delta = 0, certified = 0, heads = 0;
  const auto step = [&](model::TokenId t) {
    s.decode(t, logits);
    const model::DecodeStats& st = s.last_decode_stats();
    read += st.kv_tokens_read;
    total += st.kv_tokens_total;
    delta += st.delta_bound_sum;
    certified += st.certified;
    heads += st.heads;
    ++out.steps;
    if (tick) tick(1);
  };
  const auto t0 = Clock::now();
  for (const model::TokenId t : prompt.rest) step(t);
  std::vector<model::TokenId> generated;
  for (int i = 0; i < sample.max_new_tokens; ++i) {
    const model::TokenId next = model::argmax(logits);
    if (std::find(prompt.stop.begin(), prompt.stop.end(), next) != prompt.stop.end()) break;
    generated.push_back(next);
    if (i + 1 == sample.max_new_tokens) break;
    step(next);
  }
  out.decode_seconds = seconds_since(t0);
  out.output = tok.decode(generated, false);
  out.score = score(sample, out.output);
  out.kv_read = total > 0 ? read / total : 1.0;
  if (heads > 0) {
    out.delta_bound = delta / heads;
    out.certified = certified / heads;
  }
  return out;
}

}  // namespace

PromptTokens tokenize_sample(const model::Model& model, const model::ChatTemplate& chat,
                             const Sample& sample) {
  require(!sample.context.empty(), ErrorCode::invalid_argument, "sample", "the context of a ",
          sample.task, " sample is empty");
  const model::Tokenizer& tok = model.tokenizer();
  const std::vector<model::ChatMessage> msgs{{"user", sample.context + sample.question}};
  const std::string text = chat.format_chat(msgs, true) + sample.answer_prefix;
  // The context is the user turn's start: split right after it.
  const std::size_t at = text.find(sample.context);
  require(at != std::string::npos, ErrorCode::invalid_argument, "sample",
          "the chat template changed the context text");
  const std::size_t cut = at + sample.context.size();
  PromptTokens p;
  p.context = tok.encode(std::string_view(text).substr(0, cut), tok.add_bos_default(), true);
  p.rest = tok.encode(std::string_view(text).substr(cut), false, true);
  p.stop.push_back(tok.eos());
  const model::TokenId eot = tok.find_token(chat.end_of_turn());
  if (eot >= 0) p.stop.push_back(eot);
  require(!p.rest.empty(), ErrorCode::invalid_argument, "sample", "nothing follows the context");
  return p;
}

int template_overhead(const model::Model& model, const model::ChatTemplate& chat) {
  const model::Tokenizer& tok = model.tokenizer();
  const std::vector<model::ChatMessage> msgs{{"user", ""}};
  return static_cast<int>(
      tok.encode(chat.format_chat(msgs, true), tok.add_bos_default(), true).size());
}

std::vector<Outcome> run_sample(const model::Model& model, const model::ChatTemplate& chat,
                                const Sample& sample, std::span<const DecodeConfig> configs,
                                const RunOptions& options,
                                const std::function<void(std::int64_t)>& progress) {
  const PromptTokens prompt = tokenize_sample(model, chat, sample);
  const std::int64_t context = static_cast<std::int64_t>(prompt.context.size());
  const std::int64_t forked =
      static_cast<std::int64_t>(prompt.rest.size()) + std::max(0, sample.max_new_tokens);
  std::vector<Outcome> outcomes(configs.size());
  std::vector<bool> done(configs.size(), false);
  // One dense prefill per distinct mapping, shared by the configurations that use it.
  for (std::size_t first = 0; first < configs.size(); ++first) {
    if (done[first]) continue;
    const Mapping mapping = configs[first].mapping;
    model::SessionOptions so;
    so.max_tokens = context + forked;
    so.page_size = options.page_size;
    so.kv_dtype = options.kv_dtype;
    so.prefill_block = options.prefill_block;
    so.mapping = mapping;
    so.diagnostics = options.diagnostics;
    // One fork alive at a time: its partial-page copy and its own pages.
    so.fork_pages = static_cast<int>((forked + options.page_size - 1) / options.page_size) + 2;
    model::Session root(model, so);
    std::vector<float> logits;  // the context's logits are not needed
    const auto t0 = Clock::now();
    std::int64_t shown = 0;
    root.prefill(prompt.context, logits, nullptr, [&](std::int64_t n, std::int64_t) {
      if (progress) progress(n - shown);
      shown = n;
    });
    const double prefill_seconds = seconds_since(t0);
    for (std::size_t i = first; i < configs.size(); ++i) {
      if (done[i] || !same_mapping(configs[i].mapping, mapping)) continue;
      outcomes[i] = decode_config(root, configs[i], prompt, sample, model.tokenizer(), progress);
      outcomes[i].prefill_seconds = prefill_seconds;
      done[i] = true;
    }
  }
  return outcomes;
}

}  // namespace masskv::eval
