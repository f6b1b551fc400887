#include <CLI/CLI.hpp>

int main(int argc, char** argv) {
  CLI::App app{"masskv: sparse long-context attention"};
  app.require_subcommand(1);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
