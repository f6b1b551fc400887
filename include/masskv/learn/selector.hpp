// The learned selector's file (docs/design.md §2.8, §2.9; docs/learned.md): how the trainer
// (`masskv distill`) saves a selector and the CLI loads one. What a selector is and how the
// forward pass projects with it: model/learned_selector.hpp (learn/ includes model/, not the
// reverse).
#pragma once

#include <string>

#include "masskv/model/learned_selector.hpp"

namespace masskv::learn {

// A small GGUF (general.architecture = "masskv-selector"; docs/learned.md lists the keys and
// tensors): readable by any GGUF tool. Throws Error(io, "path") for I/O and Error(invalid_argument, "path") for a malformed file.
void save(const Selector& selector, const std::string& path);
Selector load(const std::string& path);

}  // namespace masskv::learn
