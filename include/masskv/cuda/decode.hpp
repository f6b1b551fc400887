// CUDA decode attention over a paged KV cache (issue 7; docs/design.md §2.6, §3). Same argument
// shape as attn::decode, but every pointer and span in the args is *device* memory.
#pragma once

#include <cstdint>
#include <memory>

#include "masskv/attn/decode.hpp"

// cudaStream_t without pulling cuda_runtime.h into host-only translation units (the runtime
// declares it the same way).
struct CUstream_st;

namespace masskv::cuda {

// Device buffers a decode step needs besides its inputs and outputs: the split-K partials
// (o and lse, or sum p, per (sequence, q head, chunk)), entmax's candidate lists, tau and
// counters, and the device-side error flag. Grows on demand;
// one workspace per stream (steps on one stream reuse it in order).
class DecodeWorkspace {
 public:
  DecodeWorkspace();
  ~DecodeWorkspace();
  DecodeWorkspace(const DecodeWorkspace&) = delete;
  DecodeWorkspace& operator=(const DecodeWorkspace&) = delete;

  // Waits for `stream`, reads and clears the error flag, throws masskv::Error when a kernel
  // met a bad id: out_of_range "indices" (a physical page id outside the pool), "selection"
  // (a selected logical page outside its sequence), "indptr" (a sequence with more pages than
  // DecodeLaunch::max_pages_per_seq, or a decreasing indptr) or "last_page_len". Pages with bad
  // ids are never read; the outputs of the affected heads are then unspecified.
  void check(CUstream_st* stream) const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct DecodeLaunch {
  CUstream_st* stream = nullptr;
  DecodeWorkspace* workspace = nullptr;  // required
  // Upper bound on pages per sequence (dense) known on the host; it sizes the split-K grid
  // without reading the device page table. A sequence with more pages sets the error flag.
  // Sparse decode uses the selection's max_per_head instead.
  int max_pages_per_seq = 0;
  // Split-K chunk in pages; 0 plans it from the grid size and the device's SM count
  // (DecodeArgs::chunk_pages is not used on the GPU: the CPU's fixed 64 would be far too
  // small a grid or too many partials here). The result is deterministic for a given
  // (chunk_pages, args): the chunking and the merge order do not depend on timing.
  int chunk_pages = 0;
  // true: wait for the step and check the error flag (throws). false: the caller calls
  // workspace->check(stream) when it wants (benchmarks, CUDA graphs).
  bool check_errors = true;
  // The softmax kernel: automatic = the tensor-core one (mma.sync, decode_mma.cu) where it has
  // a variant (head_dim 64, 128), the SIMT one otherwise; simt / tensor force one (tensor with
  // head_dim 256 throws Error(unsupported, "kernel")). Both meet the same tolerance against
  // the f64 reference (docs/gpu.md). Entmax ignores it (its own kernels).
  enum class Kernel { automatic, simt, tensor };
  Kernel kernel = Kernel::automatic;
  // Sparse entmax: cluster = one kernel, a thread-block cluster per (sequence, kv head) that
  // splits the selection over its CTAs and solves tau and merges through distributed shared
  // memory (decode_cluster.cu; head_dim 64/128, at most cluster_size * 1024 selected tokens
  // per head); split = the three-kernel split-K path (score, tau, accumulate), which serves
  // every shape and dense decode. automatic: cluster where it serves the call. Forcing
  // cluster where it cannot serve throws Error(unsupported, "entmax_kernel").
  enum class EntmaxKernel { automatic, split, cluster };
  EntmaxKernel entmax_kernel = EntmaxKernel::automatic;
  // CTAs per cluster of the cluster kernel: 8, 16, or 0 = 16 while the clusters fit on the
  // device at once, else 8.
  int cluster_size = 0;
  // Profiling: a device array of stamps::kEntries (masskv/cuda/stamps.hpp) the softmax
  // tensor-core and merge kernels write their phase times into; null (the default): nothing.
  std::uint64_t* phase_stamps = nullptr;
};

// Decode on the GPU. args: q/out device [B][Hq][d] f32 (unit stride on d); cache.k/v device
// pool in f16 or bf16, 16-byte aligned, strides multiples of 8 elements (HND or NHD);
// cache.table spans over device int32 arrays (sizes: indptr B+1, last_page_len B); the host
// cannot read them, so validate the table on the host where it is built
// (PagedKVView::validate on the host copy) — kernels still check every id they use and set
// the error flag instead of reading a bad page. selection: nullptr (dense) or a view whose
// ids/count spans are device memory: unit page, or unit token for softmax (logical token ids,
// each read at page id / page_size, slot id % page_size: a gather split-K kernel,
// decode_tokens.cu; DecodeLaunch::chunk_pages then counts tokens). lse_or_tau: device
// [B][Hq] or empty (softmax: lse; entmax: tau on z = (alpha-1)*s, NaN for a head without
// tokens, as attn::decode).
// Supported: softmax and entmax (any alpha in (1, 2], exact global tau, docs/design.md §2.6);
// head_dim 64, 128, 256; any GQA ratio (groups of more than 8 q heads re-read the kv head's
// pages once per 8 q heads). Throws masskv::Error naming the argument (alpha out of range,
// entmax over token selections, other head dims, f32 KV).
void decode(const attn::DecodeArgs& args, const DecodeLaunch& launch);

// The split-K chunk (pages) softmax decode plans for `pages_per_head` pages per (sequence,
// kv head) on this device (for reports; entmax plans with its own kernel's occupancy).
int planned_chunk_pages(DType dtype, int head_dim, int batch, int num_kv_heads, int num_q_heads,
                        int pages_per_head,
                        DecodeLaunch::Kernel kernel = DecodeLaunch::Kernel::automatic);

}  // namespace masskv::cuda
