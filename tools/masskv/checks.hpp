// Range checks of CLI values, as CLI11 validators: every subcommand attaches one to each
// numeric option, so a bad value is refused while the command line is parsed (before any model
// is loaded or any work starts), the message names the option, and --help shows the range.
// main() turns every such refusal into exit status 2. One definition per kind of value here,
// never a copy per subcommand.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace masskv::cli {

// Upper end of the ranges limited only by what a machine can hold: 2^31 - 1 tokens.
inline constexpr std::int64_t kMaxTokens = (std::int64_t{1} << 31) - 1;

// An integer in [lo, hi] (decimal digits, optional sign; no suffix).
CLI::Validator int_in(std::int64_t lo, std::int64_t hi);
// A finite real in [lo, hi] ((lo, hi] when lo_open): NaN and infinities are refused.
CLI::Validator real_in(double lo, double hi, bool lo_open = false);
// A token count with an optional K/M suffix (parse_count) in [lo, hi]; attached with
// ->transform() it also rewrites the value to digits, for an integer option.
CLI::Validator count_in(std::int64_t lo, std::int64_t hi);
// A KV page size: a power of two in [1, 256] (kv::CacheConfig's rule).
CLI::Validator page_size();
// Threads: 0 (all cores) up to max_threads(); more only oversubscribes the cores (10,000
// threads turned a 5-token prefill into 97 s), so it is refused with the cap in the message.
CLI::Validator threads(std::int64_t lo = 0);
std::int64_t max_threads();  // 4 × the cores

// --page: a KV page size (page_size()), for every command with pages.
CLI::Option* add_page(CLI::App* app, int& page, const std::string& help = "Page size (tokens)");
// --hq, --hkv, --head-dim and --page of the commands on synthetic or dumped shapes (bench attn,
// bench dist, study, bench select): one definition with their ranges, [1, 1024] heads and dims
// (past any real model's; larger shapes only stall the command), pages as page_size().
void add_head_shape(CLI::App* app, int& hq, int& hkv, int& head_dim, int& page);
// --sink-pages and --window, the always-kept items of every selector (run, perplexity, bench,
// bench attn, study, reuse, eval): one definition with their ranges.
void add_kept_items(CLI::App* app, int& sink_pages, int& window);
// --hq a positive multiple of --hkv (GQA). Throws Error naming --hq.
void check_head_shape(int hq, int hkv);

// Memory guard: refuses (Error invalid_argument naming `option`) a shape whose buffers would
// need more than 3/4 of the machine's physical memory, saying how much it would need, instead
// of ending in std::bad_alloc; returns `bytes` for plans. `what` names the buffers.
double require_memory(double bytes, const std::string& option, const std::string& what);
// "1.5 GiB", "730 MiB", ...
std::string format_bytes(double bytes);
double physical_memory_bytes();

// --alpha: an entmax α in (1, 2]; a list of them (convert).
CLI::Option* add_alpha(CLI::App* app, double& alpha, const std::string& help);
CLI::Option* add_alpha(CLI::App* app, std::vector<double>& alphas, const std::string& help);
// --top-p-mass: the mass a top_p selector aims for, in (0, 1] (--top-p is run's sampling).
CLI::Option* add_top_p_mass(
    CLI::App* app, double& mass,
    const std::string& help = "Target estimated mass of the top_p selector");
// --kv-dtype: the KV storage type of the kernel benchmarks (f32, f16, bf16; parse_dtype).
CLI::Option* add_kv_dtype(CLI::App* app, std::string& dtype);
// --budget and --mapping as lists (study, reuse): fractions of the context, and softmax or
// entmax<alpha> (parse_mapping).
CLI::Option* add_budget_fractions(CLI::App* app, std::vector<std::string>& budgets);
CLI::Option* add_mappings(CLI::App* app, std::vector<std::string>& mappings);
// --no-plots: skip the PNG plots (plots is true unless given).
CLI::Option* add_no_plots(CLI::App* app, bool& plots);
// --dry-run on a subcommand: validate, print the plan, do no work.
CLI::Option* add_dry_run(CLI::App* app, bool& flag);
// The plan of a dry run on stdout: every option's value as given or defaulted, then `facts`
// (name, value) the command derived (lengths, memory). Returns true when `dry` (the caller
// then returns), so a command writes `if (dry_run_plan(...)) return;` once, after validating.
bool dry_run_plan(bool dry, const CLI::App& app,
                  const std::vector<std::pair<std::string, std::string>>& facts = {});

}  // namespace masskv::cli
