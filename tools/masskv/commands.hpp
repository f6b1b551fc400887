// Subcommands of the masskv CLI; each registers itself on the parent app.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace masskv::cli {

// `bench` (its subcommands attn and select, and without one the model benchmark).
void register_bench(CLI::App& app);
// `bench dist`: context-parallel decode with threads as ranks (bench_dist.cpp).
void register_bench_dist(CLI::App& bench);
// `bench keys`: selector key formats on real keys, bytes and page recall (bench_keys.cpp).
void register_bench_keys(CLI::App& bench);
// The llama-bench-style model benchmark on `bench` itself (bench_model.cpp).
void register_bench_model(CLI::App& bench);
// `study`, and `bench select` under the existing `bench` (call after register_bench);
// `cmdline` is recorded in the study's outputs.
void register_study(CLI::App& app, const std::string& cmdline);
// `run` and `perplexity` on a GGUF model (run_model.cpp).
void register_model_commands(CLI::App& app);
// `reuse`: selections reused across decode steps or layers, on dumped q/k/v (reuse.cpp).
void register_reuse(CLI::App& app, const std::string& cmdline);
// `dump`: a model's real q/k/v for `study` (dump.cpp).
void register_dump(CLI::App& app);
// `convert`: fits an entmax conversion of a model (convert.cpp).
void register_convert(CLI::App& app);
// `distill`: learned selectors from a model's dense attention (distill.cpp).
void register_distill(CLI::App& app);
// `eval`: long-context tasks, dense against every selector (eval.cpp).
void register_eval(CLI::App& app, const std::string& cmdline);
// `selector init`: learned-selector files made without training (selector_init.cpp).
void register_selector(CLI::App& app);

}  // namespace masskv::cli
