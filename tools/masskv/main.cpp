#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "dialect.hpp"
#include "masskv/error.hpp"
#include "masskv_version.hpp"  // generated: MASSKV_GIT_COMMIT

int main(int argc, char** argv) {
  CLI::App app{
      "masskv: sparse long-context attention that reads only the KV cache that "
      "carries attention mass"};
  app.require_subcommand(1);
  // The command line's refusals read like the commands' own ("masskv: error: --page: ...").
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    return "masskv: error: " + CLI::FailureMessage::simple(a, e);
  });
  app.set_version_flag("--version", std::string("masskv 0.1.0 (commit ") + MASSKV_GIT_COMMIT +
                                         "; " + MASSKV_BUILD_INFO + ")");
  masskv::cli::register_bench(app);
  std::string cmdline = "masskv";
  for (int i = 1; i < argc; ++i) cmdline += std::string(" ") + argv[i];
  masskv::cli::register_study(app, cmdline);
  masskv::cli::register_model_commands(app);
  masskv::cli::register_dump(app);
  masskv::cli::register_reuse(app, cmdline);
  masskv::cli::register_convert(app);
  masskv::cli::register_distill(app);
  masskv::cli::register_eval(app, cmdline);
  masskv::cli::register_selector(app);
  try {
    masskv::cli::refuse_old_spellings(app);
    masskv::cli::check_dialect(app);  // one meaning per short letter (docs/cli.md)
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the message (it names the option); every refusal of the command line exits
    // with 2, as a refusal by the commands themselves does, so scripts test one status.
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  } catch (const masskv::Error& e) {
    fmt::print(stderr, "masskv: error ({}): {}\n", masskv::to_string(e.code()), e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "masskv: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
