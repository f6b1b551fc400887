#include "dialect.hpp"

#include <fmt/core.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "checks.hpp"
#include "masskv/error.hpp"
#include "masskv/model/locate.hpp"

namespace masskv::cli {
namespace {

// docs/cli.md "Short letters" is this table.
constexpr std::array<Letter, 13> kLetters{{
    {"-m", "--model", "the model"},
    {"-t", "--threads", "the threads (0: all cores)"},
    {"-c", "--ctx-size", "the context length"},
    {"-n", "--n-predict|--n-gen", "the tokens to generate"},
    {"-p", "--prompt|--n-prompt", "the prompt"},
    {"-f", "--file", "a text file"},
    {"-s", "--seed", "the seed"},
    {"-b", "--batch", "the batch size"},
    {"-d", "--depth", "the depth (tokens in the cache)"},
    {"-r", "--repetitions", "the repetitions"},
    {"-o", "--output", "the output format (md, csv, json, jsonl)"},
    {"-O", "--out-dir", "the output folder"},
    {"-h", "--help", "the help"},
}};

const Letter* find_letter(std::string_view name) {
  for (const Letter& l : kLetters) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

// Old spellings: (command, the old spelling, the new one). docs/cli.md "Old spellings" is this
// table; -o used for a folder or a file is not in it (the -o format's own message names -O DIR
// and --out FILE).
struct OldSpelling {
  std::string_view command, old, now;
};
constexpr OldSpelling kOldSpellings[] = {
    {"study", "-m", "--mapping"},
    {"study", "-s", "--selectors"},
    {"study", "-b", "--budget"},
    {"study", "-g", "--generators"},
    {"study", "--context", "-c/--ctx-size"},
    {"study", "--top-p", "--top-p-mass"},
    {"study", "--json", "-o json --out FILE"},
    {"study", "--csv", "-o csv --out FILE"},
    {"reuse", "-m", "--mapping"},
    {"reuse", "-s", "--selectors"},
    {"reuse", "-b", "--budget"},
    {"reuse", "-i", "--inputs"},
    {"reuse", "-a", "--ages"},
    {"reuse", "--top-p", "--top-p-mass"},
    {"bench", "--json", "-o json (and --out FILE for a file)"},
    {"bench", "--csv", "-o csv (and --out FILE for a file)"},
    {"bench attn", "-m", "--mapping"},
    {"bench attn", "-b", "--budget"},
    {"bench attn", "--repeat", "-r/--repetitions"},
    {"bench attn", "--json", "-o json --out FILE"},
    {"bench attn", "--csv", "-o csv --out FILE"},
    {"bench dist", "-b", "--budget"},
    {"bench dist", "--json", "-o json --out FILE"},
    {"bench keys", "-m", "--mapping"},
    {"bench keys", "-b", "--budget"},
    {"bench keys", "-i", "--dumps"},
    {"bench keys", "-f", "--formats"},
    {"bench keys", "--top-p", "--top-p-mass"},
    {"bench keys", "--json", "-o json --out FILE"},
    {"bench select", "-s", "--selectors"},
    {"bench select", "-b", "--budget"},
    {"bench select", "--repeat", "-r/--repetitions"},
    {"bench select", "--json", "-o json --out FILE"},
    {"perplexity", "--json", "-o json --out FILE"},
    {"dump", "-l", "--layers"},
    {"dump", "-o", "-O/--out-dir DIR"},
    {"eval", "-o", "-O/--out-dir DIR"},
    {"eval", "--text", "-f/--file"},
    {"convert", "-o", "--out FILE"},
    {"convert", "--text", "-f/--file"},
    {"distill", "-o", "--out FILE"},
    {"selector init", "-l", "--layers"},
    {"selector init", "-o", "--out FILE"},
};

// `old` of `app` refused, naming `now`.
void refuse(CLI::App* app, const std::string& where, const std::string& old,
            const std::string& now) {
  const Letter* l = find_letter(old);
  if (CLI::Option* o = app->get_option_no_throw(old); o != nullptr) {
    // The letter means something else here now: a value that meaning refuses names both.
    CLI::Validator* v = o->get_validator();
    const CLI::Validator was = *v;
    const std::string note = fmt::format(" ({} is {} in masskv now, docs/cli.md: use {})", old,
                                         l != nullptr ? l->meaning : "taken", now);
    v->operation([was, note](std::string& s) {
      std::string e = was(s);
      return e.empty() ? e : e + note;
    });
    return;
  }
  const std::string msg =
      l != nullptr ? fmt::format(
                         "{} in every masskv command (docs/cli.md), not an option of {}: "
                         "use {}",
                         l->meaning, where, now)
                   : fmt::format("no longer a masskv option (docs/cli.md): use {}", now);
  // Hidden, and taking one value or none, so `--json` and `--json FILE`, `-m X` and `-m` all
  // end here rather than in CLI11's "not expected".
  app->add_option_function<std::vector<std::string>>(
         old, [old, msg](const std::vector<std::string>&) { throw CLI::ValidationError(old, msg); },
         "")
      ->group("")
      ->configurable(false)  // not in --dry-run's plan
      ->expected(0, 1);
}

CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::uint64_t v = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
        if (s.empty() || ec != std::errc() || end != s.data() + s.size()) {
          return fmt::format("expected a seed in [0, 2^64 - 1], got '{}'", s);
        }
        return {};
      },
      "INT in [0, 2^64 - 1]");
}

// A known model's name that is installed, or a file (what Model::load then reads).
CLI::Validator model_name_or_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::filesystem::path p;
        try {
          p = model::resolve_model(s);
        } catch (const Error& e) {
          return e.what();
        }
        std::error_code ec;
        if (!std::filesystem::is_regular_file(p, ec)) {
          return fmt::format("expected smollm2, gemma3 or a GGUF file, got '{}' (no such file)", s);
        }
        return {};
      },
      "");
}

CLI::Validator output_format() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        if (s == "md" || s == "csv" || s == "json" || s == "jsonl") return {};
        return fmt::format(
            "expected md, csv, json or jsonl, got '{}' (-o is the results' format: for a file "
            "use --out FILE, for a folder use -O DIR)",
            s);
      },
      "md|csv|json|jsonl");
}

// A path a file can be written to: not a folder, and no file where its folder would be.
CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (s.empty()) return "expected a file path";
        if (fs::is_directory(s, ec)) return fmt::format("'{}' is a folder, not a file", s);
        for (fs::path p = fs::path(s).parent_path(); !p.empty(); p = p.parent_path()) {
          if (fs::exists(p, ec)) {
            return fs::is_directory(p, ec) ? std::string()
                                           : fmt::format("'{}' is not a folder", p.string());
          }
          if (p == p.parent_path()) break;
        }
        return {};
      },
      "FILE");
}

std::string csv_cell(const Rows& v) {
  if (v.is_null()) return {};
  if (v.is_boolean()) return v.get<bool>() ? "1" : "0";
  if (v.is_number_float()) {
    const double x = v.get<double>();
    return std::isfinite(x) ? fmt::format("{}", x) : std::string();
  }
  if (v.is_number()) return v.dump();
  std::string s = v.get<std::string>();
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (const char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::span<const Letter> dialect_letters() { return kLetters; }

CLI::Option* add_model(CLI::App* app, std::string& model, const std::string& help) {
  return app->add_option("-m,--model", model, help)
      ->check(model_name_or_file())
      ->capture_default_str();
}

CLI::Option* add_models(CLI::App* app, std::vector<std::string>& models) {
  return app
      ->add_option("-m,--model", models,
                   std::string(kModelHelp) +
                       "; several (-m smollm2 -m gemma3, or comma-separated): one row group each")
      ->delimiter(',')
      ->check(model_name_or_file())
      ->capture_default_str();
}

CLI::Option* add_threads(CLI::App* app, int& threads, const std::string& help) {
  return app->add_option("-t,--threads", threads, help)
      ->check(cli::threads())
      ->capture_default_str();
}

CLI::Option* add_thread_list(CLI::App* app, std::vector<int>& threads, const std::string& help) {
  return app->add_option("-t,--threads", threads, help + ". Comma-separated; 0: all cores")
      ->delimiter(',')
      ->check(cli::threads())
      ->capture_default_str();
}

void resolve_threads(std::vector<int>& threads) {
  // The rows then show the count that 0 stood for.
  for (int& t : threads) t = t == 0 ? omp_get_num_procs() : t;
}

CLI::Option* add_ctx_size(CLI::App* app, std::int64_t& ctx, std::int64_t lo,
                          const std::string& help) {
  // transform: "8K" becomes "8192" before CLI11 reads the integer.
  return app->add_option("-c,--ctx-size", ctx, help + ". K/M suffixes")
      ->transform(count_in(lo, kMaxTokens))
      ->capture_default_str();
}

CLI::Option* add_prompt_text(CLI::App* app, std::string& prompt) {
  return app->add_option("-p,--prompt", prompt, "Prompt")->capture_default_str();
}

CLI::Option* add_prompt_tokens(CLI::App* app, std::int64_t& tokens) {
  return app
      ->add_option("-p,--n-prompt", tokens,
                   "Prompt tokens of the ppN test (K/M suffixes; 0: skip the test)")
      ->transform(count_in(0, kMaxTokens))
      ->capture_default_str();
}

CLI::Option* add_gen_tokens(CLI::App* app, std::int64_t& tokens) {
  return app
      ->add_option("-n,--n-gen", tokens,
                   "Generated tokens of the tgN test (K/M suffixes; 0: skip the test)")
      ->transform(count_in(0, kMaxTokens))
      ->capture_default_str();
}

CLI::Option* add_n_predict(CLI::App* app, int& n) {
  return app
      ->add_option("-n,--n-predict", n,
                   "Tokens to generate (prompt + n at most the model's context)")
      ->check(int_in(0, kMaxTokens))
      ->capture_default_str();
}

CLI::Option* add_file(CLI::App* app, std::string& file, const std::string& help) {
  return app->add_option("-f,--file", file, help);
}

CLI::Option* add_seed(CLI::App* app, std::uint64_t& seed, const std::string& help) {
  return app->add_option("-s,--seed", seed, help)->check(seed_value())->capture_default_str();
}

CLI::Option* add_batch(CLI::App* app, int& batch, std::int64_t lo, std::int64_t hi,
                       const std::string& help) {
  return app->add_option("-b,--batch", batch, help)->check(int_in(lo, hi))->capture_default_str();
}

CLI::Option* add_batch_list(CLI::App* app, std::vector<int>& batch, std::int64_t hi,
                            const std::string& help) {
  return app->add_option("-b,--batch", batch, help + ". Comma-separated")
      ->delimiter(',')
      ->check(int_in(1, hi))
      ->capture_default_str();
}

CLI::Option* add_depths(CLI::App* app, std::vector<std::string>& depths, std::int64_t lo,
                        const std::string& help) {
  return app->add_option("-d,--depth,--n-depth", depths, help + ". Comma-separated, K/M suffixes")
      ->delimiter(',')
      ->check(count_in(lo, kMaxTokens))
      ->capture_default_str();
}

CLI::Option* add_depth(CLI::App* app, std::string& depth, const std::string& help) {
  return app->add_option("-d,--depth", depth, help + ". K/M suffixes")
      ->check(count_in(1, kMaxTokens))
      ->capture_default_str();
}

CLI::Option* add_repetitions(CLI::App* app, int& reps, const std::string& help) {
  return app->add_option("-r,--repetitions", reps, help)
      ->check(int_in(1, 1 << 20))
      ->capture_default_str();
}

void add_output(CLI::App* app, Output& out) {
  app->add_option("-o,--output", out.format,
                  "Format of the results: md (a table), csv, json (an array of rows) or jsonl "
                  "(a row a line); numbers only in csv/json/jsonl")
      ->check(output_format())
      ->capture_default_str();
  app->add_option("--out", out.path,
                  "Write the results (in -o's format) to this file; the markdown table still "
                  "goes to stdout (default: the results to stdout)")
      ->check(writable_file());
}

CLI::Option* add_out_file(CLI::App* app, std::string& path, const std::string& help) {
  return app->add_option("--out", path, help)->check(writable_file());
}

CLI::Option* add_out_dir(CLI::App* app, std::string& dir, const std::string& help) {
  return app->add_option("-O,--out-dir", dir, help);
}

std::string to_csv(const Rows& rows) {
  std::vector<std::string> keys;
  for (const auto& row : rows) {
    for (const auto& [k, v] : row.items()) {
      if (!v.is_structured() && std::find(keys.begin(), keys.end(), k) == keys.end()) {
        keys.push_back(k);
      }
    }
  }
  std::string s;
  for (std::size_t i = 0; i < keys.size(); ++i) s += (i ? "," : "") + keys[i];
  s += "\n";
  for (const auto& row : rows) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (i) s += ",";
      if (const auto it = row.find(keys[i]); it != row.end()) s += csv_cell(*it);
    }
    s += "\n";
  }
  return s;
}

void write_results(const Output& out, const Rows& rows, const std::function<void(std::FILE*)>& md) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(nullptr, &std::fclose);
  std::FILE* f = stdout;
  if (!out.path.empty()) {
    const std::filesystem::path parent = std::filesystem::path(out.path).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    file.reset(std::fopen(out.path.c_str(), "w"));
    require(file != nullptr, ErrorCode::io, "--out", "cannot write ", out.path);
    f = file.get();
  }
  if (out.format == "md") {
    md(f);
  } else {
    if (f != stdout) md(stdout);
    if (out.format == "csv") {
      fmt::print(f, "{}", to_csv(rows));
    } else if (out.format == "jsonl") {
      for (const auto& row : rows) fmt::print(f, "{}\n", row.dump());
    } else {
      fmt::print(f, "{}\n", rows.dump(1));
    }
  }
  if (file) {
    require(std::fflush(f) == 0, ErrorCode::io, "--out", "cannot write ", out.path);
    fmt::print(stderr, "wrote {} ({})\n", out.path, out.format);
  }
}

void refuse_old_spellings(CLI::App& root) {
  for (const OldSpelling& o : kOldSpellings) {
    CLI::App* app = &root;
    std::string_view rest = o.command;
    while (!rest.empty()) {
      const std::size_t space = std::min(rest.find(' '), rest.size());
      app = app->get_subcommand(std::string(rest.substr(0, space)));  // throws if unknown
      rest.remove_prefix(std::min(space + 1, rest.size()));
    }
    refuse(app, std::string(o.command), std::string(o.old), std::string(o.now));
  }
}

void check_dialect(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    if (o->get_group().empty()) continue;  // refusals of old spellings
    for (const std::string& s : o->get_snames()) {
      const Letter* l = find_letter("-" + s);
      bool ok = l != nullptr;
      if (ok && !o->get_lnames().empty()) {  // the first long name is the letter's own
        const std::string own = "|" + std::string(l->longs) + "|";
        ok = own.find("|--" + o->get_lnames().front() + "|") != std::string::npos;
      }
      if (!ok) {
        throw std::logic_error(fmt::format(
            "masskv {}: option -{} ({}) is not in the CLI dialect (tools/masskv/dialect.cpp, "
            "docs/cli.md)",
            app.get_name(), s, o->get_name()));
      }
    }
  }
  for (const CLI::App* sub : app.get_subcommands({})) check_dialect(*sub);
}

}  // namespace masskv::cli
