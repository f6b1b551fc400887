// Split-K / distributed merge (DESIGN.md §2.6). The one place both split-K decode and
// context parallelism combine partial results.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace masskv::attn {

// Softmax partial over a chunk of keys: o is normalised within the chunk, lse is the chunk's
// log-sum-exp of scaled scores, natural log. An empty chunk is (o = 0, lse = -inf).
// FlashInfer stores lse in base 2: lse_base2 = lse * log2(e) (see lse_to_base2).
struct SoftmaxPartialView {
  const float* o;  // [d]
  float lse;
};

// Merges partials in the given order (fixed order => deterministic):
// lse = logsumexp_c lse_c, o = sum_c exp(lse_c - lse) o_c. All-empty gives o = 0, lse = -inf
// (never NaN).
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
void merge_entmax(std::span<const EntmaxPartialView> parts, int d, float* o);

}  // namespace masskv::attn
