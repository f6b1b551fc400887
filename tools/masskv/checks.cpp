#include "checks.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <thread>

#include "masskv/error.hpp"
#include "parse.hpp"

namespace masskv::cli {
namespace {

bool parse_int(std::string_view s, std::int64_t& v) {
  if (!s.empty() && s.front() == '+') s.remove_prefix(1);
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

bool parse_real(const std::string& s, double& v) {
  if (s.empty()) return false;
  char* end = nullptr;
  v = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

}  // namespace

CLI::Validator int_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        std::int64_t v = 0;
        if (!parse_int(s, v) || v < lo || v > hi) {
          return fmt::format("expected an integer in {}, got '{}'", range, s);
        }
        return {};
      },
      "INT in " + range);
}

CLI::Validator real_in(double lo, double hi, bool lo_open) {
  const std::string range = fmt::format("{}{:g}, {:g}]", lo_open ? "(" : "[", lo, hi);
  return CLI::Validator(
      [lo, hi, lo_open, range](std::string& s) -> std::string {
        double v = NAN;
        if (!parse_real(s, v) || !std::isfinite(v) || v < lo || v > hi || (lo_open && v == lo)) {
          return fmt::format("expected a finite number in {}, got '{}'", range, s);
        }
        return {};
      },
      "NUM in " + range);
}

CLI::Validator count_in(std::int64_t lo, std::int64_t hi) {
  const std::string range = fmt::format("[{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& s) -> std::string {
        std::int64_t v = 0;
        try {
          v = s == "0" ? 0 : parse_count(s, "");  // parse_count's counts are > 0
        } catch (const Error&) {
          return fmt::format("expected a count like 4096, 32K or 1M in {}, got '{}'", range, s);
        }
        if (v < lo || v > hi) return fmt::format("{} is outside {}", s, range);
        s = std::to_string(v);  // as a transform: "8K" -> "8192" for an integer option
        return {};
      },
      "COUNT in " + range);
}

CLI::Validator page_size() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        std::int64_t v = 0;
        if (!parse_int(s, v) || v < 1 || v > 256 || (v & (v - 1)) != 0) {
          return fmt::format("expected a power of two in [1, 256], got '{}'", s);
        }
        return {};
      },
      "power of 2 in [1, 256]");
}

std::int64_t max_threads() {
  const unsigned cores = std::thread::hardware_concurrency();
  return 4 * static_cast<std::int64_t>(cores > 0 ? cores : 1);
}

CLI::Validator threads(std::int64_t lo) {
  const std::int64_t cap = max_threads();
  return CLI::Validator(
      [lo, cap](std::string& s) -> std::string {
        std::int64_t v = 0;
        if (!parse_int(s, v) || v < lo || v > cap) {
          return fmt::format(
              "expected {} to {} threads (4 × the {} cores; more only oversubscribes them{}), "
              "got '{}'",
              lo, cap, cap / 4, lo == 0 ? "; 0: all cores" : "", s);
        }
        return {};
      },
      fmt::format("INT in [{}, {}]{}", lo, cap, lo == 0 ? ", 0: all cores" : ""));
}

void add_head_shape(CLI::App* app, int& hq, int& hkv, int& head_dim, int& page) {
  app->add_option("--hq", hq, "Query heads")->check(int_in(1, 1024))->capture_default_str();
  app->add_option("--hkv", hkv, "KV heads (--hq a multiple of it)")
      ->check(int_in(1, 1024))
      ->capture_default_str();
  app->add_option("--head-dim", head_dim, "Head dimension")
      ->check(int_in(1, 1024))
      ->capture_default_str();
  add_page(app, page);
}

CLI::Option* add_page(CLI::App* app, int& page, const std::string& help) {
  return app->add_option("--page", page, help)->check(page_size())->capture_default_str();
}

CLI::Option* add_alpha(CLI::App* app, double& alpha, const std::string& help) {
  return app->add_option("--alpha", alpha, help)->check(real_in(1, 2, true))->capture_default_str();
}

CLI::Option* add_alpha(CLI::App* app, std::vector<double>& alphas, const std::string& help) {
  return app->add_option("--alpha", alphas, help)
      ->delimiter(',')
      ->check(real_in(1, 2, true))
      ->capture_default_str();
}

CLI::Option* add_top_p_mass(CLI::App* app, double& mass, const std::string& help) {
  return app->add_option("--top-p-mass", mass, help)
      ->check(real_in(0, 1, true))
      ->capture_default_str();
}

CLI::Option* add_kv_dtype(CLI::App* app, std::string& dtype) {
  return app->add_option("--kv-dtype", dtype, "KV storage type: f32, f16, bf16")
      ->capture_default_str();
}

CLI::Option* add_budget_fractions(CLI::App* app, std::vector<std::string>& budgets) {
  return app
      ->add_option("--budget", budgets,
                   "Budgets as fractions of the context (caps for the adaptive selectors)")
      ->delimiter(',')
      ->capture_default_str();
}

CLI::Option* add_mappings(CLI::App* app, std::vector<std::string>& mappings) {
  return app->add_option("--mapping", mappings, "softmax, entmax<alpha> (entmax1.5, entmax2)")
      ->delimiter(',')
      ->capture_default_str();
}

CLI::Option* add_no_plots(CLI::App* app, bool& plots) {
  return app->add_flag("!--no-plots", plots, "Skip the PNG plots");
}

void add_kept_items(CLI::App* app, int& sink_pages, int& window) {
  app->add_option("--sink-pages", sink_pages, "Pages at the start always kept")
      ->check(int_in(0, kMaxTokens))
      ->capture_default_str();
  app->add_option("--window", window,
                  "Most recent tokens always kept (their pages; the last page always is)")
      ->check(int_in(0, kMaxTokens))
      ->capture_default_str();
}

void check_head_shape(int hq, int hkv) {
  require(hq > 0 && hkv > 0 && hq % hkv == 0, ErrorCode::invalid_argument, "--hq",
          "must be a positive multiple of --hkv (", hq, " vs ", hkv, ")");
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) : 0.0;
}

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024 * 1024) {
    return fmt::format("{:.1f} TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  }
  if (bytes >= 1024.0 * 1024 * 1024)
    return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024));
  return fmt::format("{:.0f} KiB", bytes / 1024.0);
}

double require_memory(double bytes, const std::string& option, const std::string& what) {
  // 3/4 of physical memory leaves room for the rest of the process and the system; a shape
  // past it would swap or die in std::bad_alloc long after the command started.
  const double limit = 0.75 * physical_memory_bytes();
  require(limit <= 0 || bytes <= limit, ErrorCode::invalid_argument, option, "needs ",
          format_bytes(bytes), " for ", what, ", more than 3/4 of this machine's ",
          format_bytes(physical_memory_bytes()), " of memory: choose a smaller shape");
  return bytes;
}

CLI::Option* add_dry_run(CLI::App* app, bool& flag) {
  return app->add_flag("--dry-run", flag,
                       "Check the options, print the plan (settings, sizes, memory) and stop");
}

bool dry_run_plan(bool dry, const CLI::App& app,
                  const std::vector<std::pair<std::string, std::string>>& facts) {
  if (!dry) return false;
  fmt::print("masskv {}: dry run, the options are valid; plan:\n", app.get_name());
  // CLI11's config writer lists every option with its value (defaults included).
  fmt::print("{}", app.config_to_str(true, false));
  for (const auto& [name, value] : facts) fmt::print("{}={}\n", name, value);
  return true;
}

}  // namespace masskv::cli
