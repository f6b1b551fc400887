// `masskv selector init`: a learned-selector file made without training (learn/construct.hpp):
// the analytic mean-score selector or a seeded random one, for measuring the decode path and
// as baselines until `masskv distill` has trained one.
#include <fmt/core.h>

#include <memory>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/construct.hpp"
#include "masskv/model/locate.hpp"

namespace masskv::cli {
namespace {

struct InitOptions {
  std::string model = "smollm2";
  std::string kind = "mean_score";
  std::string input = "qk";
  std::string groups = "1";
  int dim = 32;
  bool rope = false;
  std::vector<int> layers;
  std::uint64_t seed = 1;
  std::string out;
};

void run_init(const InitOptions& o) {
  const auto mdl = model::Model::load(model::resolve_model(o.model).string());
  const model::ModelConfig& c = mdl->config();
  require(o.groups == "1" || o.groups == "kv", ErrorCode::invalid_argument, "--groups",
          "1 (head-collapsed) or kv (one per kv group), got '", o.groups, "'");
  const int groups = o.groups == "1" ? 1 : c.n_head_kv;
  learn::Selector s;
  if (o.kind == "mean_score") {
    require(o.input == "qk" && !o.rope, ErrorCode::invalid_argument, "--input",
            "mean_score is a qk selector without --rope");
    s = learn::mean_score_selector(c, groups, o.layers);
  } else {
    require(o.kind == "random", ErrorCode::invalid_argument, "--kind",
            "mean_score or random, got '", o.kind, "'");
    require(o.input == "qk" || o.input == "hidden", ErrorCode::invalid_argument, "--input",
            "qk or hidden, got '", o.input, "'");
    s = learn::random_selector(c, o.input == "qk" ? learn::Input::qk : learn::Input::hidden, groups,
                               o.dim, o.rope, o.seed, o.layers);
  }
  learn::save(s, o.out);
  fmt::print("{}: {} selector, input {}, {} layer(s), groups {}, d_s {}{}\n", o.out, o.kind,
             s.input == learn::Input::qk ? "qk" : "hidden", s.layers.size(), s.layers[0].groups,
             s.layers[0].dim, s.layers[0].rope ? ", rope" : "");
}

}  // namespace

void register_selector(CLI::App& app) {
  auto* sel = app.add_subcommand("selector", "Learned-selector files (docs/design.md §2.8)");
  sel->require_subcommand(1);
  sel->footer(
      "Examples:\n"
      "  masskv selector init --out out/mean.gguf\n"
      "  masskv selector init --kind random --dim 16 --seed 3 --out out/random.gguf");
  auto o = std::make_shared<InitOptions>();
  auto* init = sel->add_subcommand(
      "init",
      "Write a selector made without training: mean_score (analytic, qk input: ŝ = the mean of "
      "the model's own q·k scores over the heads served; d_s = head_dim x kv heads per group) "
      "or random (seeded, for measuring the decode path)");
  add_model(init, o->model,
            "Model: smollm2, gemma3 or a GGUF path (the selector is checked against it)");
  init->add_option("--kind", o->kind, "mean_score or random")->capture_default_str();
  init->add_option("--input", o->input, "random: qk (post-RoPE q/k) or hidden (attention input)")
      ->capture_default_str();
  init->add_option("--groups", o->groups, "1 (head-collapsed) or kv (one selector per kv group)")
      ->capture_default_str();
  init->add_option("--dim", o->dim, "random: d_s")->check(int_in(1, 4096))->capture_default_str();
  init->add_flag("--rope", o->rope, "random, hidden input: RoPE on the d_s projections");
  init->add_option("--layers", o->layers, "Layers (default: all)")->delimiter(',');
  add_seed(init, o->seed, "random: seed");
  add_out_file(init, o->out, "Selector file to write")->required();
  init->footer(
      "Examples:\n"
      "  masskv selector init --kind mean_score --out out/mean.gguf\n"
      "  masskv selector init --kind random --input hidden --dim 16 --rope --layers 3,7 "
      "--out out/r.gguf");
  init->callback([o] { run_init(*o); });
}

}  // namespace masskv::cli
