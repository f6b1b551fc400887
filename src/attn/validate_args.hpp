// Argument checks shared by decode, prefill and their references: every check runs before any
// output is written, and every failure names the argument (docs/design.md §6).
#pragma once

#include "masskv/attn/decode.hpp"
#include "masskv/attn/prefill.hpp"

namespace masskv::attn::detail {

// Sizes every stage needs after validation.
struct Geometry {
  int batch = 0, num_q_heads = 0, num_kv_heads = 0, group = 0, head_dim = 0;
  float scale = 0;  // resolved (0 -> 1/sqrt(d))
};

Geometry validate(const DecodeArgs& args);
Geometry validate(const PrefillArgs& args);

// Throws Error(unsupported, "head_dim") unless the kernels support d.
void require_supported_head_dim(int d);

}  // namespace masskv::attn::detail
