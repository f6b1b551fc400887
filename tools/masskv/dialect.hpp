// The one CLI dialect (docs/cli.md): every short letter any masskv command takes is defined here,
// once, with llama.cpp's meaning (-m model, -t threads with 0 = all cores, -c context, -n tokens
// to generate, -f file, -p prompt, -s seed, -b batch; llama-bench's -d depth and -r
// repetitions), plus -o FORMAT (md, csv, json, jsonl) with --out FILE and -O DIR for paths.
// Commands register these letters through the add_* functions below and every other option by
// its long name only. check_dialect() refuses, at start-up, a short letter outside the table;
// refuse() turns an old spelling into a refusal (exit 2) that names the new one.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace masskv::cli {

// One row of the letter table: the letter, its long names (the first is the one messages use)
// and its meaning, as docs/cli.md has them.
struct Letter {
  std::string_view name;   // "-m"
  std::string_view longs;  // "--model"; several with '|'
  std::string_view meaning;
};
std::span<const Letter> dialect_letters();

inline constexpr const char* kModelHelp =
    "Model: smollm2 (SmolLM2-135M-Instruct), gemma3 (Gemma 3 270M) or a GGUF path";

// -m, --model: one model.
CLI::Option* add_model(CLI::App* app, std::string& model, const std::string& help = kModelHelp);
// -m, --model given several times or comma-separated (bench: one row group per model).
CLI::Option* add_models(CLI::App* app, std::vector<std::string>& models);
// -t, --threads: 0 (all cores) up to 4 × the cores.
CLI::Option* add_threads(CLI::App* app, int& threads,
                         const std::string& help = "Threads (0: all cores)");
// -t, --threads as a list of thread counts (bench, bench attn); 0 is all cores there too:
// resolve_threads turns it into the core count before the rows are made.
CLI::Option* add_thread_list(CLI::App* app, std::vector<int>& threads, const std::string& help);
void resolve_threads(std::vector<int>& threads);
// -c, --ctx-size: a context length in tokens (K/M suffixes) in [lo, 2^31 - 1].
CLI::Option* add_ctx_size(CLI::App* app, std::int64_t& ctx, std::int64_t lo,
                          const std::string& help);
// -p, --prompt: the prompt text (run).
CLI::Option* add_prompt_text(CLI::App* app, std::string& prompt);
// -p, --n-prompt and -n, --n-gen: the prompt and generated tokens of bench's tests
// (llama-bench's; K/M suffixes, 0 skips the test).
CLI::Option* add_prompt_tokens(CLI::App* app, std::int64_t& tokens);
CLI::Option* add_gen_tokens(CLI::App* app, std::int64_t& tokens);
// -n, --n-predict: tokens to generate (run).
CLI::Option* add_n_predict(CLI::App* app, int& n);
// -f, --file: a text file.
CLI::Option* add_file(CLI::App* app, std::string& file, const std::string& help);
// -s, --seed.
CLI::Option* add_seed(CLI::App* app, std::uint64_t& seed, const std::string& help);
// -b, --batch: sequences decoded together, one forward pass per step, in [lo, hi];
// add_batch_list: a list of batch sizes (bench).
CLI::Option* add_batch(CLI::App* app, int& batch, std::int64_t lo, std::int64_t hi,
                       const std::string& help);
CLI::Option* add_batch_list(CLI::App* app, std::vector<int>& batch, std::int64_t hi,
                            const std::string& help);
// -d, --depth (also llama-bench's --n-depth): context lengths / tokens already in the cache
// (K/M suffixes) in [lo, 2^31 - 1]; a list, or one value (add_depth).
CLI::Option* add_depths(CLI::App* app, std::vector<std::string>& depths, std::int64_t lo,
                        const std::string& help);
CLI::Option* add_depth(CLI::App* app, std::string& depth, const std::string& help);
// -r, --repetitions: timed repetitions of each test, in [1, 2^20].
CLI::Option* add_repetitions(CLI::App* app, int& reps, const std::string& help);

// Where results go: -o FORMAT (md, csv, json, jsonl) and --out FILE (default stdout).
struct Output {
  std::string format = "md";
  std::string path;  // empty: stdout
};
void add_output(CLI::App* app, Output& out);
// --out FILE of a command that writes one file (convert, distill, selector init).
CLI::Option* add_out_file(CLI::App* app, std::string& path, const std::string& help);
// -O, --out-dir DIR.
CLI::Option* add_out_dir(CLI::App* app, std::string& dir, const std::string& help);

// The results of a command, one flat object per row (in column order). The markdown table is
// the command's own (`md`, for people: "75.91 ± 0.12", "1.00×" are fine there); csv, json and
// jsonl are made here from `rows`, numbers only, one value per field: json an array of the
// rows, jsonl one row a line, csv a header of every scalar key then a line a row (arrays such
// as per-repetition times are left out of it; false/true are 0/1, an absent or NaN value is
// empty). With --out FILE the results go there and the markdown table still to stdout;
// without, stdout gets the one format asked for.
using Rows = nlohmann::ordered_json;
void write_results(const Output& out, const Rows& rows, const std::function<void(std::FILE*)>& md);
std::string to_csv(const Rows& rows);

// The spellings of before the dialect (docs/cli.md "Old spellings", one table in dialect.cpp):
// each becomes a refusal (exit 2) naming the new spelling. A letter that now means something
// else in that command keeps its new meaning, and a value the new meaning refuses gets the note
// (`masskv study -s quest`: "... (-s is the seed in masskv now, docs/cli.md: use
// --selectors)"); otherwise the old spelling is a hidden option that always refuses
// (`masskv study -m softmax`: "-m: the model in every masskv command (docs/cli.md), not an
// option of study: use --mapping"). main() calls it once every command is registered.
void refuse_old_spellings(CLI::App& root);
// Throws std::logic_error when a (visible) option of `app` or its subcommands has a short
// letter outside the table, or the letter with a long name the table does not give it. main()
// runs it before parsing, so a new option cannot bring in a second dialect.
void check_dialect(const CLI::App& app);

}  // namespace masskv::cli
