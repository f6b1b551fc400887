// The page scan of the CUDA selection (docs/design.md §3, "Adding a scorer"): score_tiles, one
// CTA's scoring of a chunk of (sequence, kv head)'s pages (or groups) into order-preserving
// uint32 keys, generic over a device scorer (below), run by score_kernel (a whole scan) and by
// the fused hierarchical kernel (select_hier.cuh). The library's scorer is the §2.3 page bound
// (select_page_bound.cuh: bf16 and 8-bit stores, Gaussian-τ ranks); a test adds its own
// (tests/cuda/oldest_first.cu) without a kernel of its own.
//
// Scan layout. A CTA of up to kScoreMaxWarps warps owns a chunk of pages of one (sequence, kv
// head); its warps are independent pipelines: warp w scores the warp tiles w, w + warps,
// w + 2 warps, ... of the chunk (kWarpPages pages each), every tile copied into the warp's own
// shared-memory stages kStages - 1 tiles ahead (cp.async), so only __syncwarp orders a warp's
// copies and reads (the CTA's barriers are the scorer's query staging). It takes a group mask
// (hier_select: tiles of unchosen groups are not read, their keys are 0) or a group list
// (hier_select on long sequences: only the listed groups' tiles are visited).
//
// The device scorer contract (the host side of one is ScanKernels, select_common.cuh):
//   kStages, kStageBytes, kWarpBytes (= kStages · kStageBytes; 0 when nothing is staged)
//   static std::size_t query_bytes(int group): the CTA's staged query, after the warps' stages
//   begin_query(p, qs, b, h): issues the query's asynchronous copies (every thread; the scan
//     commits them as the oldest copy group, so they overlap the first tiles' page-id loads)
//   split_query(p, qs), then finish_query(p, qs): after the copies land, CTA-wide work on the
//     query in two steps, each ending in __syncthreads() (the scan stamps "q staged" after the
//     first, "q norms" after the second); every member is __device__ __forceinline__ static
//   issue_tile(p, stage, h, lane, phys): copies a tile into one stage; lane L holds the
//     physical page of the tile's page L % 16 (-1: missing or bad, zero-fill without reading)
//   page_rank(p, stage, qs, lane, page, b, h, ok): the rank of the lane's page (lanes 2i and
//     2i + 1 both serve page i of the tile and must return the same value; ok: its page id is
//     valid). A page's key is ordered_key(rank) (0: not keyed), read by every top-k.
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "select_common.cuh"

namespace masskv::cuda::select_impl {

// 16-byte asynchronous copy global -> shared (L2 only: each summary byte is used by one CTA);
// src_bytes 0 writes zeros without reading.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
// 4-byte asynchronous copy global -> shared (one q channel).
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(gmem));
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// cp.async of 8 bytes (the 8-bit store's (lo, step) of a page); src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}

constexpr int kScoreMaxWarps = 12;
constexpr int kSkipTile = -2;  // load_id's id for a page of a group the mask leaves out

// One CTA's scoring of (sequence b, kv head h) by scorer S: page tiles [j0, j1) of 16 pages
// from page j0 (list == null), or the groups list[j0 .. j1) (list mode: group i = pages
// [16 i, 16 i + 16)). n: the sequence's pages (seq_pages). smem: the CTA's dynamic shared
// memory (the warps' stages, S::kWarpBytes each, then S's query). Every thread of the CTA calls
// it (it has barriers); the CTA returns at once when there is nothing to score.
template <class S>
__device__ __forceinline__ void score_tiles(const SelParams& p, unsigned char* smem, int b, int h,
                                            int n, const std::int32_t* list, int j0, int j1) {
  constexpr int kStages = S::kStages;
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned char* qs = smem + static_cast<std::size_t>(warps) * S::kWarpBytes;
  unsigned char* wbuf = smem + static_cast<std::size_t>(warp) * S::kWarpBytes;

  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  if (n < 0 || j0 >= j1) return;  // the whole CTA: before any barrier
  const int seq_begin = p.indptr[b];
  const int tiles = list != nullptr ? j1 - j0 : (j1 - j0 + kWarpPages - 1) / kWarpPages;
  const int my_tiles = warp < tiles ? (tiles - warp + warps - 1) / warps : 0;
  const auto tile_page0 = [&](int t) {
    return list != nullptr ? list[j0 + warp + t * warps] * kWarpPages
                           : j0 + (warp + t * warps) * kWarpPages;
  };
  const int page_end = list != nullptr ? n : j1;  // pages past it do not exist
  const std::uint8_t* tmask =
      p.tile_mask != nullptr
          ? p.tile_mask + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.mask_stride
          : nullptr;
  // Whether tile t's pages are left out by the mask (tiles start at multiples of kWarpPages:
  // chunks are multiples of kChunkAlign).
  const auto skipped = [&](int t) {
    return tmask != nullptr && tmask[tile_page0(t) / kWarpPages] == 0;
  };
  // The page id of page L % 16 of this warp's tile t for lane L (0 past the chunk). Loaded one
  // tile before the copies that use it, so the load's latency is not exposed.
  const auto load_id = [&](int t) {
    if (t >= my_tiles) return 0;
    const int pg = tile_page0(t) + lane % kWarpPages;
    if (pg >= page_end) return 0;
    return skipped(t) ? kSkipTile : p.indices[seq_begin + pg];
  };
  // Copies this warp's tile t into stage st: lane L holds the page id of page L % 16 of the
  // tile (`id`; flags a bad one); the scorer copies, zero-filling missing or bad pages.
  const auto issue = [&](int t, int st, int id) {
    if (skipped(t)) return;  // warp-uniform: never read (the tile's keys are written as 0)
    const int tn = min(kWarpPages, page_end - tile_page0(t));
    int phys = -1;
    if (lane % kWarpPages < tn) {
      if (id >= 0 && id < p.pool_pages) {
        phys = id;
      } else if (id != kSkipTile && lane < kWarpPages) {
        atomicOr(p.err, kBadPhysical);
      }
    }
    S::issue_tile(p, wbuf + st * S::kStageBytes, h, lane, phys);
  };
  // The query first, as the oldest copy group: its latency overlaps the page-id loads the tile
  // copies wait for (docs/gpu-results.md, tuning notes).
  S::begin_query(p, qs, b, h);
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_tiles) issue(s, s, load_id(s));
    cp_async_commit();
  }
  int next_id = load_id(kStages - 1);

  cp_async_wait<kStages - 1>();  // this thread's query copies
  S::split_query(p, qs);
  detail::stamp(p.stamps, p.stamp_score, 1);
  S::finish_query(p, qs);  // ends in __syncthreads: from here on the warps run on their own
  detail::stamp(p.stamps, p.stamp_score, 2);

  std::uint32_t* keys = p.keys + slot * p.max_pages;
  for (int t = 0; t < my_tiles; ++t) {
    // The stage written here was last read in iteration t - 1, before its closing __syncwarp.
    if (t + kStages - 1 < my_tiles) issue(t + kStages - 1, (t + kStages - 1) % kStages, next_id);
    next_id = load_id(t + kStages);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // this lane's copies of tile t have landed
    __syncwarp();            // and every lane's
    if (t == 0) detail::stamp(p.stamps, p.stamp_score, 3);
    const int pg = tile_page0(t) + lane / 2;
    const bool in = pg < page_end;
    if (skipped(t)) {  // warp-uniform: a group the mask leaves out
      if ((lane & 1) == 0 && in) keys[pg] = 0u;
      __syncwarp();
      continue;
    }
    bool ok = false;
    if (in) {
      const int id = p.indices[seq_begin + pg];
      ok = id >= 0 && id < p.pool_pages;
    }
    const float best = S::page_rank(p, wbuf + (t % kStages) * S::kStageBytes, qs, lane, pg, b,
                                    h, ok);
    const bool dropped = p.tau != nullptr && p.adaptive && !(best > -p.margin);
    if ((lane & 1) == 0 && in) keys[pg] = ok && !dropped ? ordered_key(best) : 0u;
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (t == 0) detail::stamp(p.stamps, p.stamp_score, 4);
  }
}

// One scorer's whole scan: grid (chunks, kv heads, batch), blockDim = 32 * warps (warps <=
// kScoreMaxWarps, planned on the host from the shared memory that fits: score_plan). Chunk c:
// pages [c·chunk_pages, +chunk_pages), or in list mode entries [c·chunk_pages/16,
// +chunk_pages/16) of the pair's tile list.
template <class S>
__global__ void __launch_bounds__(kScoreMaxWarps * 32) score_kernel(SelParams p) {
  extern __shared__ uint4 smem_raw[];
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  detail::stamp(p.stamps, p.stamp_score, 0);
  // Launched by programmatic dependent launch after the group top-k (hier_select's page pass):
  // nothing is read before the predecessor is done (a no-op after a plain launch). Then the
  // top-k may launch: its CTAs wait on the device for this grid, with no launch gap between
  // (docs/gpu-results.md, tuning notes).
  detail::wait_for_predecessor();
  detail::allow_dependents();
  const int n = seq_pages(p, b);
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  const std::int32_t* list = p.tile_ids != nullptr ? p.tile_ids + slot * p.tile_stride : nullptr;
  const int j0 = list != nullptr ? chunk * (p.chunk_pages / kWarpPages) : chunk * p.chunk_pages;
  const int j_end = list != nullptr ? (n < 0 ? 0 : min(p.tile_count[slot], p.tile_stride)) : n;
  const int j1 = list != nullptr ? min(j_end, j0 + p.chunk_pages / kWarpPages)
                                 : min(n, j0 + p.chunk_pages);
  score_tiles<S>(p, reinterpret_cast<unsigned char*>(smem_raw), b, h, n, list, j0, j1);
  detail::stamp(p.stamps, p.stamp_score, stamps::kExit);
}

// A scorer's ScanKernels (select_common.cuh): its scan kernels (SHot: the form for warps that
// score many tiles; S itself where it has none) and its shared memory at run time.
template <class S, class SHot = S>
ScanKernels scan_kernels() {
  return {score_kernel<S>, score_kernel<SHot>, S::kWarpBytes, &S::query_bytes};
}

}  // namespace masskv::cuda::select_impl
