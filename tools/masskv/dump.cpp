// `masskv dump`: real attention inputs of a model for `masskv study` — per chosen layer, the
// keys and values of a DEPTH-token context of real text and the queries of the STEPS tokens
// that follow it (format: qkv_dump.hpp).
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "masskv/error.hpp"
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
};

void run_dump(const DumpOptions& o) {
  set_threads(o.threads);
  require(o.steps >= 1, ErrorCode::invalid_argument, "--steps", "must be >= 1");
  const std::int64_t depth = parse_count(o.depth, "-d");
  const std::string path = model::resolve_model(o.model).string();
  auto mdl = model::Model::load(path);
  const model::ModelConfig& c = mdl->config();
  std::vector<int> layers = o.layers;
  if (layers.empty()) {
    for (int l = 0; l < c.n_layer; ++l) layers.push_back(l);
  }
  for (int l : layers) {
    require(l >= 0 && l < c.n_layer, ErrorCode::invalid_argument, "-l", "layer ", l,
            " out of range (the model has ", c.n_layer, ")");
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
    d.steps = o.steps;
    d.hq = c.n_head;
    d.hkv = c.n_head_kv;
    d.head_dim = c.head_dim;
    d.q_multiplier = qmul;
    for (int s = 0; s < o.steps; ++s) d.positions.push_back(depth + s);
    d.q.reserve(static_cast<std::size_t>(o.steps) * qrow);
    d.k.reserve(static_cast<std::size_t>(depth) * kvrow);
    d.v.reserve(static_cast<std::size_t>(depth) * kvrow);
  }
  model::SessionOptions so;
  so.max_tokens = total;
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
  model::Session session(*mdl, so);
  prefill_with_progress(session, ids, {}, "dump");
  std::filesystem::create_directories(o.out_dir);
  for (const auto& [l, d] : dumps) {
    const std::string file = fmt::format("{}/layer{:02d}.mkvd", o.out_dir, l);
    write_qkv_dump(file, d);
    fmt::print("{}\n", file);
  }
  fmt::print(stderr,
             "masskv dump: {} layer(s) of {} ({} tokens of context, {} queries each); study "
             "them with masskv study --generators dump:{}/layer{:02d}.mkvd\n",
             dumps.size(), path, depth, o.steps, o.out_dir, layers.front());
}

}  // namespace

void register_dump(CLI::App& app) {
  auto o = std::make_shared<DumpOptions>();
  CLI::App* d = app.add_subcommand(
      "dump",
      "Write a model's real q/k/v (per layer: the keys and values of a context of real text and "
      "the queries of the tokens after it) for masskv study --generators dump:FILE");
  d->add_option("-m,--model", o->model,
                "Model: smollm2 (SmolLM2-135M-Instruct), gemma3 (Gemma 3 270M) or a GGUF path")
      ->capture_default_str();
  d->add_option("-f,--file", o->text, "Text (default: the Debian Policy Manual)");
  d->add_option("-d,--depth", o->depth, "Context tokens (K suffix allowed)")->capture_default_str();
  d->add_option("-l,--layers", o->layers, "Layers to dump (comma-separated; default: all)")
      ->delimiter(',');
  d->add_option("--steps", o->steps, "Query tokens after the context")->capture_default_str();
  d->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  d->add_option("-o,--out-dir", o->out_dir, "Write layerNN.mkvd files here")->capture_default_str();
  d->callback([o] { run_dump(*o); });
}

}  // namespace masskv::cli
