// `masskv dump`: real attention inputs of a model for `masskv study` and the selection lab —
// per chosen layer, the keys and values of a DEPTH-token context of real text and the queries of
// the STEPS tokens that follow it (format: qkv_dump.hpp). With --task, the context is instead a
// whole eval prompt (chat template, haystack, question, answer prefix) and the queries are those
// of its gold answer, teacher-forced: the positions where the field's standard protocol decodes
// sparsely and where a selector must find the needle. With --prompts, the same for prompts of
// the caller's own (JSON lines), tokenized as written.
#include <fmt/core.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/eval/runner.hpp"
#include "masskv/eval/tasks.hpp"
#include "masskv/model/chat_template.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "qkv_dump.hpp"
#include "text.hpp"

namespace masskv::cli {
namespace {

struct DumpOptions {
  std::string model = "smollm2";
  std::string text;  // default: the Debian Policy Manual
  std::string depth = "4K";
  std::vector<int> layers;  // empty: all
  int steps = 8;
  int threads = 0;
  std::string out_dir = "out/dump";
  // Eval-prompt mode (--task): samples of these tasks at these lengths.
  std::vector<std::string> tasks;
  std::vector<std::string> lengths{"2K"};
  int samples = 1;
  // Seeds of the lab's prompts: kept apart from the eval's reported samples (the eval derives
  // its seeds from --seed 1), so a ranking is chosen on other prompts than it is judged on.
  std::uint64_t seed = 9001;
  // Prompt-file mode (--prompts): JSON lines {"name", "prompt", "answer"}, tokenized as written.
  std::string prompts;
};

// Writes one file per requested layer into `dir`; tokens [0, depth) are the context whose
// keys and values are kept, the rest are the queries.
void dump_tokens(model::Model& mdl, const std::string& path, std::span<const model::TokenId> ids,
                 std::int64_t depth, const std::vector<int>& layers, const std::string& dir,
                 const std::string& note) {
  const model::ModelConfig& c = mdl.config();
  const int steps = static_cast<int>(static_cast<std::int64_t>(ids.size()) - depth);
  const std::size_t D = static_cast<std::size_t>(c.head_dim);
  const std::size_t qrow = static_cast<std::size_t>(c.n_head) * D;
  const std::size_t kvrow = static_cast<std::size_t>(c.n_head_kv) * D;
  // q pre-multiplied so that q·k/sqrt(D) (the study's score) equals the model's logit.
  const float qmul = static_cast<float>(c.attn_scale * std::sqrt(static_cast<double>(D)));
  std::map<int, QkvDump> dumps;
  for (int l : layers) {
    QkvDump& d = dumps[l];
    d.model = std::filesystem::path(path).filename().string();
    d.arch = std::string(model::to_string(c.arch));
    d.layer = l;
    d.context = depth;
    d.steps = steps;
    d.hq = c.n_head;
    d.hkv = c.n_head_kv;
    d.head_dim = c.head_dim;
    d.q_multiplier = qmul;
    for (int s = 0; s < steps; ++s) d.positions.push_back(depth + s);
    d.q.reserve(static_cast<std::size_t>(steps) * qrow);
    d.k.reserve(static_cast<std::size_t>(depth) * kvrow);
    d.v.reserve(static_cast<std::size_t>(depth) * kvrow);
  }
  model::SessionOptions so;
  so.max_tokens = static_cast<std::int64_t>(ids.size());
  so.capture = [&](const model::LayerCapture& cap) {
    auto it = dumps.find(cap.layer);
    if (it == dumps.end()) return;
    QkvDump& d = it->second;
    for (int t = 0; t < cap.n; ++t) {
      const std::int64_t pos = cap.pos0 + t;
      const auto i = static_cast<std::size_t>(t);
      if (pos < depth) {
        d.k.insert(d.k.end(), cap.k.begin() + i * kvrow, cap.k.begin() + (i + 1) * kvrow);
        d.v.insert(d.v.end(), cap.v.begin() + i * kvrow, cap.v.begin() + (i + 1) * kvrow);
      } else {
        for (std::size_t x = 0; x < qrow; ++x) d.q.push_back(cap.q[i * qrow + x] * qmul);
      }
    }
  };
  model::Session session(mdl, so);
  prefill_with_progress(session, ids, {}, note);
  std::filesystem::create_directories(dir);
  for (const auto& [l, d] : dumps) {
    const std::string file = fmt::format("{}/layer{:02d}.mkvd", dir, l);
    write_qkv_dump(file, d);
    fmt::print("{}\n", file);
  }
}

// A prompt's tokens with its answer's after them (the teacher-forced queries): `depth` is the
// prompt's length, the dump's context. Throws Error naming `option` (after `where`, e.g. a
// file's line) when the whole does not fit the model's context.
struct PromptAnswer {
  std::vector<model::TokenId> ids;
  std::int64_t depth = 0;
};
PromptAnswer with_answer(const model::Model& mdl, std::vector<model::TokenId> prompt,
                         const std::string& answer, const char* option,
                         const std::string& where = {}) {
  PromptAnswer pa{std::move(prompt), 0};
  pa.depth = static_cast<std::int64_t>(pa.ids.size());
  const std::vector<model::TokenId> ans = mdl.tokenizer().encode(answer, false, false);
  pa.ids.insert(pa.ids.end(), ans.begin(), ans.end());
  require(static_cast<std::int64_t>(pa.ids.size()) <= mdl.config().n_ctx_train,
          ErrorCode::invalid_argument, option, where, "prompt + answer = ", pa.ids.size(),
          " tokens exceeds the model's context ", mdl.config().n_ctx_train);
  return pa;
}

// --task: for each (task, length, sample) the prompt as the eval builds it and the gold answer
// after it; the answer's tokens are the queries. Several answers (multi-value tasks) are
// written as the model is asked to give them, comma-separated.
void dump_tasks(model::Model& mdl, const std::string& path, const DumpOptions& o,
                const std::vector<int>& layers) {
  const model::ChatTemplate chat = model::ChatTemplate::from_gguf(mdl.file());
  const model::Tokenizer& tok = mdl.tokenizer();
  bool needs_text = false;
  for (const std::string& t : o.tasks) needs_text |= eval::find_task(t, "--task").needs_text;
  const std::string text = needs_text ? load_text(o.text, "-f") : std::string();
  const int reserve = eval::template_overhead(mdl, chat) + 2;
  for (const std::string& task : o.tasks) {
    for (const std::string& len : o.lengths) {
      const std::int64_t L = parse_count(len, "--length");
      for (int i = 0; i < o.samples; ++i) {
        eval::GenerateArgs ga;
        ga.tokenizer = &tok;
        ga.text = text;
        ga.length = L;
        ga.reserve_tokens = reserve;
        ga.seed = o.seed * 0x9e3779b97f4a7c15ULL + static_cast<std::uint64_t>(L) * 1000003ULL +
                  static_cast<std::uint64_t>(i);
        const eval::Sample sample = eval::make_sample(task, ga);
        const eval::PromptTokens p = eval::tokenize_sample(mdl, chat, sample);
        std::vector<model::TokenId> ids = p.context;
        ids.insert(ids.end(), p.rest.begin(), p.rest.end());
        std::string answer;
        for (const std::string& a : sample.answers) answer += (answer.empty() ? " " : ", ") + a;
        const PromptAnswer pa = with_answer(mdl, std::move(ids), answer, "--length");
        const std::string dir = fmt::format("{}/{}-{}-{}", o.out_dir, task, L, i);
        dump_tokens(mdl, path, pa.ids, pa.depth, layers, dir,
                    fmt::format("dump {} {} #{}", task, L, i));
      }
    }
  }
}

// --prompts: each JSON line's prompt tokenized as written (the model's BOS, no chat template:
// prompts from generators and templates the eval does not use, for training indexers) and its
// answer after it; the answer's tokens are the queries. One folder per line, named by "name".
// Every line is checked before the first is dumped.
void dump_prompts(model::Model& mdl, const std::string& path, const DumpOptions& o,
                  const std::vector<int>& layers) {
  struct Prompt {
    std::string name;
    PromptAnswer tokens;
  };
  std::ifstream in(o.prompts);
  require(in.good(), ErrorCode::io, "--prompts", "cannot open ", o.prompts);
  const model::Tokenizer& tok = mdl.tokenizer();
  std::vector<Prompt> prompts;
  std::set<std::string> names;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    require(!j.is_discarded() && j.is_object(), ErrorCode::invalid_argument, "--prompts",
            o.prompts, " line ", n, ": not a JSON object");
    for (const char* field : {"prompt", "answer"}) {
      require(j.contains(field) && j[field].is_string() && !j[field].get<std::string>().empty(),
              ErrorCode::invalid_argument, "--prompts", o.prompts, " line ", n, ": \"", field,
              "\" must be a non-empty string");
    }
    Prompt p;
    p.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>()
                                                         : fmt::format("prompt-{}", n);
    require(!p.name.empty() && p.name.find('/') == std::string::npos && p.name != "." &&
                p.name != "..",
            ErrorCode::invalid_argument, "--prompts", o.prompts, " line ", n,
            ": \"name\" must be a folder name, got '", p.name, "'");
    require(names.insert(p.name).second, ErrorCode::invalid_argument, "--prompts", o.prompts,
            " line ", n, ": the name '", p.name, "' is used twice");
    p.tokens = with_answer(mdl,
                           tok.encode(j["prompt"].get<std::string>(), tok.add_bos_default(), false),
                           j["answer"].get<std::string>(), "--prompts",
                           fmt::format("{} line {}: ", o.prompts, n));
    prompts.push_back(std::move(p));
  }
  require(!prompts.empty(), ErrorCode::invalid_argument, "--prompts", o.prompts,
          ": no prompt lines");
  for (const Prompt& p : prompts) {
    dump_tokens(mdl, path, p.tokens.ids, p.tokens.depth, layers,
                fmt::format("{}/{}", o.out_dir, p.name), fmt::format("dump {}", p.name));
  }
}

void run_dump(const DumpOptions& o) {
  set_threads(o.threads);
  require(o.steps >= 1, ErrorCode::invalid_argument, "--steps", "must be >= 1");
  const std::int64_t depth = parse_count(o.depth, "-d");
  // --task's options are checked before the model loads.
  require(o.samples >= 1, ErrorCode::invalid_argument, "--samples", "must be >= 1, got ",
          o.samples);
  for (const std::string& t : o.tasks) eval::find_task(t, "--task");
  require(o.prompts.empty() || o.tasks.empty(), ErrorCode::invalid_argument, "--prompts",
          "give --prompts or --task, not both");
  require(o.prompts.empty() || std::filesystem::is_regular_file(o.prompts), ErrorCode::io,
          "--prompts", "no such file: ", o.prompts);
  for (const std::string& len : o.lengths) {
    require(parse_count(len, "--length") >= 256, ErrorCode::invalid_argument, "--length",
            "must be >= 256 tokens, got ", len);
  }
  const std::string path = model::resolve_model(o.model).string();
  auto mdl = model::Model::load(path);
  const model::ModelConfig& c = mdl->config();
  std::vector<int> layers = o.layers;
  if (layers.empty()) {
    for (int l = 0; l < c.n_layer; ++l) layers.push_back(l);
  }
  for (int l : layers) {
    require(l >= 0 && l < c.n_layer, ErrorCode::invalid_argument, "--layers", "layer ", l,
            " out of range (the model has ", c.n_layer, ")");
  }
  if (!o.tasks.empty()) {
    dump_tasks(*mdl, path, o, layers);
    return;
  }
  if (!o.prompts.empty()) {
    dump_prompts(*mdl, path, o, layers);
    return;
  }
  const std::int64_t total = depth + o.steps;
  require(total <= c.n_ctx_train, ErrorCode::invalid_argument, "-d", "depth + steps = ", total,
          " exceeds the model's context ", c.n_ctx_train);
  const model::Tokenizer& tok = mdl->tokenizer();
  std::vector<model::TokenId> ids =
      tok.encode(load_text(o.text, "-f"), tok.add_bos_default(), false);
  require(static_cast<std::int64_t>(ids.size()) >= total, ErrorCode::invalid_argument, "-f",
          "the text has ", ids.size(), " tokens, fewer than depth + steps = ", total);
  ids.resize(static_cast<std::size_t>(total));
  dump_tokens(*mdl, path, ids, depth, layers, o.out_dir, "dump");
  fmt::print(stderr,
             "masskv dump: {} layer(s) of {} ({} tokens of context, {} queries each); study "
             "them with masskv study --generators dump:{}/layer{:02d}.mkvd\n",
             layers.size(), path, depth, o.steps, o.out_dir, layers.front());
}

}  // namespace

void register_dump(CLI::App& app) {
  auto o = std::make_shared<DumpOptions>();
  CLI::App* d = app.add_subcommand(
      "dump",
      "Write a model's real q/k/v (per layer: the keys and values of a context of real text and "
      "the queries of the tokens after it) for masskv study --generators dump:FILE");
  add_model(d, o->model);
  add_file(d, o->text, "Text (default: the Debian Policy Manual)");
  add_depth(d, o->depth, "Context tokens");
  d->add_option("--layers", o->layers, "Layers to dump (comma-separated; default: all)")
      ->delimiter(',');
  d->add_option("--steps", o->steps, "Query tokens after the context")->capture_default_str();
  add_threads(d, o->threads);
  add_out_dir(d, o->out_dir,
              "Write layerNN.mkvd files here (with --task: one folder TASK-LENGTH-SAMPLE each)")
      ->capture_default_str();
  d->add_option("--task", o->tasks,
                "Eval prompts instead of text: these tasks (comma-separated; masskv eval's "
                "names); the queries are the gold answer's tokens")
      ->delimiter(',');
  d->add_option("--length", o->lengths, "With --task: prompt lengths (K suffix; comma-separated)")
      ->delimiter(',')
      ->capture_default_str();
  d->add_option("--samples", o->samples, "With --task: samples per task and length (>= 1)")
      ->capture_default_str();
  add_seed(d, o->seed,
           "With --task: seed of the prompts (default 9001, apart from the eval's seeds)");
  d->add_option("--prompts", o->prompts,
                "Prompts of your own instead of text: a JSON-lines file of {\"name\", \"prompt\", "
                "\"answer\"}, each prompt tokenized as written (no chat template), its answer's "
                "tokens the queries; one folder NAME each (scripts/make_retrieval_prompts.py)");
  d->footer(
      "Examples:\n"
      "  masskv dump -d 4K --layers 2,15 -O out/dump\n"
      "  masskv dump --task niah_single_number --length 2K --samples 2 -O out/dump-needles\n"
      "  masskv dump --prompts prompts.jsonl -O out/dump-train");
  d->callback([o] { run_dump(*o); });
}

}  // namespace masskv::cli
