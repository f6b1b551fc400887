// CUDA causal prefill attention, dense or block-sparse (issue 10; docs/design.md §3 Selection at
// prefill granularity, §4 prefill data flow), and the cheap GPU block indexer that feeds it.
// Softmax only. Every pointer and span in the args is *device* memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/mapping.hpp"
#include "masskv/tensor.hpp"

struct CUstream_st;

namespace masskv::cuda {

// Block selection for block-sparse prefill (docs/design.md §3 at prefill granularity), the layout
// of the CPU's attn::BlockSelection: per (query block, head slot) a strictly ascending list of
// key-block ids padded with -1, plus a count. Sequence b's query blocks are rows
// q_block_indptr[b] .. q_block_indptr[b+1] (exactly ceil(n_b / q_block) of them); row
// r = q_block_indptr[b] + i covers b's new tokens [i*q_block, (i+1)*q_block), query index
// space. Key block j covers positions [j*k_block, (j+1)*k_block) of the sequence.
// num_heads = 1: one list for every kv head; num_heads = kv heads: one list per kv group
// (the q heads of a group share it, and the kernel reads each listed block once per group).
// Causality applies inside listed blocks (the diagonal block is masked causally; listed
// blocks after a query are harmless). Sinks and the diagonal are the selector's to include
// (prefill_index does). Served: q_block 64 or 128, k_block 64 or 128.
struct PrefillBlockSelection {
  int q_block = 64, k_block = 64;
  int num_heads = 1;
  int max_per_row = 0;
  std::span<const std::int32_t> q_block_indptr;  // [B + 1]
  std::span<const std::int32_t> ids;             // [rows][num_heads][max_per_row]
  std::span<const std::int32_t> count;           // [rows][num_heads]
};

// Device buffers of a prefill step besides inputs and outputs: the indexer's pooled means
// and the device error flag. Grows on demand (at the first step of a shape); one per stream.
class PrefillWorkspace {
 public:
  PrefillWorkspace();
  ~PrefillWorkspace();
  PrefillWorkspace(const PrefillWorkspace&) = delete;
  PrefillWorkspace& operator=(const PrefillWorkspace&) = delete;

  // Waits for `stream`, reads and clears the error flag, throws masskv::Error when a kernel
  // met bad device data: out_of_range "indices" (a physical page outside the pool), "indptr"
  // (decreasing), "last_page_len", "q_indptr" (decreasing, longer than the sequence or than
  // PrefillLaunch::max_q_per_seq), "block_selection" (a count outside [0, max_per_row], an id
  // outside the sequence's key blocks, a list not strictly ascending, or q_block_indptr not
  // matching the query blocks), shape_mismatch "max_per_row" (the indexer's list is longer
  // than the output). Bad ids are never read; outputs of the affected rows are unspecified.
  void check(CUstream_st* stream) const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct PrefillLaunch {
  CUstream_st* stream = nullptr;
  PrefillWorkspace* workspace = nullptr;  // required
  // Host bound on new tokens per sequence: sizes the grid without reading q_indptr. A longer
  // sequence sets the error flag ("q_indptr").
  int max_q_per_seq = 0;
  // true: wait and check the error flag (throws). false: call workspace->check later.
  bool check_errors = true;
  // prefill's kernel for head_dim 128 (64, and entmax, always run mma.sync): automatic (the
  // warp-specialised kernel where 4 divides the group, else wgmma; mma.sync on the sm_80
  // paths: docs/gpu-results.md, tuning notes), or wgmma (sm_90a: unsupported on the sm_80
  // paths) or mma, for comparing them on a device. Same results within the stated tolerances.
  enum class Kernel { automatic, wgmma, mma };
  Kernel kernel = Kernel::automatic;
  // The most q heads a CTA of the mma.sync and wgmma kernels serves (4, 2 or 1; fewer where
  // the group does not divide), for comparing the variants (the warp-specialised kernel
  // always takes 4: with a cap, set kernel = wgmma too).
  int max_heads_per_cta = 4;
};

// Where the output goes: f32, or the input dtype (bf16/f16), [total_q][Hq][d], unit stride on d.
struct PrefillOut {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::int64_t s0 = 0, s1 = 0;
};

struct PrefillArgs {
  // New tokens of all sequences, ragged: sequence b's queries are rows q_indptr[b] ..
  // q_indptr[b+1], the *last* n_b tokens of the sequence in the cache (already appended), so
  // query i of b sits at position length(b) - n_b + i. Elements in cache.dtype (bf16 or f16),
  // 16-byte aligned rows (strides multiples of 8 elements).
  View3<const std::uint16_t> q;                      // [total_q][Hq][d]
  std::span<const std::int32_t> q_indptr;            // [B + 1]
  kv::PagedKVView cache;                             // bf16 or f16; page size a power of two
  float scale = 0;                                   // 0 means 1/sqrt(d)
  const PrefillBlockSelection* selection = nullptr;  // nullptr: dense causal
  // softmax, or α-entmax (α in (1, 2]) on z = (α-1)·scale·q·k as attn::prefill does.
  Mapping mapping = Mapping::softmax();
  PrefillOut out;
  // [total_q][Hq], or empty. Softmax: the natural-log LSE, -inf for a query without keys.
  // Entmax: τ (p = [z - τ]_+^{1/(α-1)}), NaN for a query without keys.
  std::span<float> lse;
};

// Causal prefill on the GPU, softmax (docs/design.md §2.6's (o, lse) state, base e) or α-entmax.
// Dense: every key up to the query. Sparse: the causal keys of the listed blocks only (the
// work is proportional to the listed blocks). A query that attends no key gets o = 0,
// lse = -inf (softmax) / τ = NaN (entmax).
// Entmax is exact and slow (for completeness; the tensor-core kernels serve softmax): a pass
// for each row's max z, Newton passes on f(τ) = Σ [z - τ]_+^{1/(α-1)} = 1 from τ = max z - 1
// (f convex and decreasing: the iterates rise to the root; the host reads a flag after each
// pass, so an entmax call is not graph-capturable), then the output pass. Each pass is a
// Q·Kᵀ sweep on the mma.sync kernel with one q head per CTA.
// Validates what the host can see (throws masskv::Error naming the argument: "workspace",
// "dtype", "head_dim", "q", "q_indptr", "cache", "stride", "page_size", "out", "lse",
// "scale", "max_q_per_seq", "block_selection", "alpha", "max_heads_per_cta", "kernel"). Served: head_dim 64 and 128, any GQA ratio
// (q heads a multiple of kv heads; a CTA serves 4 q heads of a group when the group size is
// a multiple of 4, else 2 or 1, and reads each key tile once for them).
void prefill(const PrefillArgs& args, const PrefillLaunch& launch);

// The mean-pooled block indexer (docs/design.md §4 "indexer scores query blocks × key blocks"): the
// score of (query block i, kv head h, key block j) is mean(q over the block's tokens and the
// group's q heads) · mean(k over the key block's tokens); per (i, h) it keeps the sink blocks
// [0, sink_blocks), the diagonal blocks (those holding the query block's positions) and the
// best-scoring other causal blocks up to budget_blocks in all (ties to the lower id), written
// ascending in the PrefillBlockSelection layout with num_heads = kv heads.
struct PrefillIndexArgs {
  View3<const std::uint16_t> q;  // as PrefillArgs
  std::span<const std::int32_t> q_indptr;
  kv::PagedKVView cache;
  int q_block = 64, k_block = 64;
  int budget_blocks = 0;  // listed blocks per row (kept ones included), >= 1
  int sink_blocks = 1;
  // Host bound on tokens per sequence (sizes the key-block means); a longer sequence sets the
  // flag ("indptr"). At most 16384 key blocks.
  int max_kv_len = 0;
  // Output: q_block_indptr is an input (built on the host); ids [rows][kv heads][max_per_row]
  // and count [rows][kv heads] are written. Size max_per_row with prefill_index_capacity.
  std::span<const std::int32_t> q_block_indptr;
  int max_per_row = 0;
  std::span<std::int32_t> ids;
  std::span<std::int32_t> count;
};

// Three kernels: key-block means, query-block means (f32, in the workspace), then per (query
// block, kv head) the scores and the top-k. Throws as prefill, plus "q_block", "k_block",
// "budget_blocks", "sink_blocks", "max_kv_len", "max_per_row", "ids", "count".
void prefill_index(const PrefillIndexArgs& args, const PrefillLaunch& launch);

// Host bound on the indexer's list length for sequences of at most max_len tokens.
int prefill_index_capacity(std::int64_t max_len, int q_block, int k_block, int budget_blocks,
                           int sink_blocks);

}  // namespace masskv::cuda
