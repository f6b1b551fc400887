// Decode attention (one query token per sequence) over a paged cache, dense or sparse,
// softmax or entmax (DESIGN.md §1, §2.6).
#pragma once

#include <span>
#include <string_view>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/mapping.hpp"
#include "masskv/select/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::attn {

// Which implementation runs a stage. `fast` picks the best available (SIMD + threads).
enum class Impl { scalar, simd, fast };
std::string_view to_string(Impl impl);

struct DecodeArgs {
  View3<const float> q;       // [B][Hq][d]; Hq a multiple of the cache's num_kv_heads
  kv::PagedKVView cache;      // page table with B sequences
  Mapping mapping = Mapping::softmax();
  float scale = 0;            // score scale; 0 means 1/sqrt(d)
  // nullptr: dense. Otherwise only the listed pages / tokens are read. The partial last
  // page is *not* added implicitly: selectors add it (DESIGN.md §3).
  const SelectionView* selection = nullptr;
  View3<float> out;           // [B][Hq][d]
  // Per (b, q head): softmax: log-sum-exp of the scaled scores (natural log; -inf for an
  // empty selection). entmax: the threshold tau on z = (alpha-1)*s (NaN for an empty
  // selection). May be empty.
  std::span<float> lse_or_tau;
  // Split-K: tokens of one (sequence, kv head) are cut into chunks of this many pages,
  // merged by §2.6. Fixed, so results do not depend on the thread count.
  int chunk_pages = 64;
  Impl impl = Impl::fast;
};

// Validates args (throws masskv::Error naming the argument) and runs.
// Empty selection for a head: softmax -> out = 0, lse = -inf; entmax -> out = 0, tau = NaN
// (entmax over an empty set is undefined; zero output mirrors softmax's convention).
void decode(const DecodeArgs& args);

// f64 reference: plain loops, no chunking. Output in double, [B][Hq][d] contiguous.
void decode_reference(const DecodeArgs& args, std::span<double> out, std::span<double> lse_or_tau);

}  // namespace masskv::attn
