// The shared-prefill, many-decoders loop of runner.hpp.
#include "masskv/eval/runner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <optional>

#include "masskv/error.hpp"

namespace masskv::eval {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

bool same_attention(const DecodeConfig& a, const DecodeConfig& b) {
  return a.mapping.kind == b.mapping.kind &&
         (!a.mapping.is_entmax() || a.mapping.alpha == b.mapping.alpha) &&
         a.score_multipliers == b.score_multipliers && a.prefill == b.prefill;
}

// One configuration being decoded: a fork of its mapping's prefilled root.
struct Lane {
  Lane(std::size_t c, model::Session s) : config(c), session(std::move(s)) {}
  std::size_t config;
  model::Session session;
  std::size_t fed = 0;       // tokens decoded so far
  model::TokenId best = -1;  // argmax of the logits after the last step
  std::vector<model::TokenId> generated;
  Outcome out;
  double read = 0, total = 0, delta = 0, certified = 0, heads = 0, selector_layers = 0, fresh = 0,
         selector_rows = 0;

  // The token to decode next (the prompt's rest, then greedy), or nullopt when done: at a stop
  // token, or once max_new tokens are generated (the last one is never decoded).
  std::optional<model::TokenId> next(const PromptTokens& prompt, int max_new) {
    if (fed < prompt.rest.size()) return prompt.rest[fed];
    if (static_cast<int>(generated.size()) >= max_new) return std::nullopt;
    if (std::find(prompt.stop.begin(), prompt.stop.end(), best) != prompt.stop.end()) {
      return std::nullopt;
    }
    generated.push_back(best);
    if (static_cast<int>(generated.size()) == max_new) return std::nullopt;
    return best;
  }

  void add(const model::DecodeStats& st, double seconds) {
    read += st.kv_tokens_read;
    total += st.kv_tokens_total;
    delta += st.delta_bound_sum;
    certified += st.certified;
    heads += st.heads;
    selector_layers += st.selector_layers;
    fresh += st.fresh_selections;
    selector_rows += st.selector_rows;
    out.decode_seconds += seconds;
    ++out.steps;
    ++fed;
  }

  void finish(const Sample& sample, const model::Tokenizer& tok) {
    out.output = tok.decode(generated, false);
    out.score = score(sample, out.output);
    out.kv_read = total > 0 ? read / total : 1.0;
    out.fresh_select = selector_layers > 0 ? fresh / selector_layers : 1.0;
    out.selector_read = total > 0 ? selector_rows / total : 0.0;
    if (heads > 0) {
      out.delta_bound = delta / heads;
      out.certified = certified / heads;
    }
  }
};

// One batched step of `lanes` (tokens[i] into lanes[i]). A lane is charged the step's shared
// time (everything but attention) divided by the rows, plus its own attention time.
void step(std::span<Lane* const> lanes, std::span<const model::TokenId> tokens,
          std::vector<float>& logits, std::size_t V) {
  std::vector<model::Session*> sessions;
  for (Lane* l : lanes) sessions.push_back(&l->session);
  logits.resize(lanes.size() * V);
  const auto t0 = Clock::now();
  model::decode_batch(sessions, tokens, logits);
  const double seconds = seconds_since(t0);
  double attention = 0;
  for (const model::Session* s : sessions) attention += s->last_decode_stats().attention_seconds;
  const double shared = std::max(0.0, seconds - attention) / static_cast<double>(lanes.size());
  for (std::size_t i = 0; i < lanes.size(); ++i) {
    const model::DecodeStats& st = sessions[i]->last_decode_stats();
    lanes[i]->add(st, shared + st.attention_seconds);
    lanes[i]->best = model::argmax(std::span<const float>(logits).subspan(i * V, V));
  }
}

}  // namespace

std::string_view to_string(Protocol p) {
  return p == Protocol::standard ? "standard" : "strict";
}

Protocol parse_protocol(std::string_view name, std::string_view argument) {
  if (name == "strict") return Protocol::strict;
  if (name == "standard") return Protocol::standard;
  fail(ErrorCode::invalid_argument, argument, "unknown protocol '", name,
       "' (standard: the whole prompt prefilled, the answer decoded sparsely; strict: the "
       "question decoded sparsely too)");
}

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
  require(options.max_batch >= 0, ErrorCode::invalid_argument, "max_batch", "must be >= 0, got ",
          options.max_batch);
  const PromptTokens prompt = tokenize_sample(model, chat, sample);
  const std::size_t V = static_cast<std::size_t>(model.config().n_vocab);
  const std::size_t lanes_max =
      options.max_batch > 0 ? static_cast<std::size_t>(options.max_batch) : configs.size();
  // Every lane decodes at most the prompt's rest and the answer; a standard-protocol root holds
  // the rest on top of its context root.
  const std::int64_t context = static_cast<std::int64_t>(prompt.context.size());
  const std::int64_t forked =
      static_cast<std::int64_t>(prompt.rest.size()) + std::max(0, sample.max_new_tokens);
  const int fork_room = static_cast<int>((forked + options.page_size - 1) / options.page_size) + 2;

  // One dense prefill of the context per distinct attention, shared (copy-on-write) by its
  // configurations; the standard protocol's configurations share one more: a fork of it with
  // the rest of the prompt prefilled too, whose logits give the first answer token.
  struct Root {
    std::unique_ptr<model::Session> session;
    double seconds = 0, kv_read = 1;
    model::TokenId best = -1;  // standard: the greedy first answer token
    std::size_t standard = SIZE_MAX;  // the context root's standard root, once made
  };
  std::vector<Root> roots;
  std::vector<std::size_t> root_of(configs.size()), context_root_of(configs.size());
  auto prefill = [&](model::Session& s, std::span<const model::TokenId> tokens,
                     std::span<float> logits) {
    std::int64_t shown = 0;
    s.prefill(tokens, logits, nullptr, [&](std::int64_t n, std::int64_t) {
      if (progress) progress(n - shown);
      shown = n;
    });
    const model::PrefillStats& ps = s.last_prefill_stats();
    return ps.keys_dense > 0 ? ps.keys_attended / ps.keys_dense : 1.0;
  };
  for (std::size_t i = 0; i < configs.size(); ++i) {
    std::size_t r = 0;
    while (r < i && !same_attention(configs[r], configs[i])) ++r;
    if (r < i) {
      r = context_root_of[r];
    } else {
      const auto users = static_cast<std::size_t>(
          std::count_if(configs.begin(), configs.end(),
                        [&](const DecodeConfig& c) { return same_attention(c, configs[i]); }));
      model::SessionOptions so;
      so.max_tokens = context + forked;
      so.page_size = options.page_size;
      so.kv_dtype = options.kv_dtype;
      so.prefill_block = options.prefill_block;
      so.mapping = configs[i].mapping;
      so.score_multipliers = configs[i].score_multipliers;
      so.sparse_prefill = configs[i].prefill;
      so.diagnostics = options.diagnostics;
      // f32 activations: the lockstep batch runs the f32 GEMM, and a configuration left alone
      // when the others finished must keep computing the same function (model.md).
      so.decode_activations = model::Activations::f32;
      const bool learned = std::any_of(configs.begin(), configs.end(), [](const DecodeConfig& c) {
        return (c.selector && select::uses_learned_keys(c.selector->method)) ||
               c.prefill.method == select::PrefillMethod::learned;
      });
      // Two-stage selection scores tokens on page codes kept from the first token.
      so.page_codes = std::any_of(configs.begin(), configs.end(), [](const DecodeConfig& c) {
        return c.selector && select::needs_page_codes(c.selector->method);
      });
      if (learned) {
        require(options.learned_selector != nullptr, ErrorCode::invalid_argument,
                "learned_selector", "a configuration uses a learned selector (decode or prefill)");
        so.learned_selector = options.learned_selector;
        so.learned_key_format = options.learned_key_format;
      }
      // The forks alive at once (each its partial-page copy and its own pages) and the
      // standard root.
      so.fork_pages = (static_cast<int>(std::min(users, lanes_max)) + 1) * fork_room;
      Root root;
      root.session = std::make_unique<model::Session>(model, so);
      const auto t0 = Clock::now();
      root.kv_read = prefill(*root.session, prompt.context, {});  // its logits are not needed
      root.seconds = seconds_since(t0);
      r = roots.size();
      roots.push_back(std::move(root));
    }
    context_root_of[i] = r;
    if (configs[i].protocol == Protocol::standard) {
      if (roots[r].standard == SIZE_MAX) {
        Root st;
        st.session = std::make_unique<model::Session>(roots[r].session->fork());
        std::vector<float> logits(V);
        const auto t0 = Clock::now();
        const double read = prefill(*st.session, prompt.rest, logits);
        st.seconds = roots[r].seconds + seconds_since(t0);
        // The prefill's share of (query, key) pairs over the whole prompt.
        const double c = static_cast<double>(context),
                     n = static_cast<double>(prompt.rest.size());
        st.kv_read = (roots[r].kv_read * c * c + read * (2 * c + n) * n) / ((c + n) * (c + n));
        st.best = model::argmax(std::span<const float>(logits));
        roots[r].standard = roots.size();
        roots.push_back(std::move(st));
      }
      r = roots[r].standard;
    }
    root_of[i] = r;
  }

  // The configurations step in lockstep, up to lanes_max at a time; a finished one leaves the
  // batch and the next configuration takes its place.
  std::vector<Outcome> outcomes(configs.size());
  std::vector<std::unique_ptr<Lane>> lanes;
  std::size_t started = 0;
  std::vector<Lane*> batch;
  std::vector<model::TokenId> tokens;
  std::vector<float> logits;
  for (;;) {
    while (lanes.size() < lanes_max && started < configs.size()) {
      const Root& root = roots[root_of[started]];
      auto lane = std::make_unique<Lane>(started, root.session->fork());
      lane->session.set_selector(configs[started].selector);
      lane->session.set_reselect(configs[started].reselect_every, configs[started].reselect_cos,
                                 configs[started].selection_timing);
      if (configs[started].protocol == Protocol::standard) {
        // The prompt is in the cache: generation starts from the prefill's token.
        lane->fed = prompt.rest.size();
        lane->best = root.best;
      }
      lanes.push_back(std::move(lane));
      ++started;
    }
    batch.clear();
    tokens.clear();
    for (auto it = lanes.begin(); it != lanes.end();) {
      Lane& l = **it;
      if (const auto t = l.next(prompt, sample.max_new_tokens)) {
        batch.push_back(&l);
        tokens.push_back(*t);
        ++it;
      } else {
        l.finish(sample, model.tokenizer());
        l.out.prefill_seconds = roots[root_of[l.config]].seconds;
        l.out.prefill_kv_read = roots[root_of[l.config]].kv_read;
        outcomes[l.config] = std::move(l.out);
        it = lanes.erase(it);  // frees the fork's pages for the next configuration
      }
    }
    if (batch.empty()) {
      if (started == configs.size()) break;
      continue;
    }
    step(batch, tokens, logits, V);
    if (progress) progress(static_cast<std::int64_t>(batch.size()));
  }
  return outcomes;
}

}  // namespace masskv::eval
