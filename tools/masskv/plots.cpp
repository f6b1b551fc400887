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

void run_plot_script(const std::string& command, const std::string& script,
                     const std::vector<std::string>& args) {
  const std::filesystem::path path = find_script(script);
  if (path.empty()) {
    fmt::print(stderr, "masskv {}: warning: scripts/{} not found; no plots\n", command, script);
    return;
  }
  if (std::system("python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    fmt::print(stderr,
               "masskv {}: warning: python3 with matplotlib not available "
               "(python3 -m pip install matplotlib); no plots\n",
               command);
    return;
  }
  std::string cmd = "python3 " + shell_quote(path.string());
  for (const std::string& a : args) {
    cmd.push_back(' ');
    cmd.append(shell_quote(a));
  }
  if (std::system(cmd.c_str()) != 0) {
    fmt::print(stderr, "masskv {}: warning: plotting failed ({})\n", command, cmd);
  }
}

}  // namespace masskv::cli
