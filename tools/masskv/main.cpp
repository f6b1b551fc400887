#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "commands.hpp"
#include "masskv/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "masskv: sparse long-context attention that reads only the KV cache that "
      "carries attention mass"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "masskv 0.1.0");
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
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const masskv::Error& e) {
    fmt::print(stderr, "masskv: error ({}): {}\n", masskv::to_string(e.code()), e.what());
    return 2;
  } catch (const std::exception& e) {
    fmt::print(stderr, "masskv: error: {}\n", e.what());
    return 1;
  }
  return 0;
}
