// Decode attention (one query token per sequence) over a paged cache, dense or sparse,
// softmax or entmax (docs/design.md §1, §2.6).
#pragma once

#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/mapping.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::attn {

// Which implementation runs a stage: `scalar` (portable kernels, one thread), `simd` (AVX2
// kernels when the CPU has them, one thread), `fast` (SIMD + OpenMP threads). All three use
// the same chunking and merge order; simd and fast give the same bits.
enum class Impl { scalar, simd, fast };
std::string_view to_string(Impl impl);

// Context parallelism (dist/decode.hpp), entmax only: the call holds one rank's part of the
// keys, so the global threshold is fixed by an exchange between step 1 and step 2 of §2.6
// instead of being solved from this call's chunks alone.
struct EntmaxExchange {
  // Called once, on the calling thread, when every chunk's local candidates are known:
  // candidates[b * Hq + hq] holds q head hq's local candidate scores (merge.hpp step 1; empty
  // when the head has no rows here). Must write tau[b * Hq + hq], the global threshold on z,
  // wherever candidates is non-empty.
  std::function<void(std::span<const std::vector<double>> candidates, std::span<double> tau)>
      solve_tau;
  // [B][Hq]: receives sum p over this call's rows (0 where none). `out` holds the rows'
  // output normalised by it, so this call's EntmaxPartialView is (out * p_sum, p_sum).
  std::span<double> p_sum;
};

struct DecodeArgs {
  View3<const float> q;       // [B][Hq][d]; Hq a multiple of the cache's num_kv_heads
  kv::PagedKVView cache;      // page table with B sequences
  Mapping mapping = Mapping::softmax();
  float scale = 0;            // score scale; 0 means 1/sqrt(d)
  // nullptr: dense. Otherwise only the listed pages / tokens are read. The partial last
  // page is *not* added implicitly: selectors add it (docs/design.md §3).
  const SelectionView* selection = nullptr;
  View3<float> out;           // [B][Hq][d]
  // Per (b, q head): softmax: log-sum-exp of the scaled scores (natural log; -inf for an
  // empty selection). entmax: the threshold tau on z = (alpha-1)*s (NaN for an empty
  // selection). May be empty.
  std::span<float> lse_or_tau;
  // Split-K: tokens of one (sequence, kv head) are cut into chunks of this many pages
  // (token selections: chunk_pages * page_size selected tokens), merged by §2.6. Fixed, so
  // results do not depend on the thread count. Must be > 0.
  int chunk_pages = 64;
  Impl impl = Impl::fast;
  // Entmax only; nullptr: the call holds every key (the usual case).
  const EntmaxExchange* entmax_exchange = nullptr;
};

// Validates args (throws masskv::Error naming the argument: "q", "out", "lse_or_tau",
// "selection", "chunk_pages", "scale", "head_dim", "alpha", "entmax_exchange", and the
// cache's own names) before
// writing anything, then runs. head_dim must be a multiple of 8 up to 512 (unsupported
// otherwise). The KV values are not checked for NaN/inf (that would cost a full read).
// Empty selection for a head: softmax -> out = 0, lse = -inf; entmax -> out = 0, tau = NaN
// (entmax over an empty set is undefined; zero output mirrors softmax's convention).
// Entmax runs the exact two-step scheme of §2.6: V is read only at support rows.
void decode(const DecodeArgs& args);

// f64 reference: plain loops, no chunking, entmax by its own f64 bisection. Output in double,
// [B][Hq][d] contiguous; lse_or_tau [B][Hq] or empty.
void decode_reference(const DecodeArgs& args, std::span<double> out, std::span<double> lse_or_tau);

}  // namespace masskv::attn
