// Causal prefill over a paged cache, dense or block-sparse (docs/design.md §4).
#pragma once

#include <cstdint>
#include <span>

#include "masskv/attn/decode.hpp"

namespace masskv::attn {

// Block mask for block-sparse prefill: per sequence, a [num_q_blocks][num_k_blocks] uint8
// matrix (1 = attend), row-major, starting at mask[mask_offset[b]]. Query block i covers the
// sequence's new tokens [i*q_block, (i+1)*q_block); key block j covers positions
// [j*k_block, (j+1)*k_block). Causality is applied inside selected blocks as well.
struct BlockMask {
  int q_block = 64;
  int k_block = 64;
  std::span<const std::uint8_t> mask;
  std::span<const std::int64_t> mask_offset;  // [B]
};

struct PrefillArgs {
  // New tokens of all sequences, ragged: sequence b's queries are rows
  // q_indptr[b] .. q_indptr[b+1]. They are the *last* tokens of the sequence in the cache
  // (already appended), so query i of b sits at position length(b) - n_b + i.
  View3<const float> q;                    // [total_q][Hq][d]
  std::span<const std::int32_t> q_indptr;  // [B + 1]
  kv::PagedKVView cache;
  Mapping mapping = Mapping::softmax();
  float scale = 0;                         // 0 means 1/sqrt(d)
  const BlockMask* block_mask = nullptr;   // nullptr: dense causal
  View3<float> out;                        // [total_q][Hq][d]
  std::span<float> lse_or_tau;             // [total_q][Hq], as in DecodeArgs; may be empty
  Impl impl = Impl::fast;
};

// Validates (as decode, plus "q_indptr" and "block_mask") and runs. A query that may attend
// no key (its mask row selects nothing before it) gets out = 0 and lse = -inf / tau = NaN.
void prefill(const PrefillArgs& args);
void prefill_reference(const PrefillArgs& args, std::span<double> out,
                       std::span<double> lse_or_tau);

}  // namespace masskv::attn
