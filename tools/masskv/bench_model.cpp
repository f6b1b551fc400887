// `masskv bench` (no subcommand): llama-bench-style model benchmark. For each thread count and
// depth: the depth is prefilled once (untimed, random token ids as llama-bench), then every
// repetition of a test runs on a fork of it (copy-on-write pages), so repetitions start from
// the same cache: ppN = prefill N tokens, tgN = decode N tokens one by one through the
// selector, tgNxB (-b) = B forks decode N tokens each in lockstep, one forward pass per step
// (model::decode_batch). Reported per test: tokens/s (mean ± sd), KV and summary bytes read
// per decoded token, bytes per token in all (weights + KV + summaries), the dense-over-sparse
// bytes ratio (the bound on the speed-up of a memory-bound decode) and the process's peak
// RSS. With --peer llama.cpp the same tests run on llama.cpp (scripts/llamacpp_bench.py) in
// the same invocation and each row gets the ratio ours / llama.cpp.
// With --sparse-prefill the ppN test also runs under that sparse prefill (docs/prefill.md) and
// a time-to-first-token table puts dense and sparse side by side with the attainable bound:
// dense TTFT / (dense time outside attention + dense attention time × the attended fraction),
// the speed-up if sparse attention cost exactly its share of dense attention and nothing else
// changed.
// GCC 12 warns -Wrestrict inside CLI11's Formatter::make_option_usage (std::string's operator+)
// when it is inlined into this file: a false positive of GCC 12's, which -Werror builds (CI)
// would stop on.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wrestrict"
#include <CLI/CLI.hpp>
#pragma GCC diagnostic pop
#include <fmt/core.h>
#include <fmt/format.h>
#include <omp.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "checks.hpp"
#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"
#include "model_options.hpp"
#include "parse.hpp"
#include "plots.hpp"

namespace masskv::cli {
namespace {

using Clock = std::chrono::steady_clock;
using model::TokenId;

struct BenchOptions {
  ModelOptions m;                              // m.model: unused, the models are `models`
  std::vector<std::string> models{"smollm2"};  // one row group each
  std::vector<int> threads{1};
  std::int64_t prompt = 512, gen = 128;
  std::vector<std::string> depth{"0"};
  std::vector<int> batch{1};  // decode batch sizes (sessions per forward pass)
  int reps = 3;
  Output out;
  std::string peer;  // "" or llama.cpp
  std::uint64_t seed = 1;
  // Sparse prefill of the ppN test (empty: dense only).
  std::string sparse_prefill, prefill_budget = "1/16";
  int prefill_k_block = 64;
  std::int64_t prefill_min_keys = 0;
  bool dry_run = false;
};

// One test result (ours or the peer's).
struct Row {
  std::string model, arch;  // -m as given (a name, or a file's name), the architecture
  double size_mb = NAN;     // of the GGUF file (MiB)
  std::string backend, attention, test;
  int threads = 0;
  std::int64_t depth = 0, tokens = 0;
  std::vector<double> seconds;
  double kv_bytes = NAN, summary_bytes = NAN, total_bytes = NAN, dense_bytes = NAN;
  double peak_rss_mb = NAN;
  double ratio_vs_peer = NAN;
  // Prefill rows: attention seconds (selection included), selection seconds and the attended
  // fraction of (query, key) pairs, means over the repetitions.
  double attn_seconds = NAN, select_seconds = NAN, attended = NAN;

  double tps_mean() const {
    double s = 0;
    for (double x : seconds) s += static_cast<double>(tokens) / x;
    return s / static_cast<double>(seconds.size());
  }
  double tps_sd() const {
    const double m = tps_mean();
    double s = 0;
    for (double x : seconds) s += std::pow(static_cast<double>(tokens) / x - m, 2);
    return seconds.size() > 1 ? std::sqrt(s / static_cast<double>(seconds.size() - 1)) : 0.0;
  }
  std::string name() const { return depth > 0 ? fmt::format("{} @ d{}", test, depth) : test; }
};

Row make_row(std::string backend, std::string attention, std::string test, int threads,
             std::int64_t depth, std::int64_t tokens) {
  Row r;
  r.backend = std::move(backend);
  r.attention = std::move(attention);
  r.test = std::move(test);
  r.threads = threads;
  r.depth = depth;
  r.tokens = tokens;
  return r;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // Linux: kilobytes
}

std::vector<TokenId> random_tokens(std::mt19937_64& rng, int vocab, std::int64_t n) {
  std::uniform_int_distribution<TokenId> pick(0, vocab - 1);
  std::vector<TokenId> t(static_cast<std::size_t>(n));
  for (auto& x : t) x = pick(rng);
  return t;
}

select::PrefillSelectConfig sparse_prefill_config(const BenchOptions& o) {
  select::PrefillSelectConfig c;
  c.method = select::parse_prefill_method(o.sparse_prefill, "--sparse-prefill");
  c.k_block = o.prefill_k_block;
  c.budget = parse_prefill_budget(o.prefill_budget, "--prefill-budget");
  c.budget.min_keys = o.prefill_min_keys;
  require(c.method != select::PrefillMethod::dense, ErrorCode::invalid_argument, "--sparse-prefill",
          "dense is the row every run has: name a sparse method");
  require(c.k_block == 16 || c.k_block == 64 || c.k_block == 128, ErrorCode::invalid_argument,
          "--prefill-k-block", "must be 16, 64 or 128, got ", c.k_block);
  require(c.budget.min_keys >= 0, ErrorCode::invalid_argument, "--prefill-min-keys",
          "must be >= 0, got ", c.budget.min_keys);
  require(c.method != select::PrefillMethod::learned || !o.m.selector_file.empty(),
          ErrorCode::invalid_argument, "--selector-file",
          "--sparse-prefill learned needs a selector file (masskv distill)");
  return c;
}

std::string sparse_label(const BenchOptions& o) {
  return fmt::format("sparse prefill {}{} {}{}", o.sparse_prefill,
                     o.sparse_prefill == "token" ? "" : std::to_string(o.prefill_k_block),
                     o.prefill_budget,
                     o.prefill_min_keys > 0 ? fmt::format(" (>= {})", o.prefill_min_keys) : "");
}

// Our rows for one thread count and depth.
std::vector<Row> bench_ours(const model::Model& mdl, const BenchOptions& o, int threads,
                            std::int64_t depth, std::int64_t n_prompt, std::int64_t n_gen,
                            std::mt19937_64& rng) {
  set_threads(threads);
  const auto& cfg = mdl.config();
  const std::int64_t longest = std::max(n_prompt, n_gen);
  model::SessionOptions so;
  so.max_tokens = depth + longest + 1;
  so.page_size = o.m.page_size;
  // Every fork of the largest batch alive at once.
  so.fork_pages = *std::max_element(o.batch.begin(), o.batch.end()) *
                  (static_cast<int>((longest + 16) / o.m.page_size) + 2);
  const std::string mapping_label = set_attention(o.m, mdl, so);
  apply_selector(o.m, depth + n_gen, so);
  model::Session base(mdl, so);
  std::vector<float> logits(static_cast<std::size_t>(cfg.n_vocab));
  const auto depth_tokens = random_tokens(rng, cfg.n_vocab, depth);
  if (depth > 0) prefill_with_progress(base, depth_tokens, logits, fmt::format("depth {}", depth));
  // Bytes one KV row (one token of one kv head of one layer) takes.
  const double row_bytes =
      base.kv_bytes_per_token() / (static_cast<double>(cfg.n_layer) * cfg.n_head_kv);
  std::string attention = selector_label(o.m, so.selector);
  if (so.mapping.is_entmax()) attention += " (" + mapping_label + ")";
  std::vector<Row> rows;
  if (n_prompt > 0) {
    const auto toks = random_tokens(rng, cfg.n_vocab, n_prompt);
    // The ppN test on forks of `root` (dense, or a sparse prefill's base).
    const auto pp = [&](model::Session& root, const std::string& label) {
      Row r = make_row("masskv", label, fmt::format("pp{}", n_prompt), threads, depth, n_prompt);
      double attn = 0, sel = 0, att = 0;
      for (int rep = -1; rep < o.reps; ++rep) {  // rep -1: warm-up, not timed
        model::Session s = root.fork();
        const auto t0 = Clock::now();
        s.prefill(rep < 0
                      ? std::span<const TokenId>(toks).first(std::min<std::size_t>(16, toks.size()))
                      : std::span<const TokenId>(toks),
                  logits);
        if (rep < 0) continue;
        r.seconds.push_back(seconds_since(t0));
        const model::PrefillStats& st = s.last_prefill_stats();
        attn += st.attention_seconds;
        sel += st.select_seconds;
        att += st.keys_attended / st.keys_dense;
      }
      r.attn_seconds = attn / o.reps;
      r.select_seconds = sel / o.reps;
      r.attended = att / o.reps;
      r.peak_rss_mb = peak_rss_mb();
      rows.push_back(r);
    };
    pp(base, "dense");
    if (!o.sparse_prefill.empty()) {
      model::SessionOptions sso = so;
      sso.sparse_prefill = sparse_prefill_config(o);
      if (sso.sparse_prefill.method == select::PrefillMethod::learned) {
        sso.learned_selector = load_selector(o.m.selector_file);
      }
      model::Session sparse_base(mdl, sso);
      if (depth > 0) {  // the same depth tokens, sparse too (untimed)
        prefill_with_progress(sparse_base, depth_tokens, logits, fmt::format("depth {}", depth));
      }
      pp(sparse_base, sparse_label(o));
    }
  }
  for (const int B : n_gen > 0 ? o.batch : std::vector<int>{}) {
    // tgN decodes one fork; tgNxB decodes B forks in lockstep, one forward pass per step.
    const std::string test = B == 1 ? fmt::format("tg{}", n_gen) : fmt::format("tg{}x{}", n_gen, B);
    Row r = make_row("masskv", attention, test, threads, depth, n_gen * B);
    const auto b = static_cast<std::size_t>(B);
    const auto toks = random_tokens(rng, cfg.n_vocab, n_gen * B);
    std::vector<float> batch_logits(b * static_cast<std::size_t>(cfg.n_vocab));
    double read = 0, total = 0, selector = 0, steps = 0;
    for (int rep = -1; rep < o.reps; ++rep) {
      std::vector<model::Session> forks;
      std::vector<model::Session*> batch;
      for (std::size_t i = 0; i < b; ++i) forks.push_back(base.fork());
      for (model::Session& f : forks) batch.push_back(&f);
      const std::size_t count = rep < 0 ? 1 : static_cast<std::size_t>(n_gen);
      const auto t0 = Clock::now();
      for (std::size_t i = 0; i < count; ++i) {
        model::decode_batch(batch, std::span<const TokenId>(toks).subspan(i * b, b), batch_logits);
        if (rep < 0) continue;
        for (const model::Session& f : forks) {
          read += f.last_decode_stats().kv_tokens_read;
          total += f.last_decode_stats().kv_tokens_total;
          selector += f.last_decode_stats().selector_rows;
          steps += 1;
        }
      }
      if (rep >= 0) r.seconds.push_back(seconds_since(t0));
    }
    // What the selectors read besides the selected rows, as each step counted it
    // (select/read_cost.hpp: the layers that selected, the stores their method reads), in
    // units of one dense K+V row.
    r.kv_bytes = read / steps * row_bytes;
    r.summary_bytes = selector / steps * row_bytes;
    const double weights = mdl.weight_bytes_per_token() / B;  // a batch's rows share them
    r.total_bytes = weights + r.kv_bytes + r.summary_bytes;
    r.dense_bytes = weights + total / steps * row_bytes;
    r.peak_rss_mb = peak_rss_mb();
    rows.push_back(r);
  }
  return rows;
}

// The peer's rows: runs scripts/llamacpp_bench.py and parses its JSON lines.
std::vector<Row> bench_peer(const std::string& path, const BenchOptions& o,
                            const std::vector<std::int64_t>& depths, std::int64_t n_prompt,
                            std::int64_t n_gen) {
  const std::filesystem::path script = find_script("llamacpp_bench.py");
  require(!script.empty(), ErrorCode::io, "--peer", "cannot find scripts/llamacpp_bench.py");
  auto join = [](const auto& v) { return fmt::format("{}", fmt::join(v, ",")); };
  const std::string cmd = fmt::format("{} {} {} -p {} -n {} -d {} -t {} -r {} --seed {}",
                                      script_python(script), shell_quote(script.string()),
                                      shell_quote(path), n_prompt,
                                      n_gen, join(depths), join(o.threads), o.reps, o.seed);
  fmt::print(stderr, "peer: {}\n", cmd);
  FILE* pipe = popen(cmd.c_str(), "r");
  require(pipe != nullptr, ErrorCode::io, "--peer", "cannot run python3");
  std::vector<Row> rows;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr) {
    const auto j = nlohmann::json::parse(buf.data(), nullptr, false);
    if (j.is_discarded() || !j.contains("test")) continue;
    Row r = make_row("llama.cpp", "dense", j["test"].get<std::string>(), j["threads"].get<int>(),
                     j["depth"].get<std::int64_t>(), j["tokens"].get<std::int64_t>());
    r.seconds = j["seconds"].get<std::vector<double>>();
    rows.push_back(r);
  }
  const int rc = pclose(pipe);
  require(rc == 0, ErrorCode::io, "--peer", "scripts/llamacpp_bench.py failed (exit status ",
          WIFEXITED(rc) ? WEXITSTATUS(rc) : rc, ")");
  return rows;
}

std::string fmt_or_dash(double v, const char* spec) {
  return std::isnan(v) ? std::string("-") : fmt::format(fmt::runtime(spec), v);
}

// The rows for csv/json/jsonl: numbers only, one per field (tokens/s mean and sd apart, ratios
// as plain numbers, per-repetition seconds as a list the CSV leaves out).
Rows result_rows(const std::vector<Row>& rows) {
  Rows all = Rows::array();
  for (const Row& r : rows) {
    Rows j{{"model", r.model},         {"arch", r.arch},       {"size_mib", r.size_mb},
           {"backend", r.backend},     {"threads", r.threads}, {"attention", r.attention},
           {"test", r.test},           {"depth", r.depth},     {"tokens", r.tokens},
           {"tps_mean", r.tps_mean()}, {"tps_sd", r.tps_sd()}, {"seconds", r.seconds}};
    auto put = [&](const char* k, double v) {
      if (!std::isnan(v)) j[k] = v;
    };
    put("kv_bytes_per_token", r.kv_bytes);
    put("summary_bytes_per_token", r.summary_bytes);
    put("bytes_per_token", r.total_bytes);
    put("dense_bytes_per_token", r.dense_bytes);
    put("dense_over_ours_bytes", r.dense_bytes / r.total_bytes);
    put("ratio_vs_llama_cpp", r.ratio_vs_peer);
    put("peak_rss_mib", r.peak_rss_mb);
    put("attention_seconds", r.attn_seconds);
    put("select_seconds", r.select_seconds);
    put("attended_fraction", r.attended);
    all.push_back(j);
  }
  return all;
}

// The markdown table, for people: one row group per model, in the order of -m.
void print_table(std::FILE* f, const std::vector<Row>& rows) {
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = "| ";
    for (std::size_t i = 0; i < cells.size(); ++i) s += (i ? " | " : "") + cells[i];
    fmt::print(f, "{} |\n", s);
  };
  line({"model", "size MiB", "backend", "threads", "attention", "test", "t/s", "KV MB/tok",
        "bytes MB/tok", "dense/ours bytes", "vs llama.cpp", "peak RSS MiB"});
  fmt::print(f,
             "| --- | ---: | --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (const Row& r : rows) {
    line({r.model, fmt::format("{:.1f}", r.size_mb), r.backend, fmt::format("{}", r.threads),
          r.attention, r.name(), fmt::format("{:.2f} ± {:.2f}", r.tps_mean(), r.tps_sd()),
          fmt_or_dash(r.kv_bytes / 1e6, "{:.3f}"), fmt_or_dash(r.total_bytes / 1e6, "{:.2f}"),
          fmt_or_dash(r.dense_bytes / r.total_bytes, "{:.2f}×"),
          fmt_or_dash(r.ratio_vs_peer, "{:.2f}×"), fmt_or_dash(r.peak_rss_mb, "{:.0f}")});
  }
}

double mean_seconds(const Row& r) {
  double s = 0;
  for (const double x : r.seconds) s += x;
  return s / static_cast<double>(r.seconds.size());
}

// Time to first token, dense against sparse prefill, each sparse ppN row next to the dense
// row of its threads and depth: bound = dense / (dense outside attention + dense attention ×
// attended fraction).
void print_ttft(std::FILE* f, const std::vector<Row>& rows) {
  bool header = false;
  for (const Row& sp : rows) {
    if (sp.backend != "masskv" || sp.test.rfind("pp", 0) != 0 || sp.attention == "dense") continue;
    for (const Row& d : rows) {
      if (d.model != sp.model || d.backend != sp.backend || d.test != sp.test ||
          d.attention != "dense" || d.threads != sp.threads || d.depth != sp.depth) {
        continue;
      }
      if (!header) {
        fmt::print(
            f,
            "\n| model | threads | test | sparse prefill | dense TTFT s | attention s (of dense) | "
            "sparse TTFT s | attention s (of sparse) | selection s | attended % | speed-up | "
            "bound | achieved / bound |\n| --- | ---: | --- | --- | ---: | ---: | ---: | ---: "
            "| ---: | ---: | ---: | ---: | ---: |\n");
        header = true;
      }
      const double td = mean_seconds(d), ts = mean_seconds(sp);
      const double bound = td / ((td - d.attn_seconds) + d.attn_seconds * sp.attended);
      fmt::print(
          f,
          "| {} | {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.2f} | {:.1f} | {:.2f}× | "
          "{:.2f}× | {:.2f} |\n",
          sp.model, sp.threads, sp.name(), sp.attention, td, d.attn_seconds, ts, sp.attn_seconds,
          sp.select_seconds, 100 * sp.attended, td / ts, bound, td / ts / bound);
    }
  }
}

// The name a model's rows carry: -m as given, or the file's name for a path.
std::string model_label(const std::string& m) {
  return std::filesystem::path(m).filename().string();
}

void run_bench_model(BenchOptions o, const CLI::App& app) {
  resolve_threads(o.threads);
  // Ranges are checked by the options' validators; here the combinations, before the models.
  if (!o.sparse_prefill.empty()) (void)sparse_prefill_config(o);  // bad options fail first
  require(!o.threads.empty(), ErrorCode::invalid_argument, "--threads", "needs at least one value");
  require(!o.batch.empty(), ErrorCode::invalid_argument, "--batch", "needs at least one value");
  require(!o.models.empty(), ErrorCode::invalid_argument, "--model", "needs at least one model");
  const std::int64_t n_prompt = o.prompt, n_gen = o.gen;
  require(n_prompt + n_gen > 0, ErrorCode::invalid_argument, "-p/-n", "both are 0");
  std::vector<std::int64_t> depths;
  for (const auto& d : o.depth) depths.push_back(d == "0" ? 0 : parse_count(d, "--depth"));
  const std::int64_t longest =
      *std::max_element(depths.begin(), depths.end()) + std::max(n_prompt, n_gen);
  validate(o.m, longest);
  std::vector<std::string> paths;
  for (const std::string& m : o.models) paths.push_back(model::resolve_model(m).string());
  std::vector<std::pair<std::string, std::string>> plan;
  for (const std::string& p : paths) plan.emplace_back("model_path", p);
  plan.emplace_back("longest_sequence", std::to_string(longest));
  if (dry_run_plan(o.dry_run, app, plan)) return;
  // Every model is loaded and checked before the first row is timed.
  std::vector<std::unique_ptr<model::Model>> models;
  for (std::size_t i = 0; i < paths.size(); ++i) {
    models.push_back(model::Model::load(paths[i]));
    require(longest <= models.back()->config().n_ctx_train, ErrorCode::invalid_argument, "--depth",
            "depth + max(-p, -n) = ", longest, " exceeds the context of ", o.models[i], ", ",
            models.back()->config().n_ctx_train);
  }
  // Before the long part: a missing peer is an error now, not after our rows.
  require(o.peer.empty() ||
              std::system((script_python(find_script("llamacpp_bench.py")) +
                           " -c 'import llama_cpp' >/dev/null 2>&1")
                              .c_str()) == 0,
          ErrorCode::unsupported, "--peer",
          "llama-cpp-python is not installed in the project's .venv (or python3): "
          "scripts/setup.sh --peer builds it (30-60 min on 2 cores)");
  std::vector<Row> rows;
  for (std::size_t i = 0; i < models.size(); ++i) {
    const model::Model& mdl = *models[i];
    std::mt19937_64 rng(o.seed);  // each model's rows from the same token ids
    std::vector<Row> group;
    for (int t : o.threads) {
      for (std::int64_t d : depths) {
        auto r = bench_ours(mdl, o, t, d, n_prompt, n_gen, rng);
        group.insert(group.end(), r.begin(), r.end());
      }
    }
    if (o.peer == "llama.cpp") {
      const auto peer = bench_peer(paths[i], o, depths, n_prompt, n_gen);
      for (Row& r : group) {
        for (const Row& p : peer) {
          if (p.test == r.test && p.depth == r.depth && p.threads == r.threads) {
            r.ratio_vs_peer = r.tps_mean() / p.tps_mean();
          }
        }
      }
      group.insert(group.end(), peer.begin(), peer.end());
    }
    for (Row& r : group) {
      r.model = model_label(o.models[i]);
      r.arch = model::to_string(mdl.config().arch);
      r.size_mb = static_cast<double>(std::filesystem::file_size(paths[i])) / (1024.0 * 1024.0);
    }
    rows.insert(rows.end(), group.begin(), group.end());
    fmt::print(stderr,
               "{}: weights read per decoded token: {:.2f} MB; dense/ours bytes is the bound on "
               "the decode speed-up when decode is memory-bound\n",
               o.models[i], mdl.weight_bytes_per_token() / 1e6);
  }
  write_results(o.out, result_rows(rows), [&](std::FILE* f) {
    print_table(f, rows);
    print_ttft(f, rows);
  });
}

}  // namespace

void register_bench_model(CLI::App& bench) {
  auto o = std::make_shared<BenchOptions>();
  add_models(&bench, o->models);
  add_model_options(&bench, o->m, {.model = true, .threads = true});
  add_thread_list(&bench, o->threads, "Thread counts");
  add_prompt_tokens(&bench, o->prompt);
  add_gen_tokens(&bench, o->gen);
  add_depths(&bench, o->depth, 0, "Depths: tokens already in the cache (e.g. 0,2048,7K)");
  add_batch_list(&bench, o->batch, 256, "Decode batch sizes (tgNxB: B forks per pass)");
  add_repetitions(&bench, o->reps, "Repetitions of each test");
  add_output(&bench, o->out);
  bench.add_option("--peer", o->peer, "Also run llama.cpp (llama-cpp-python) in the same run")
      ->check(CLI::IsMember({"llama.cpp"}));
  add_seed(&bench, o->seed, "Seed of the random token ids");
  bench.add_option("--sparse-prefill", o->sparse_prefill,
                   "Also run the ppN test with this sparse prefill (docs/prefill.md): token, "
                   "block, shared (oracles: need the dense pass), index (mean-pooled key blocks) "
                   "or learned (the --selector-file selector's block masses); prints time to "
                   "first token dense vs sparse and the attainable bound");
  bench
      .add_option("--prefill-budget", o->prefill_budget,
                  "Keys each query block attends, sinks and diagonal included: a fraction of "
                  "the keys before it (1/16) or tokens (2048)")
      ->capture_default_str();
  bench
      .add_option("--prefill-k-block", o->prefill_k_block,
                  "Key block of the sparse prefill: 16, 64 or 128")
      ->check(int_in(16, 128))
      ->capture_default_str();
  bench
      .add_option("--prefill-min-keys", o->prefill_min_keys,
                  "Floor of a fractional prefill budget, in keys")
      ->check(int_in(0, kMaxTokens))
      ->capture_default_str();
  add_dry_run(&bench, o->dry_run);
  bench.footer(
      "Examples:\n"
      "  masskv bench -p 512 -n 128 -t 0\n"
      "  masskv bench -m smollm2 -m gemma3 -p 0 -n 64 -d 0,4K --selector quest --budget 1/16 -o "
      "csv\n"
      "  masskv bench attn -d 32K -t 1,2   (and bench dist, keys, select: --help each)");
  bench.callback([&bench, o] {
    if (bench.get_subcommands().empty()) run_bench_model(*o, bench);
  });
}

}  // namespace masskv::cli
