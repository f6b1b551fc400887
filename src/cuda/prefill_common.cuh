// What the CUDA prefill kernels share (prefill.cu: attention; prefill_index.cu: the block
// indexer): the error bits, the workspace, a sequence's geometry read from the device tables
// with every value checked, and the paged row address of a key position (docs/design.md §3).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <span>

#include "device.cuh"
#include "masskv/cuda/prefill.hpp"

namespace masskv::cuda::prefill_impl {

// Device error flag bits (PrefillWorkspace::check turns them into masskv::Error).
enum ErrBit : unsigned {
  kBadPhysical = 1u,    // indices[...] outside [0, num_pages)
  kBadIndptr = 2u,      // decreasing indptr, or a sequence of more than kMaxLength tokens
  kBadLastLen = 4u,     // last_page_len outside [1, page_size]
  kBadQIndptr = 8u,     // q_indptr decreasing, past total_q, past max_q or the sequence length
  kBadSelection = 16u,  // count / ids / q_block_indptr of a block selection
  kBadCapacity = 32u,   // the indexer's list does not fit max_per_row
};

// The paged pool and the ragged queries, as both kernels read them.
struct SeqTables {
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_len;
  const std::int32_t* q_indptr;
  int pool_pages, log2_page, max_q, total_q;
  std::int64_t stride_page, stride_head, stride_slot;
};

constexpr int kMaxLength = 1 << 30;  // tokens per sequence (positions are int)

// One sequence: its length, its new queries [q_begin, q_begin + nq) at positions
// first_q .. length - 1, and where its page ids start. ok = false (and nothing to do) when a
// table entry is bad; `report` says whether this thread raises the flag (one per CTA).
struct SeqGeo {
  int length = 0, first_q = 0;  // positions fit int: longer sequences are flagged ("indptr")
  int nq = 0, q_begin = 0, seq_begin = 0;
  bool ok = false;
};

__device__ __forceinline__ SeqGeo seq_geo(const SeqTables& t, int b, unsigned* err, bool report) {
  SeqGeo g;
  const int begin = t.indptr[b], pages = t.indptr[b + 1] - begin;
  if (pages < 0 || pages > (kMaxLength >> t.log2_page)) {
    if (report) atomicOr(err, kBadIndptr);
    return g;
  }
  if (pages > 0) {
    const int last = t.last_len[b];
    if (last < 1 || last > (1 << t.log2_page)) {
      if (report) atomicOr(err, kBadLastLen);
      return g;
    }
    g.length = ((pages - 1) << t.log2_page) + last;
  }
  g.q_begin = t.q_indptr[b];
  const int q_end = t.q_indptr[b + 1];
  g.nq = q_end - g.q_begin;
  if (g.q_begin < 0 || g.nq < 0 || q_end > t.total_q || g.nq > t.max_q || g.nq > g.length) {
    if (report) atomicOr(err, kBadQIndptr);
    g.nq = 0;
    return g;
  }
  g.seq_begin = begin;
  g.first_q = g.length - g.nq;
  g.ok = true;
  return g;
}

// Element offset of key position `pos` (< length) of kv head kvh in the pool, or -1 (flagged)
// when its physical page is outside the pool.
__device__ __forceinline__ std::int64_t key_row(const SeqTables& t, const SeqGeo& g, int kvh,
                                                int pos, unsigned* err) {
  const int phys = t.indices[g.seq_begin + (pos >> t.log2_page)];
  if (phys < 0 || phys >= t.pool_pages) {
    atomicOr(err, kBadPhysical);
    return -1;
  }
  return phys * t.stride_page + kvh * t.stride_head +
         (pos & ((1 << t.log2_page) - 1)) * t.stride_slot;
}

// Host: the tables of a cache and queries (shared by both entry points' validation).
SeqTables seq_tables(const kv::PagedKVView& cache, std::span<const std::int32_t> q_indptr,
                     int total_q, int max_q);

// Host: what prefill and prefill_index both check of (q, q_indptr, cache); returns the batch.
int validate_common(const View3<const std::uint16_t>& q, std::span<const std::int32_t> q_indptr,
                    const kv::PagedKVView& cache, const PrefillLaunch& launch);

}  // namespace masskv::cuda::prefill_impl

namespace masskv::cuda {

struct PrefillWorkspace::Impl {
  detail::GrowBuffer<float> kmean, qmean;  // the indexer's pooled means
  detail::GrowBuffer<float> tau;           // entmax: τ per (query, q head) between passes
  detail::ErrorFlag err;
  detail::ErrorFlag newton;  // entmax: set by a Newton pass whose step was not yet negligible
};

}  // namespace masskv::cuda
