// Sparse prefill selection (docs/design.md §2.7 at prefill, §4): which keys each query of a prefill
// step attends, and the attention-mass oracle that recomputes attention on that support.
//
// A prefill step holds the last n tokens of one sequence (already appended to the cache), in
// query blocks of q_block tokens counted from its first query. Key blocks have k_block tokens
// counted from position 0. Methods:
//   token   per query, the top tokens by the dense head-averaged mass (the §2.7 oracle at
//           token granularity);
//   block   per query, the top key blocks by summed mass;
//   shared  per query block, one key-block set for all its queries, by the mass summed over
//           them (what a block-sparse kernel realises: a BlockMask);
//   index   per query block, key blocks ranked by the mean-pooled indexer: the mean k of each
//           key block (per kv head) scored by the query block's mean q, averaged over the heads
//           (head-collapsed; the CUDA indexer, src/cuda/prefill_index.cu, ranks per kv group).
//           It needs no dense pass.
//   learned per query block, key blocks ranked by a learned selector (docs/design.md §2.8): the sum
//           over the block's queries of softmax(ŝ) over the keys each query sees, ŝ_ij =
//           q_s,i · k_s,j on the selector key rows, summed per key block (averaged over the
//           selector's groups). The selector is a `masskv distill` one: its training target, a
//           query's dense head-averaged attention over the tokens before it, is the prefill
//           query's. No dense pass.
// Every method keeps the sink blocks (the first sink_blocks key blocks) and the diagonal (the
// keys of the query's own query block up to itself); the budget counts them. The oracles
// (token, block, shared) need the dense probabilities; token and block recompute attention on
// their support from those probabilities (softmax renormalised on the support, which is
// exactly softmax over the support's scores); shared and index give a BlockMask for
// attn::prefill. Softmax only.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "masskv/attn/prefill.hpp"
#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/tensor.hpp"

namespace masskv::select {

enum class PrefillMethod { dense, token, block, shared, index, learned };
std::string_view to_string(PrefillMethod m) noexcept;
// Throws Error(invalid_argument, what) naming the methods.
PrefillMethod parse_prefill_method(std::string_view name, std::string_view what);

// Keys a query (token, block) or a query block (shared, index) may attend, sinks and diagonal
// included: `tokens` when > 0, else max(min_keys, ceil(fraction × visible)); never more than
// the visible keys (the causal prefix of the query, or of the block's last query).
struct PrefillBudget {
  double fraction = 1.0 / 16;
  std::int64_t min_keys = 0;
  std::int64_t tokens = 0;
  std::int64_t keys(std::int64_t visible) const;
  bool operator==(const PrefillBudget&) const = default;
};

struct PrefillSelectConfig {
  PrefillMethod method = PrefillMethod::dense;
  int q_block = 64;
  int k_block = 64;     // key block of block / shared / index, and the sink size of token
  int sink_blocks = 1;  // leading key blocks always kept
  PrefillBudget budget;
  // Mass averaged over all q heads (one support for every head) or over each GQA group (one
  // support per kv head; token and block only: a BlockMask is one for all heads).
  bool head_collapsed = true;
  // Throws Error(invalid_argument, "sparse_prefill") for a bad block size, sinks or budget.
  void validate() const;
  bool operator==(const PrefillSelectConfig&) const = default;
};

// One prefill step of one sequence: q of its last n tokens, the cache holding them (batch 1).
struct PrefillSelectArgs {
  View3<const float> q;  // [n][Hq][d], after RoPE (what attention scores)
  kv::PagedKVView cache;
  float scale = 0;  // 0 means 1/sqrt(d)
};

// Dense softmax probabilities of the step, f32 scores as attn::prefill computes them:
// p[(h * n + i) * L + j] for q head h, query i, key j < L (0 after the query's position).
void prefill_probabilities(const PrefillSelectArgs& args, std::vector<float>& p);

// Head-averaged token mass m[(g * n + i) * L + j] from those probabilities: g = 0 only
// (mean over all Hq heads) when collapsed, else g < Hkv (mean over the group's heads).
void prefill_token_mass(std::span<const float> p, int num_q_heads, int num_kv_heads, int n,
                        std::int64_t length, bool head_collapsed, std::vector<double>& mass);

// The kept items of one row: every `forced` item, then the best others by score (ties to the
// lower index) until `budget` items are kept; items >= `visible` are never kept. keep[j] = 1.
void choose_items(std::span<const double> score, std::span<const std::uint8_t> forced,
                  std::int64_t visible, std::int64_t budget, std::vector<std::uint8_t>& keep);

// Per-query support of the token / block oracle: keep[(g * n + i) * L + j] = 1 when query i
// of group g attends key j. From the mass of prefill_token_mass.
void per_query_support(std::span<const double> mass, int groups, int n, std::int64_t length,
                       const PrefillSelectConfig& config, std::vector<std::uint8_t>& keep);

// Owner of a BlockMask (one sequence) for attn::prefill.
struct BlockMaskStorage {
  int q_block = 64, k_block = 64;
  std::int64_t rows = 0, cols = 0;
  std::vector<std::uint8_t> mask;  // [rows][cols]
  std::int64_t offset0 = 0;
  attn::BlockMask view() const {
    return {q_block, k_block, mask, std::span<const std::int64_t>(&offset0, 1)};
  }
  // Keys the mask lets the step's queries attend (causal), summed over queries.
  std::int64_t keys_attended(int n, std::int64_t length) const;
};

// The shared-support oracle's mask: per query block, key blocks by the mass summed over its
// queries (collapsed mass, groups = 1).
void shared_block_mask(std::span<const double> mass, int n, std::int64_t length,
                       const PrefillSelectConfig& config, BlockMaskStorage& out);

// Running f64 sums of the keys of every key block per kv head, for the indexer: a prefill
// step adds only the tokens appended since the last one (earlier keys never change).
// sums[(h * blocks + c) * d + x]; `tokens` summed so far. Empty: nothing summed yet.
struct KeyBlockSums {
  int k_block = 0;
  std::int64_t tokens = 0, blocks = 0;
  std::vector<double> sums;
};

// The mean-pooled indexer's mask (no dense pass). With `sums` (one per layer and sequence),
// only the new keys are read; null: every key, every call.
void index_block_mask(const PrefillSelectArgs& args, const PrefillSelectConfig& config,
                      BlockMaskStorage& out, KeyBlockSums* sums = nullptr);

// The learned indexer's mask: q_sel [n][keys.groups][keys.dim], the step's queries projected
// by the selector (learn::project); keys the sequence's selector key rows (table: batch 1,
// `length` tokens, the step's n queries last). Throws Error(shape_mismatch, "q_sel").
void learned_block_mask(std::span<const float> q_sel, const kv::KeyRowsView& keys,
                        const kv::PageTable& table, int n, const PrefillSelectConfig& config,
                        BlockMaskStorage& out);

// Attention recomputed on a per-query support from the dense probabilities:
// out[i][h] = Σ_{j kept} p_hij v_j / Σ_{j kept} p_hij (0 for an empty support).
void support_attention(const PrefillSelectArgs& args, std::span<const float> p,
                       std::span<const std::uint8_t> keep, int groups, View3<float> out);

}  // namespace masskv::select
