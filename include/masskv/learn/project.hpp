// The learned selector's projections (learn::project, check_model, rope_inv_freq) are declared in
// model/learned_selector.hpp, beside the forward pass that computes them (docs/design.md §2.8);
// this header keeps the includes of the trainer and the tools that name it working (with the
// selector file and the model, as before).
#pragma once

#include "masskv/learn/selector.hpp"
#include "masskv/model/learned_selector.hpp"
#include "masskv/model/model.hpp"
