// PNG plots are drawn by Python scripts in scripts/ (matplotlib); the CLI only calls them.
#pragma once

#include <string>
#include <vector>

namespace masskv::cli {

// Runs `python3 scripts/<script> args...` (the scripts folder next to the working directory or
// the executable's ../scripts). A missing script, python or matplotlib is a warning on stderr
// naming `command`, never an error: the tables are the product, the plots a view of them.
void run_plot_script(const std::string& command, const std::string& script,
                     const std::vector<std::string>& args);

}  // namespace masskv::cli
