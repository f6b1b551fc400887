// Split-K / distributed merge (docs/design.md §2.6). The one place both split-K decode and
// context parallelism combine partial results.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/mapping.hpp"

namespace masskv::attn {

// Softmax partial over a chunk of keys: o is normalised within the chunk, lse is the chunk's
// log-sum-exp of scaled scores, natural log. An empty chunk is (o = 0, lse = -inf); its o is
// never read (it may be nullptr).
// LSE base: masskv uses e everywhere. FlashInfer's merge state stores lse in base 2
// (lse_2 = lse_e * log2(e)); convert with lse_to_base2 / lse_from_base2 at the boundary.
struct SoftmaxPartialView {
  const float* o;  // [d]
  float lse;
};

// Merges partials in the given order (fixed order => deterministic):
// lse = logsumexp_c lse_c, o = sum_c exp(lse_c - lse) o_c. All-empty gives o = 0, lse = -inf
// (never NaN). Accumulates in double. Throws Error naming "d", "o" or "parts" (lse NaN or
// +inf: non_finite; a finite lse with o == nullptr: invalid_argument). Returns the merged lse.
float merge_softmax(std::span<const SoftmaxPartialView> parts, int d, float* o);

inline float lse_to_base2(float lse_e) { return lse_e * 1.4426950408889634f; }
inline float lse_from_base2(float lse_2) { return lse_2 * 0.6931471805599453f; }

// Entmax two-step merge. Step 1: each chunk c solves its local threshold tau_c and keeps its
// candidates (scores with z_i > tau_c); since tau_global >= max_c tau_c, their union holds
// the global support. `local_candidates` must be that union (any superset of the global
// support is fine); the exact global tau is solved on it.
// Step 2: each chunk returns sum_{i in support} p_i v_i and sum p_i (EntmaxPartialView);
// merge_entmax sums them in order and divides.
struct EntmaxPartialView {
  const float* o_sum;  // [d], unnormalised sum p_i v_i
  double p_sum;
};
// Sums in the given order (in double) and divides by sum p; sum p == 0 gives o = 0.
// Throws Error naming "d", "o" or "parts" (p_sum negative or not finite, o_sum == nullptr with
// p_sum > 0).
void merge_entmax(std::span<const EntmaxPartialView> parts, int d, float* o);

// Step 1 of the two-step scheme for one chunk: solves the chunk's local threshold and appends
// the chunk's scores s_i (scores, not z) with (alpha-1)*s_i > tau_lo_c to `out`, in order.
// tau_lo_c <= tau_c <= tau_global (docs/design.md §2.2 subset monotonicity), so the union over the
// chunks holds the global support. An empty chunk appends nothing. Throws like
// entmax_threshold (naming "scores" / "alpha").
void append_local_candidates(std::span<const float> chunk, double alpha, std::vector<double>& out);

// The exact global entmax threshold of the concatenated chunks, computed from the union of the
// local candidates only (docs/design.md §2.6). Equal to entmax_threshold on the concatenation up to
// rounding (same support; tau identical or within a few ulps). `support` counts the global
// support. Throws Error(invalid_argument, "chunks") when every chunk is empty.
EntmaxThreshold entmax_threshold_split(std::span<const std::span<const float>> chunks,
                                       double alpha);

}  // namespace masskv::attn
