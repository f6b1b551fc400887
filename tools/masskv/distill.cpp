// `masskv distill`: learned selectors (docs/design.md §2.8, docs/learned.md) distilled from a
// frozen model's dense attention on real text — collection of the activations of every chosen layer
// (one dense prefill per sequence, streamed to a cache directory), then per layer Adam on
// KL(p_dense ‖ softmax(ŝ)) — written as one selector file, with the loss curves (CSV + PNG)
// and a held-out summary (KL, recall at 1/16 against a random-init selector, the Quest page
// bound and the attention-mass oracle).
#include <fmt/core.h>
#include <fmt/os.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/activations.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/learn/train.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "plots.hpp"
#include "progress.hpp"
#include "text.hpp"

namespace masskv::cli {
namespace {

namespace fs = std::filesystem;

struct DistillOptions {
  std::string model = "smollm2";
  std::string text;
  std::string layers;  // empty: every layer that selects at decode
  std::string input = "qk";
  std::string groups = "collapsed";
  std::string init;  // empty: pca for qk, random for hidden
  learn::TrainConfig train;
  std::string tokens = "4K";
  int sequences = 6;
  int queries = 160;
  int threads = 0;
  std::string output = "out/distill/selector.gguf";
  std::string cache_dir;
  bool keep_activations = false;
  bool dry_run = false;
};

// Where a run's activation files live: one directory per collection setting, so a rerun with
// other training settings reuses them (--keep-activations).
fs::path cache_directory(const DistillOptions& o, const std::string& model_path, int groups,
                         std::int64_t tokens) {
  if (!o.cache_dir.empty()) return o.cache_dir;
  const std::string key = fmt::format(
      "{}|{}|{}|{}|{}|{}|{}|{}|{}", model_path, fs::file_size(model_path), o.input, groups,
      tokens, o.sequences, o.queries, o.train.seed, o.text);
  const char* home = std::getenv("XDG_CACHE_HOME");
  const fs::path base = home != nullptr && *home != '\0'
                            ? fs::path(home)
                            : fs::path(std::getenv("HOME") != nullptr ? std::getenv("HOME") : "/tmp") / ".cache";
  return base / "masskv" / "distill" / fmt::format("{:016x}", std::hash<std::string>{}(key));
}

std::string path_with(const fs::path& out, const std::string& suffix) {
  return (out.parent_path() / (out.stem().string() + suffix)).string();
}

void write_curves(const std::string& path, const std::vector<learn::LayerReport>& reports) {
  auto f = fmt::output_file(path);
  f.print("layer,step,train_kl,heldout_kl\n");
  for (const auto& r : reports) {
    for (const auto& p : r.curve) f.print("{},{},{:.6g},{:.6g}\n", r.layer, p.step, p.train_kl, p.heldout_kl);
  }
}

std::string summary_table(const std::vector<learn::LayerReport>& reports, const std::string& init) {
  std::string s = fmt::format(
      "| layer | KL {} init | KL trained | recall trained | recall random init | recall Quest | "
      "recall oracle | train / held-out queries | seconds |\n"
      "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
      init);
  learn::Measures mean_i, mean_t, mean_r;
  for (const auto& r : reports) {
    s += fmt::format("| {} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {} / {} | {:.1f} |\n",
                     r.layer, r.init.kl, r.trained.kl, r.trained.recall, r.random.recall,
                     r.trained.quest, r.trained.oracle, r.train_queries, r.heldout_queries,
                     r.seconds);
    mean_i.kl += r.init.kl;
    mean_t.kl += r.trained.kl;
    mean_t.recall += r.trained.recall;
    mean_r.recall += r.random.recall;
    mean_t.quest += r.trained.quest;
    mean_t.oracle += r.trained.oracle;
  }
  const auto n = static_cast<double>(reports.size());
  double seconds = 0;
  for (const auto& r : reports) seconds += r.seconds;
  s += fmt::format("| mean | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | {:.3f} | | {:.1f} total |\n",
                   mean_i.kl / n, mean_t.kl / n, mean_t.recall / n, mean_r.recall / n,
                   mean_t.quest / n, mean_t.oracle / n, seconds);
  return s;
}

void run_distill(DistillOptions o, const CLI::App& app) {
  set_threads(o.threads);
  const learn::Input input = learn::parse_input(o.input);
  o.train.init = learn::parse_init(o.init.empty() ? (input == learn::Input::qk ? "pca" : "random")
                                                  : o.init);
  o.train.validate(input);
  require(o.sequences >= 2, ErrorCode::invalid_argument, "--sequences",
          "must be >= 2 (the last one is held out), got ", o.sequences);
  require(o.queries >= 1, ErrorCode::invalid_argument, "--queries", "must be >= 1, got ", o.queries);
  const std::int64_t tokens = parse_count(o.tokens, "--tokens");
  const std::string model_path = model::resolve_model(o.model).string();
  auto mdl = model::Model::load(model_path);
  const model::ModelConfig& c = mdl->config();
  require(tokens <= c.n_ctx_train, ErrorCode::invalid_argument, "--tokens", tokens,
          " exceeds the model's context ", c.n_ctx_train);
  const int groups = learn::parse_groups(o.groups, c.n_head_kv);

  std::vector<int> layers, local;
  for (const int l : o.layers.empty() ? learn::parse_layer_list(fmt::format("0-{}", c.n_layer - 1), c.n_layer)
                                      : learn::parse_layer_list(o.layers, c.n_layer)) {
    (c.is_local[static_cast<std::size_t>(l)] != 0 ? local : layers).push_back(l);
  }
  if (!local.empty()) {
    fmt::print(stderr,
               "masskv distill: skipping {} sliding-window layer(s) ({}): decode keeps their "
               "window, they need no selector\n",
               local.size(), fmt::join(local, ","));
  }
  require(!layers.empty(), ErrorCode::invalid_argument, "--layers", "no global layer chosen");
  if (dry_run_plan(o.dry_run, app,
                   {{"model_path", model_path},
                    {"layers", fmt::format("{}", fmt::join(layers, ","))}})) {
    return;
  }

  const fs::path out(o.output);
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path());
  const fs::path dir = cache_directory(o, model_path, groups, tokens);
  fs::create_directories(dir);

  // Collect the layers whose activation file is not there yet.
  std::vector<int> missing;
  for (const int l : layers) {
    if (!fs::exists(learn::activation_path(dir.string(), l))) missing.push_back(l);
  }
  if (!missing.empty()) {
    const auto seqs = learn::text_sequences(mdl->tokenizer(), load_text(o.text, "-f"), o.sequences,
                                            tokens);
    learn::CollectConfig cc;
    cc.layers = missing;
    cc.input = input;
    cc.groups = groups;
    cc.queries = o.queries;
    cc.seed = o.train.seed;
    Progress bar(fmt::format("collect {} layer(s)", missing.size()), static_cast<long>(tokens) * o.sequences);
    std::int64_t shown = 0;
    learn::collect_activations(*mdl, seqs, cc, dir.string(), [&](std::int64_t done, std::int64_t) {
      bar.advance(static_cast<long>(done - shown));
      shown = done;
    });
    bar.finish();
  } else {
    fmt::print(stderr, "masskv distill: reusing the activations in {}\n", dir.string());
  }

  learn::Selector sel;
  sel.input = input;
  sel.architecture = mdl->file().get<std::string>("general.architecture");
  sel.n_layer = c.n_layer;
  sel.n_embd = c.n_embd;
  sel.n_head = c.n_head;
  sel.n_head_kv = c.n_head_kv;
  sel.head_dim = c.head_dim;
  std::vector<learn::LayerReport> reports;
  const std::string curves = path_with(out, "_curves.csv");
  Progress bar("distill", static_cast<long>(layers.size()) * o.train.steps);
  for (const int l : layers) {
    const std::string file = learn::activation_path(dir.string(), l);
    const learn::LayerActivations data = learn::read_activations(file);
    learn::LayerReport report;
    sel.layers.push_back(learn::train_layer(data, c, o.train, report, [&](int step, double loss) {
      bar.advance();
      if (step % 10 == 0) bar.set_note(fmt::format("layer {} KL {:.3f}", l, loss));
    }));
    reports.push_back(std::move(report));
    // Written after every layer: a stopped run keeps the layers it finished.
    learn::save(sel, out.string());
    write_curves(curves, reports);
    if (!o.keep_activations) fs::remove(file);
  }
  bar.finish();
  if (!o.keep_activations) {
    std::error_code ec;
    fs::remove(dir, ec);  // only when empty
  }
  const std::string png = path_with(out, "_curves.png");
  run_plot_script("distill", "plot_distill.py", {curves, png});
  const std::string table = summary_table(reports, o.train.init == learn::Init::pca ? "pca" : "random");
  fmt::print("{}", table);
  {
    auto f = fmt::output_file(path_with(out, "_summary.md"));
    f.print("{}", table);
  }
  fmt::print(stderr,
             "masskv distill: {} layer(s), input {}, groups {}, dim {}{} -> {} (curves {}, {})\n"
             "  held-out: the last of {} sequences of {} tokens; recall = dense attention mass in "
             "the top pages at 1/16 of the prefix, page 16\n",
             layers.size(), o.input, o.groups, o.train.dim, o.train.rope ? ", rope" : "",
             out.string(), curves, png, o.sequences, tokens);
}

}  // namespace

void register_distill(CLI::App& app) {
  auto o = std::make_shared<DistillOptions>();
  CLI::App* d = app.add_subcommand(
      "distill",
      "Distil learned selectors (docs/design.md §2.8) from a frozen model's dense attention on "
      "real text: per layer W_q, W_k with softmax((W_q x_q)·(W_k x_k)) ≈ the layer's attention "
      "(docs/learned.md)");
  add_model(d, o->model);
  add_file(d, o->text, "Text (default: the Debian Policy Manual)");
  d->add_option("--layers", o->layers,
                "Layers, e.g. 0-29 or 3,5,7 (default: all; Gemma 3's sliding-window layers are "
                "always skipped: decode keeps their window)");
  d->add_option("--dim", o->train.dim, "Selector dims d_s (even with --rope)")
      ->check(int_in(1, 4096))
      ->capture_default_str();
  d->add_option("--input", o->input,
                "Selector input: qk (the model's post-RoPE q and k) or hidden (the attention "
                "input after the attention norm)")
      ->capture_default_str();
  d->add_option("--groups", o->groups,
                "collapsed (one selector, target the mean over all q heads) or kv (one per kv "
                "group, target the mean over the group's q heads)")
      ->capture_default_str();
  d->add_flag("--rope", o->train.rope,
              "hidden input: apply the layer's RoPE to both projections (relative position)");
  d->add_option("--init", o->init, "pca (qk only) or random (default: pca for qk, random for hidden)");
  d->add_option("--steps", o->train.steps, "Adam steps per layer")
      ->check(int_in(0, 1 << 24))
      ->capture_default_str();
  d->add_option("--lr", o->train.lr, "Adam step size (cosine decay to lr x --lr-final)")
      ->check(real_in(0, 10, true))
      ->capture_default_str();
  d->add_option("--lr-final", o->train.lr_final, "Final step size as a fraction of --lr")
      ->check(real_in(0, 1, true))
      ->capture_default_str();
  d->add_option("--batch", o->train.batch, "Query positions per step")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  d->add_option("--tokens", o->tokens,
                "Tokens per sequence (K suffix allowed; at most the model's context)")
      ->check(count_in(16, kMaxTokens))
      ->capture_default_str();
  d->add_option("--sequences", o->sequences,
                "Sequences of real text (windows spread over it); the last one is held out")
      ->check(int_in(2, 1 << 16))
      ->capture_default_str();
  d->add_option("--queries", o->queries,
                "Query positions sampled per sequence (density proportional to the position)")
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
  d->add_option("--eval-every", o->train.eval_every, "Steps between held-out points of the curve")
      ->check(int_in(1, 1 << 24))
      ->capture_default_str();
  add_seed(d, o->train.seed, "Seed (query positions, init, minibatches)");
  add_threads(d, o->threads);
  add_out_file(d, o->output,
               "Selector file (GGUF); the loss curves (_curves.csv, _curves.png) and the summary "
               "(_summary.md) go next to it")
      ->capture_default_str();
  d->add_option("--cache-dir", o->cache_dir,
                "Activation files (default: ~/.cache/masskv/distill/<hash of the collection settings>)");
  d->add_flag("--keep-activations", o->keep_activations,
              "Keep the activation files (a rerun with the same collection settings reuses them)");
  d->footer(
      "Examples:\n"
      "  masskv distill --out out/distill/selector.gguf\n"
      "  masskv distill --layers 2-5 --dim 32 --steps 200 -t 0\n"
      "  masskv distill --input hidden --rope --groups kv --out out/distill/hidden.gguf");
  add_dry_run(d, o->dry_run);
  d->callback([o, d] { run_distill(*o, *d); });
}

}  // namespace masskv::cli
