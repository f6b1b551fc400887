#include "plots.hpp"

#include <fmt/core.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace masskv::cli {

std::string shell_quote(const std::string& s) {
  std::string q(1, '\'');
  for (const char c : s) {
    if (c == '\'') {
      q.append("'\\''");
    } else {
      q.push_back(c);
    }
  }
  q.push_back('\'');
  return q;
}

std::filesystem::path find_script(const std::string& script) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (const fs::path& dir : {fs::path("scripts"), exe.parent_path() / ".." / "scripts",
                              exe.parent_path() / ".." / ".." / "scripts"}) {
    if (fs::exists(dir / script, ec)) return dir / script;
  }
  return {};
}

std::string script_python(const std::filesystem::path& script) {
  const std::filesystem::path venv = script.parent_path().parent_path() / ".venv/bin/python3";
  std::error_code ec;
  return std::filesystem::exists(venv, ec) ? shell_quote(venv.string()) : "python3";
}

void run_plot_script(const std::string& command, const std::string& script,
                     const std::vector<std::string>& args) {
  const std::filesystem::path path = find_script(script);
  if (path.empty()) {
    fmt::print(stderr, "masskv {}: warning: scripts/{} not found; no plots\n", command, script);
    return;
  }
  const std::string python = script_python(path);
  if (std::system((python + " -c 'import matplotlib' >/dev/null 2>&1").c_str()) != 0) {
    fmt::print(stderr,
               "masskv {}: warning: {} has no matplotlib (scripts/setup.sh installs it into "
               "the project's .venv); no plots\n",
               command, python);
    return;
  }
  std::string cmd = python + " " + shell_quote(path.string());
  for (const std::string& a : args) {
    cmd.push_back(' ');
    cmd.append(shell_quote(a));
  }
  if (std::system(cmd.c_str()) != 0) {
    fmt::print(stderr, "masskv {}: warning: plotting failed ({})\n", command, cmd);
  }
}

}  // namespace masskv::cli
