// masskv.Model and masskv.Session: the GGUF models of the CLI (SmolLM2, Gemma 3, or a path)
// with sparse decode attention, from Python. Logits come back as NumPy float32 arrays; the
// forward passes release the GIL.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/key_rows.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/model/chat_template.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"

namespace masskv::py {
namespace {

using model::TokenId;

struct PyModel {
  std::unique_ptr<model::Model> m;
};

struct PySession {
  std::unique_ptr<model::Session> s;
  std::vector<float> logits;
};

std::unique_ptr<PyModel> load_model(const std::string& name) {
  auto out = std::make_unique<PyModel>();
  // Models installed into this interpreter's environment (scripts/setup.sh --models: the
  // project's .venv) are found even where it was not activated (no $VIRTUAL_ENV).
  const std::string prefix = nb::cast<std::string>(nb::module_::import_("sys").attr("prefix"));
  const std::string path = model::resolve_model(name, {prefix}).string();
  nb::gil_scoped_release nogil;
  out->m = model::Model::load(path);
  return out;
}

std::unique_ptr<PySession> new_session(const PyModel& pm, std::int64_t max_tokens, int page_size,
                                       const std::string& method, std::int64_t budget_tokens,
                                       const std::string& budget, double top_p, int sink_pages,
                                       int window_tokens, double alpha, bool diagnostics,
                                       int fork_pages, const std::string& selector_file,
                                       const std::string& selector_key_format) {
  model::SessionOptions o;
  o.fork_pages = fork_pages;
  o.max_tokens = max_tokens;
  o.page_size = page_size;
  o.mapping = mapping_of(alpha);
  if (method != "dense") {
    o.selector =
        selector_config(method, alpha, budget, budget_tokens, top_p, sink_pages, window_tokens);
  }
  o.diagnostics = diagnostics;
  // A learned selector keeps its key cache from the first token (methods "learned" and
  // "learned_codes" then use it).
  o.learned_key_format = kv::parse_row_format(selector_key_format, "selector_key_format");
  require(method == "dense" || !select::uses_learned_keys(select::parse_method(method, "method")) ||
              !selector_file.empty(),
          ErrorCode::invalid_argument, "selector_file", "method '", method,
          "' needs a selector file (masskv distill)");
  if (!selector_file.empty()) {
    o.learned_selector = std::make_shared<const learn::Selector>(learn::load(selector_file));
  }
  auto out = std::make_unique<PySession>();
  out->s = std::make_unique<model::Session>(*pm.m, o);
  out->logits.resize(static_cast<std::size_t>(pm.m->config().n_vocab));
  return out;
}

nb::object logits_array(const PySession& s) {
  std::vector<float> copy = s.logits;
  return numpy_from_vector(std::move(copy), {s.logits.size()});
}

nb::object prefill(PySession& s, const std::vector<TokenId>& ids) {
  require(!ids.empty(), ErrorCode::invalid_argument, "ids", "no tokens to prefill");
  {
    nb::gil_scoped_release nogil;
    s.s->prefill(ids, s.logits);
  }
  return logits_array(s);
}

nb::object decode(PySession& s, TokenId id) {
  {
    nb::gil_scoped_release nogil;
    s.s->decode(id, s.logits);
  }
  return logits_array(s);
}

nb::dict stats(const PySession& s) {
  const model::DecodeStats& st = s.s->last_decode_stats();
  nb::dict d;
  d["kv_tokens_read"] = st.kv_tokens_read;
  d["kv_tokens_total"] = st.kv_tokens_total;
  d["delta_bound_sum"] = st.delta_bound_sum;
  d["heads"] = st.heads;
  d["certified"] = st.certified;
  return d;
}

// Greedy or sampled continuation of `prompt` (the chat template when chat is set); stops at
// eos / end of turn or after n_predict tokens.
std::string generate(const PyModel& pm, const std::string& prompt, int n_predict, bool chat,
                     const std::string& method, std::int64_t budget_tokens, float temperature,
                     int top_k, float top_p, std::uint64_t seed) {
  require(n_predict >= 0, ErrorCode::invalid_argument, "n_predict", "must be >= 0");
  const model::Tokenizer& tok = pm.m->tokenizer();
  std::string text = prompt;
  model::TokenId stop = -1;
  if (chat) {
    const auto tmpl = model::ChatTemplate::from_gguf(pm.m->file());
    const std::vector<model::ChatMessage> msgs{{"user", prompt}};
    text = tmpl.format_chat(msgs, true);
    stop = tok.find_token(tmpl.end_of_turn());
  }
  const std::vector<TokenId> ids = tok.encode(text, tok.add_bos_default(), chat);
  require(!ids.empty(), ErrorCode::invalid_argument, "prompt", "has no tokens");
  auto s = new_session(pm, static_cast<std::int64_t>(ids.size()) + n_predict + 1, 16, method,
                       budget_tokens, "fixed", 0.95, 1, 64, 1.0, false, 0, "", "f32");
  std::vector<TokenId> out;
  {
    nb::gil_scoped_release nogil;
    s->s->prefill(ids, s->logits);
    model::Sampler sampler({temperature, top_k, top_p, seed});
    for (int i = 0; i < n_predict; ++i) {
      const TokenId next = sampler.sample(s->logits);
      if (next == tok.eos() || next == stop) break;
      out.push_back(next);
      if (i + 1 < n_predict) s->s->decode(next, s->logits);
    }
  }
  return tok.decode(out, false);
}

}  // namespace

void bind_model(nb::module_& m) {
  nb::class_<PySession>(m, "Session",
                        "One sequence of a Model (Model.session): prefill, then decode token by "
                        "token through the selector. Not thread-safe.")
      .def("prefill", &prefill, nb::arg("ids"),
           "Appends the tokens (dense causal attention); returns the logits after the last\n"
           "(float32 (n_vocab,)).")
      .def("decode", &decode, nb::arg("token"),
           "One token through the decode path (the selector applied); returns its logits.")
      .def(
          "fork",
          [](const PySession& s) {
            auto out = std::make_unique<PySession>();
            out->s = std::make_unique<model::Session>(s.s->fork());
            out->logits = s.logits;
            return out;
          },
          nb::keep_alive<0, 1>(),
          "A session continuing from this one that shares its KV pages copy-on-write (needs\n"
          "fork_pages; see Model.session).")
      .def_prop_ro(
          "position", [](const PySession& s) { return s.s->position(); }, "Tokens in the cache.")
      .def_prop_ro("last_stats", &stats,
                   "Counters of the last decode step: kv_tokens_read, kv_tokens_total, and with\n"
                   "diagnostics the certified delta bound sum, heads and certified heads.");

  nb::class_<PyModel>(m, "Model",
                      "A GGUF model on the CPU: 'smollm2' (SmolLM2-135M-Instruct, installed by\n"
                      "scripts/setup.sh --models), 'gemma3' (Gemma 3 270M) or a path.")
      .def(nb::new_(&load_model), nb::arg("model") = "smollm2")
      .def_prop_ro("path", [](const PyModel& p) { return p.m->path(); })
      .def_prop_ro("arch",
                   [](const PyModel& p) { return std::string(model::to_string(p.m->config().arch)); })
      .def_prop_ro("n_layer", [](const PyModel& p) { return p.m->config().n_layer; })
      .def_prop_ro("n_vocab", [](const PyModel& p) { return p.m->config().n_vocab; })
      .def_prop_ro("n_ctx_train", [](const PyModel& p) { return p.m->config().n_ctx_train; })
      .def(
          "tokenize",
          [](const PyModel& p, const std::string& text, std::optional<bool> add_bos,
             bool special) {
            const model::Tokenizer& t = p.m->tokenizer();
            return t.encode(text, add_bos.value_or(t.add_bos_default()), special);
          },
          nb::arg("text"), nb::arg("add_bos") = nb::none(), nb::arg("special") = false,
          "Token ids of text (add_bos: the model's default when None).")
      .def(
          "detokenize",
          [](const PyModel& p, const std::vector<TokenId>& ids) {
            return p.m->tokenizer().decode(ids, false);
          },
          nb::arg("ids"), "Text of the ids (control tokens left out).")
      .def(
          "session",
          [](const PyModel& p, std::int64_t max_tokens, int page_size, const std::string& method,
             std::int64_t budget_tokens, const std::string& budget, double top_p,
             int sink_pages, int window_tokens, double alpha, bool diagnostics, int fork_pages,
             const std::string& selector_file, const std::string& selector_key_format) {
            nb::gil_scoped_release nogil;  // the session allocates its caches
            return new_session(p, max_tokens, page_size, method, budget_tokens, budget, top_p,
                               sink_pages, window_tokens, alpha, diagnostics, fork_pages,
                               selector_file, selector_key_format);
          },
          nb::arg("max_tokens") = 4096, nb::kw_only(), nb::arg("page_size") = 16,
          nb::arg("method") = "dense", nb::arg("budget_tokens") = 1024,
          nb::arg("budget") = "fixed", nb::arg("top_p") = 0.95, nb::arg("sink_pages") = 1,
          nb::arg("window_tokens") = 64, nb::arg("alpha") = 1.0,
          nb::arg("diagnostics") = false, nb::arg("fork_pages") = 0,
          nb::arg("selector_file") = "", nb::arg("selector_key_format") = "f32",
          nb::keep_alive<0, 1>(),
          "A new Session of up to max_tokens tokens. method: dense or a selector name\n"
          "(masskv.METHODS) applied at decode; budget / budget_tokens / top_p / sink_pages /\n"
          "window_tokens as in masskv.select; alpha: 1 = softmax, (1, 2] = entmax attention\n"
          "(on a softmax-trained model: an experiment, not the model's own attention);\n"
          "diagnostics: certified delta bounds per step in last_stats; fork_pages: spare pages\n"
          "per layer for sessions forked from this one; selector_file: a learned selector\n"
          "(masskv distill) whose key cache the session keeps, in selector_key_format (f32,\n"
          "bf16, int4, mxfp4, nvfp4, mxfp8), for method='learned' or 'learned_codes'.")
      .def("generate", &generate, nb::arg("prompt"), nb::arg("n_predict") = 64, nb::kw_only(),
           nb::arg("chat") = false, nb::arg("method") = "dense", nb::arg("budget_tokens") = 1024,
           nb::arg("temperature") = 0.0f, nb::arg("top_k") = 40, nb::arg("top_p") = 0.95f,
           nb::arg("seed") = 0,
           "Continuation of prompt (greedy at temperature 0), up to n_predict tokens; with\n"
           "chat the prompt is wrapped in the model's chat template.");
}

}  // namespace masskv::py
