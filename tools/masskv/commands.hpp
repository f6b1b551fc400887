// Subcommands of the masskv CLI; each registers itself on the parent app.
#pragma once

#include <CLI/CLI.hpp>

namespace masskv::cli {

void register_bench(CLI::App& app);

}  // namespace masskv::cli
