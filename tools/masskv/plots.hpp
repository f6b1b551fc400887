// Python helpers in scripts/: PNG plots (matplotlib) and the llama.cpp peer; the CLI only calls
// them.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace masskv::cli {

// scripts/<script> next to the working directory or the executable's ../scripts (build dirs
// one or two levels down); empty when absent.
std::filesystem::path find_script(const std::string& script);
// `s` in single quotes for /bin/sh.
std::string shell_quote(const std::string& s);
// The python3 that runs `script` (a path from find_script): the project's virtual environment
// beside its scripts folder (<repo>/.venv/bin/python3, where scripts/setup.sh installs the
// pinned matplotlib and llama-cpp-python), else python3 on PATH; shell-quoted.
std::string script_python(const std::filesystem::path& script);

// Runs `script_python scripts/<script> args...` (the scripts folder next to the working directory
// or the executable's ../scripts). A missing script, python or matplotlib is a warning on stderr
// naming `command`, never an error: the tables are the product, the plots a view of them.
void run_plot_script(const std::string& command, const std::string& script,
                     const std::vector<std::string>& args);

}  // namespace masskv::cli
