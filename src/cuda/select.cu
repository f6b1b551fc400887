// CUDA Quest selection (docs/design.md §2.3 page bounds, §3 Selection, kept pages). Two kernels:
//  1. quest_score_kernel: a CTA owns a chunk of pages of one (sequence, kv head); it stages the
//     group's q (split into q+ = max(q, 0), q- = min(q, 0)) in shared memory, then each warp
//     streams its own 16-page tiles of bf16 min/max rows through a private cp.async pipeline
//     (lane L scores row L: page L / 2, min or max row) and writes one order-preserving uint32
//     key per page: the page bound max over the group's q heads of
//     scale * (q+·M + q-·m + f·||q||_1·W + FLT_MIN), the CPU selector's bounds_bf16 formula
//     (page_bound.cpp), evaluated in the same order as its AVX2 kernel (8 lanes of FMA chains
//     over c = l, l+8, ..., the same horizontal sum), so on an AVX2 host the bounds have the
//     same bits.
//  2. quest_topk_kernel: a cluster of C CTAs (1024 threads each; C = 8, 4, 2 or 1 by how many
//     (sequence, kv head) pairs there are) per (sequence, kv head) keeps
//     the sinks and the window pages; each CTA caches its slice of the candidate keys in shared
//     memory; the cluster finds the need-th largest candidate key by a radix select (4 passes of
//     8 bits, warp-aggregated per-slice histograms summed over distributed shared memory), then
//     takes every candidate above it and the lowest-id candidates equal to it (ties to the lower
//     page id, as the CPU), and writes the ids ascending with two ballot passes (no sort; the
//     lower slices' counts as bases), -1 padded, and the count.
//  2'. quest_topk_block_kernel (the default where the plan gives one CTA per pair, i.e. up to
//     ~16K pages per sequence; the cluster kernel beyond, or with MASSKV_TOPK=cluster or
//     MASSKV_TOPK_CLUSTER): one CTA per (sequence, kv head), launched with programmatic
//     dependent launch; radix passes of 2048 equal-width bins over the window of key values
//     still holding the threshold (min..max at first: at most 3 passes), same result.
// The scoring kernel also reads the 8-bit store (select::BoundStore8: codes dequantised as
// fma(code, step, lo), then the same chains; quest_select8's bits) and takes a group mask
// (hier_select: tiles of unchosen groups are not read, their keys are 0) or a group list
// (hier_select on long sequences: only the listed groups' tiles are visited). hier_select chains
// four launches: score groups, block top-k of groups (writes the mask), score pages, and
// hier_page_topk_kernel, which ranks only the chosen groups' pages (the flat top-k kernels
// when the groups' pages exceed kHierCand); or, with SelectLaunch::HierKernel::fused,
// hier_fused_kernel does all four in one launch (a cluster per (sequence, kv head)).
// With moments (Gaussian-τ, group_tau.cu), the scoring kernel's keys are entmax-aware ranks
// max_h float((α−1)·U_h − τ̂_h) and hier_page_topk_kernel can apply the adaptive rule.
// hier_top_p replaces the page pass by top_p_weights_kernel and hier_top_p_kernel (masses from
// the pages' summaries, heaviest until p).
// group_update_kernel rebuilds group summaries (GroupStore's bits).
// All are deterministic (integer atomics only count; no order depends on timing).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "block_select.cuh"
#include "device.cuh"
#include "extend_kept.cuh"
#include "group_tau.cuh"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "select/kept.hpp"

namespace masskv::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kChunkAlign = 64;  // SelectLaunch::chunk_pages: a multiple of this
constexpr int kTopkThreads = 1024;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kTopkMaxCluster = 8;  // CTAs per (sequence, kv head) in the top-k (portable limit)
constexpr int kMaxGroupDims = 8192;  // group * head_dim (q+ and q- live in shared memory)
// Candidate keys a top-k CTA keeps of its slice in shared memory (at most 160 KiB): the radix
// passes and the two compaction passes read global memory (L2) only for keys past these.
constexpr int kKeyCache = 40960;

enum ErrBit : unsigned {
  kBadPhysical = 1u,
  kBadIndptr = 2u,
  kBadLastLen = 4u,
  kBadCapacity = 8u,
  kNonFinite = 16u,
  kBadMomentSlot = 32u,
  kBadMomentIndptr = 64u,
  kBadSelection = 128u,
};

using detail::check_cuda;
using detail::device_sms;

struct SelParams {
  const float* q;
  std::int64_t q_s0, q_s1;
  const std::uint16_t* mn;  // bf16 bits [page][kv][d] (8-bit store: codes, as bytes)
  const std::uint16_t* mx;
  const float* grid;  // 8-bit store: [page][kv][2] (lo, step); null for bf16
  // Hierarchical page pass: [B][Hkv][mask_stride] group flags (group = page / kWarpPages);
  // pages of a group flagged 0 get key 0 and are not read. Null: every page is scored.
  const std::uint8_t* tile_mask;
  int mask_stride;
  // Hierarchical page pass, list mode: the tiles are the groups of tile_ids [B][Hkv][tile_stride]
  // (tile_count of them, group = 16 pages), chunk_pages / 16 of them per CTA; pages of other
  // groups are neither read nor written (their keys are zeroed before the launch).
  const std::int32_t* tile_ids;
  const std::int32_t* tile_count;
  int tile_stride;
  int pool_pages, num_kv_heads, group, page_size;
  int nnz;  // entries of indices: indptr must stay inside
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_len;
  float scale, slack_f;  // slack_f = 2 (2d + 4) 2^-24, as page_bound.cpp
  int max_pages;         // keys stride
  int chunk_pages;
  std::uint32_t* keys;
  // top-k
  int budget, sinks, window_tokens, max_per_head;
  int key_cache;  // keys the top-k kernel's dynamic shared memory holds
  std::int32_t* out_ids;
  std::int32_t* out_count;
  std::uint8_t* out_mask;  // optional [B][Hkv][max_pages]: 1 where selected (block top-k only)
  unsigned* err;
  // Entmax-aware ranking (hier_select with moments): tau [B][Hq] (τ̂ per q head), am1 = α - 1;
  // a page's key is that of max_i float(am1 · U_i - τ̂_i) (select::entmax_rank). adaptive: a page
  // whose rank is not above -margin gets key 0, and hier_page_topk_kernel takes no key-0 page.
  const double* tau;
  double am1;
  float margin;
  int adaptive;
  // SelectLaunch::phase_stamps (profiling), usually null; the scoring kernel stamps as
  // stamp_score, the top-k kernels as stamp_score + 1 (stamps.hpp).
  std::uint64_t* stamps;
  int stamp_score;
};

__device__ __forceinline__ std::uint32_t ordered_key(float x) {
  const std::uint32_t u = __float_as_uint(__fadd_rn(x, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float bf16_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }

// Unpacks 8 bf16 (one uint4) into floats, element i = channel c + i.
__device__ __forceinline__ void unpack8(const uint4& r, float (&f)[8]) {
  f[0] = bf16_lo(r.x);
  f[1] = bf16_hi(r.x);
  f[2] = bf16_lo(r.y);
  f[3] = bf16_hi(r.y);
  f[4] = bf16_lo(r.z);
  f[5] = bf16_hi(r.z);
  f[6] = bf16_lo(r.w);
  f[7] = bf16_hi(r.w);
}

// Sequence b's page count, checked (flags and returns -1 when bad).
__device__ int seq_pages(const SelParams& p, int b) {
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int n = end - begin;
  if (n < 0 || n > p.max_pages || begin < 0 || end > p.nnz) {
    atomicOr(p.err, kBadIndptr);
    return -1;
  }
  return n;
}

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

// Scoring layout. A CTA of up to kScoreMaxWarps warps owns a chunk of pages of one (sequence,
// kv head); its warps are independent pipelines: warp w scores the warp tiles w, w + warps,
// w + 2 warps, ... of the chunk (kWarpPages pages each), every tile copied into the warp's own
// shared-memory stages with 16-byte cp.async (coalesced: 16 lanes per 256-byte row at d = 128)
// kStages - 1 tiles ahead, so only __syncwarp orders a warp's copies and reads (one
// __syncthreads, after the group's q is staged). In a tile, lane L scores row L: page L / 2,
// its min row (L even: the q- chains) or its max row (L odd: the q+ chains); the two lanes of a
// page then add their chains (shuffle) and both finish the bound.
constexpr int kWarpPages = 16;  // pages per warp tile: 32 rows, one per lane
// Pipeline stages per warp: 2 (one tile in flight while one is scored); 3 at d = 64, where a
// tile is half as many bytes.
// kU8: the 8-bit store (one byte per channel, a tile half the bytes).
template <int kD, bool kU8>
constexpr int kRowData = kU8 ? kD : 2 * kD;  // bytes of one staged min or max row
template <int kD, bool kU8>
constexpr int kScoreStages = kRowData<kD, kU8> <= 128 ? 3 : 2;
constexpr int kScoreMaxWarps = 12;
constexpr int kHeadBatch = 4;  // q heads per pass over a row (8 accumulators each)

template <int kD, bool kU8 = false>
struct ScoreSmem {
  static constexpr int kRowBytes =
      kRowData<kD, kU8> + 16;  // 16 bytes of padding: lane L reads row L
  // 8-bit: the tile's (lo, step) per page after its rows.
  static constexpr int kGridOffset = 2 * kWarpPages * kRowBytes;
  static constexpr int kStageBytes = kGridOffset + (kU8 ? kWarpPages * 8 : 0);
  static constexpr int kStages = kScoreStages<kD, kU8>;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  // q+ [group][kD], 4 floats of padding (q- in other banks than q+), q- [group][kD], f||q||_1.
  static std::size_t q_bytes(int group) {
    return sizeof(float) * (2 * static_cast<std::size_t>(group) * kD + 4 + group);
  }
  static std::size_t bytes(int warps, int group) {
    return static_cast<std::size_t>(warps) * kWarpBytes + q_bytes(group);
  }
};

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The chains of kNB q heads (from head i0) over this lane's row; kW: also W over the row.
// acc[i][l] = sum over k, in order, of q[i][8k + l] * row[8k + l] (one FMA chain per lane l, as
// the AVX2 kernel's lanes), q = q- for a min row, q+ for a max row.
// The shared-memory loads of block k + 1 (row piece and q) are issued before block k's FMAs:
// otherwise the loop stalls on its shared loads' results (ncu: docs/gpu-results.md, tuning notes).
template <int kNB>
struct RowBlock {
  uint4 x;
  float4 q[kNB][2];
};
template <int kD, int kNB>
__device__ __forceinline__ void load_block(const uint4* row, const float* qa, int i0, int k,
                                           RowBlock<kNB>& b) {
  b.x = row[k];
#pragma unroll
  for (int i = 0; i < kNB; ++i) {
    const float4* qv = reinterpret_cast<const float4*>(qa + (i0 + i) * kD + 8 * k);
    b.q[i][0] = qv[0];
    b.q[i][1] = qv[1];
  }
}
template <int kD, int kNB, bool kW, bool kHot>
__device__ __forceinline__ void score_rows(const uint4* row, const float* qa, int i0, float& w,
                                           float (&acc)[kHeadBatch][8]) {
#pragma unroll
  for (int i = 0; i < kNB; ++i)
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[i][l] = 0.f;
  RowBlock<kNB> cur, next;
  load_block<kD, kNB>(row, qa, i0, 0, cur);
  // kHot (a warp scores many tiles): fully unrolled. Otherwise by 2: at B = 1 a warp scores
  // one or two tiles, so the loop runs on a cold instruction cache, where the smaller code wins
  // (docs/gpu-results.md, tuning notes).
#pragma unroll(kHot ? kD / 8 : 2)
  for (int k = 0; k < kD / 8; ++k) {
    if (k + 1 < kD / 8) load_block<kD, kNB>(row, qa, i0, k + 1, next);
    float x[8];
    unpack8(cur.x, x);
    if constexpr (kW) {
#pragma unroll
      for (int l = 0; l < 8; ++l) w = fmaxf(w, fabsf(x[l]));
    }
#pragma unroll
    for (int i = 0; i < kNB; ++i) {
      const float4 a = cur.q[i][0], c = cur.q[i][1];
      acc[i][0] = fmaf(a.x, x[0], acc[i][0]);
      acc[i][1] = fmaf(a.y, x[1], acc[i][1]);
      acc[i][2] = fmaf(a.z, x[2], acc[i][2]);
      acc[i][3] = fmaf(a.w, x[3], acc[i][3]);
      acc[i][4] = fmaf(c.x, x[4], acc[i][4]);
      acc[i][5] = fmaf(c.y, x[5], acc[i][5]);
      acc[i][6] = fmaf(c.z, x[6], acc[i][6]);
      acc[i][7] = fmaf(c.w, x[7], acc[i][7]);
    }
    if (k + 1 < kD / 8) cur = next;
  }
}

// The 8-bit form of score_rows: 16 codes per 16-byte piece, each dequantised once per row as
// fma(code, step, lo) (the CPU's dequant8), channel 16k + l into chain l, then 16k + 8 + l
// into chain l (ascending channels per chain, as the CPU reference).
__device__ __forceinline__ float code_at(unsigned word, int i) {
  // 0x4B0000bb is 2^23 + bb exactly; minus 2^23 gives the code as a float.
  return __fsub_rn(__uint_as_float(__byte_perm(word, 0x4B000000u, 0x7440u | i)), 8388608.0f);
}
template <int kD, int kNB, bool kW, bool kHot>
__device__ __forceinline__ void score_rows8(const uint4* row, const float* qa, int i0, float lo,
                                            float step, float& w, float (&acc)[kHeadBatch][8]) {
#pragma unroll
  for (int i = 0; i < kNB; ++i)
#pragma unroll
    for (int l = 0; l < 8; ++l) acc[i][l] = 0.f;
#pragma unroll(kHot ? kD / 16 : 2)  // as score_rows
  for (int k = 0; k < kD / 16; ++k) {
    const uint4 r = row[k];
    const unsigned words[4] = {r.x, r.y, r.z, r.w};
    float x[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) x[e] = fmaf(code_at(words[e / 4], e % 4), step, lo);
    if constexpr (kW) {
#pragma unroll
      for (int e = 0; e < 16; ++e) w = fmaxf(w, fabsf(x[e]));
    }
#pragma unroll
    for (int i = 0; i < kNB; ++i) {
      const float4* qv = reinterpret_cast<const float4*>(qa + (i0 + i) * kD + 16 * k);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float4 a = qv[2 * half], c = qv[2 * half + 1];
        const float* xs = x + 8 * half;
        acc[i][0] = fmaf(a.x, xs[0], acc[i][0]);
        acc[i][1] = fmaf(a.y, xs[1], acc[i][1]);
        acc[i][2] = fmaf(a.z, xs[2], acc[i][2]);
        acc[i][3] = fmaf(a.w, xs[3], acc[i][3]);
        acc[i][4] = fmaf(c.x, xs[4], acc[i][4]);
        acc[i][5] = fmaf(c.y, xs[5], acc[i][5]);
        acc[i][6] = fmaf(c.z, xs[6], acc[i][6]);
        acc[i][7] = fmaf(c.w, xs[7], acc[i][7]);
      }
    }
  }
}

// Both stores: the chains of kNB q heads over this lane's row.
template <int kD, bool kU8, int kNB, bool kW, bool kHot>
__device__ __forceinline__ void score_any(const uint4* row, const float* qa, int i0, float lo,
                                          float step, float& w, float (&acc)[kHeadBatch][8]) {
  if constexpr (kU8) {
    score_rows8<kD, kNB, kW, kHot>(row, qa, i0, lo, step, w, acc);
  } else {
    score_rows<kD, kNB, kW, kHot>(row, qa, i0, w, acc);
  }
}

// score_any for a run-time batch size nb (1 .. kHeadBatch).
template <int kD, bool kU8, bool kW, bool kHot>
__device__ __forceinline__ void score_batch(int nb, const uint4* row, const float* qa, int i0,
                                            float lo, float step, float& w,
                                            float (&acc)[kHeadBatch][8]) {
  switch (nb) {
    case 1:
      score_any<kD, kU8, 1, kW, kHot>(row, qa, i0, lo, step, w, acc);
      break;
    case 2:
      score_any<kD, kU8, 2, kW, kHot>(row, qa, i0, lo, step, w, acc);
      break;
    case 3:
      score_any<kD, kU8, 3, kW, kHot>(row, qa, i0, lo, step, w, acc);
      break;
    default:
      score_any<kD, kU8, 4, kW, kHot>(row, qa, i0, lo, step, w, acc);
      break;
  }
}

// cp.async of 8 bytes (the 8-bit store's (lo, step) of a page); src_bytes 0 writes zeros.
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}

constexpr int kSkipTile = -2;  // load_id's id for a page of a group the mask leaves out

// One CTA's scoring of (sequence b, kv head h): page tiles [j0, j1) of 16 pages from page j0
// (list == null), or the groups list[j0 .. j1) (list mode: group i = pages [16 i, 16 i + 16)).
// n: the sequence's pages (seq_pages). smem: the CTA's dynamic shared memory (ScoreSmem's
// layout: the warps' stages, then q). Every thread of the CTA calls it (it has barriers); the
// CTA returns at once when there is nothing to score. kHot: a warp scores many tiles (the
// row loop fully unrolled, score_rows).
template <int kD, bool kU8, bool kHot = false>
__device__ __forceinline__ void score_tiles(const SelParams& p, unsigned char* smem, int b, int h,
                                            int n, const std::int32_t* list, int j0, int j1) {
  using Smem = ScoreSmem<kD, kU8>;
  constexpr int kRowBytes = Smem::kRowBytes;
  constexpr int kStages = Smem::kStages;
  constexpr int kElem = kU8 ? 1 : 2;               // bytes per channel
  constexpr int kPieces = kRowData<kD, kU8> / 16;  // 16-byte pieces per row
  constexpr int kRowsPerCopy = 32 / kPieces;  // rows one warp-wide copy covers (4, 2, 1)
  constexpr int kCopies = 2 * kWarpPages / kRowsPerCopy;
  constexpr unsigned kAll = 0xffffffffu;
  const int warps = blockDim.x / 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = p.group;
  float* s_qpos = reinterpret_cast<float*>(smem + static_cast<std::size_t>(warps) * Smem::kWarpBytes);
  float* s_qneg = s_qpos + g * kD + 4;
  float* s_fq = s_qneg + g * kD;
  unsigned char* wbuf = smem + static_cast<std::size_t>(warp) * Smem::kWarpBytes;

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

  const std::int64_t page_stride = static_cast<std::int64_t>(p.num_kv_heads) * kD * kElem;
  const unsigned char* mn =
      reinterpret_cast<const unsigned char*>(p.mn) + static_cast<std::int64_t>(h) * kD * kElem;
  const unsigned char* mx =
      reinterpret_cast<const unsigned char*>(p.mx) + static_cast<std::int64_t>(h) * kD * kElem;
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
  // tile (`id`; flags a bad one); copy `it` moves rows [it * kRowsPerCopy, +kRowsPerCopy) of
  // the stage (row r = 2 * page + (0: min, 1: max)), kPieces consecutive lanes per row; missing
  // or bad pages are zero-filled without reading.
  const auto issue = [&](int t, int st, int id) {
    if (skipped(t)) return;  // warp-uniform: never read (the tile's keys are written as 0)
    const int tn = min(kWarpPages, page_end - tile_page0(t));
    const int mine = lane % kWarpPages;
    int phys = -1;
    if (mine < tn) {
      if (id >= 0 && id < p.pool_pages) {
        phys = id;
      } else if (id != kSkipTile && lane < kWarpPages) {
        atomicOr(p.err, kBadPhysical);
      }
    }
    unsigned char* stage = wbuf + st * Smem::kStageBytes;
    const int piece = lane % kPieces;
#pragma unroll
    for (int it = 0; it < kCopies; ++it) {
      const int r = it * kRowsPerCopy + lane / kPieces;
      const int ph = __shfl_sync(kAll, phys, r >> 1);
      const unsigned char* src = ph >= 0 ? ((r & 1) ? mx : mn) + ph * page_stride + piece * 16
                                         : mn;  // 0 bytes read if < 0
      cp_async16(stage + r * kRowBytes + piece * 16, src, ph >= 0 ? 16 : 0);
    }
    if constexpr (kU8) {
      if (lane < kWarpPages) {
        const float* src = phys >= 0
                               ? p.grid + 2 * (static_cast<std::int64_t>(phys) * p.num_kv_heads + h)
                               : p.grid;
        cp_async8(stage + Smem::kGridOffset + lane * 8, src, phys >= 0 ? 8 : 0);
      }
    }
  };
  // q first, copied as is into s_qpos (split below) as the oldest copy group: its latency
  // overlaps the page-id loads the tile copies wait for (docs/gpu-results.md, tuning notes).
  const int q_head0 = h * g;
  for (int idx = threadIdx.x; idx < g * kD; idx += blockDim.x) {
    const int i = idx / kD, c = idx % kD;
    cp_async4(s_qpos + idx, p.q + b * p.q_s0 + (q_head0 + i) * p.q_s1 + c);
  }
  cp_async_commit();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_tiles) issue(s, s, load_id(s));
    cp_async_commit();
  }
  int next_id = load_id(kStages - 1);

  cp_async_wait<kStages - 1>();  // this thread's q copies (the same idx as below)
  for (int idx = threadIdx.x; idx < g * kD; idx += blockDim.x) {
    const float x = s_qpos[idx];
    s_qpos[idx] = x > 0.f ? x : 0.f;
    // A NaN channel: q+ 0, q- NaN (so its ||q||_1 below is NaN, as the sum of |q| would be).
    s_qneg[idx] = x < 0.f ? x : x > 0.f ? 0.f : (x == x ? 0.f : x);
  }
  __syncthreads();
  detail::stamp(p.stamps, p.stamp_score, 1);
  for (int i = threadIdx.x; i < g; i += blockDim.x) {
    // ||q||_1 summed in channel order, as SplitQuery::assign, from shared memory:
    // q+ - q- = |q| exactly (one of them is 0); NaN where q- holds the NaN. 32 channels of
    // each loaded at once: one shared-memory latency per 32 additions, not per addition.
    float l1 = 0.f;
    for (int c0 = 0; c0 < kD; c0 += 32) {
      float qp[32], qn[32];
#pragma unroll
      for (int e = 0; e < 32; e += 4) {
        const float4 a = *reinterpret_cast<const float4*>(s_qpos + i * kD + c0 + e);
        const float4 n4 = *reinterpret_cast<const float4*>(s_qneg + i * kD + c0 + e);
        qp[e] = a.x, qp[e + 1] = a.y, qp[e + 2] = a.z, qp[e + 3] = a.w;
        qn[e] = n4.x, qn[e + 1] = n4.y, qn[e + 2] = n4.z, qn[e + 3] = n4.w;
      }
#pragma unroll
      for (int e = 0; e < 32; ++e)
        l1 = __fadd_rn(l1, qn[e] == qn[e] ? __fsub_rn(qp[e], qn[e]) : qn[e]);
    }
    s_fq[i] = __fmul_rn(p.slack_f, l1);
  }
  __syncthreads();  // q staged; from here on the warps run on their own
  detail::stamp(p.stamps, p.stamp_score, 2);

  std::uint32_t* keys = p.keys + slot * p.max_pages;
  const float* qa = (lane & 1) ? s_qpos : s_qneg;
  const double* tau_row =
      p.tau != nullptr ? p.tau + static_cast<std::int64_t>(b) * p.num_kv_heads * g + q_head0 : nullptr;
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
    const unsigned char* stage = wbuf + (t % kStages) * Smem::kStageBytes;
    const uint4* row = reinterpret_cast<const uint4*>(stage + lane * kRowBytes);
    float glo = 0.f, gstep = 0.f;  // the 8-bit grid of this lane's page
    if constexpr (kU8) {
      const float2 gs =
          *reinterpret_cast<const float2*>(stage + Smem::kGridOffset + (lane / 2) * 8);
      glo = gs.x;
      gstep = gs.y;
    }
    // W = max_c max(|m_c|, |M_c|): each lane's row, then the pair's (exact in any order).
    float w = 0.f, best = -INFINITY;
    float acc[kHeadBatch][8];
    for (int i0 = 0; i0 < g; i0 += kHeadBatch) {
      const int nb = min(kHeadBatch, g - i0);
      if (i0 == 0) {
        score_batch<kD, kU8, true, kHot>(nb, row, qa, i0, glo, gstep, w, acc);
        w = fmaxf(w, __shfl_xor_sync(kAll, w, 1));
      } else {
        score_batch<kD, kU8, false, kHot>(nb, row, qa, i0, glo, gstep, w, acc);
      }
#pragma unroll
      for (int i = 0; i < kHeadBatch; ++i) {
        if (i < nb) {
          // v_l = (q+·M)_l + (q-·m)_l: the partner lane holds the other chain (+ commutes).
          float v[8];
#pragma unroll
          for (int l = 0; l < 8; ++l) v[l] = __fadd_rn(acc[i][l], __shfl_xor_sync(kAll, acc[i][l], 1));
          // The AVX2 hsum: ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)).
          const float s = __fadd_rn(__fadd_rn(__fadd_rn(v[0], v[4]), __fadd_rn(v[2], v[6])),
                                    __fadd_rn(__fadd_rn(v[1], v[5]), __fadd_rn(v[3], v[7])));
          // finish_bound: scale * (sum + fq * w + FLT_MIN), each operation rounded.
          const float bound = __fmul_rn(
              p.scale, __fadd_rn(__fadd_rn(s, __fmul_rn(s_fq[i0 + i], w)), FLT_MIN));
          // CPU: m = bounds[0]; m = x > m ? x : m (in head order).
          if (ok && isnan(bound) && (lane & 1) == 0) atomicOr(p.err, kNonFinite);
          // select::entmax_rank: the product of two floats is exact in f64, one rounding.
          const float rank =
              tau_row != nullptr
                  ? __double2float_rn(__dsub_rn(__dmul_rn(p.am1, static_cast<double>(bound)),
                                                tau_row[i0 + i]))
                  : bound;
          best = (i0 + i == 0 || rank > best) ? rank : best;
        }
      }
    }
    const bool dropped = tau_row != nullptr && p.adaptive && !(best > -p.margin);
    if ((lane & 1) == 0 && in) keys[pg] = ok && !dropped ? ordered_key(best) : 0u;
    __syncwarp();  // every lane is done with this stage before it is refilled
    if (t == 0) detail::stamp(p.stamps, p.stamp_score, 4);
  }
}

// grid (chunks, kv heads, batch), blockDim = 32 * warps (warps <= kScoreMaxWarps, planned on the
// host from the shared memory that fits). Chunk c: pages [c·chunk_pages, +chunk_pages), or in
// list mode entries [c·chunk_pages/16, +chunk_pages/16) of the pair's tile list. kHot: the plan
// gives a warp many tiles (ScorePlan::fn_hot).
template <int kD, bool kU8, bool kHot>
__global__ void __launch_bounds__(kScoreMaxWarps * 32) quest_score_kernel(SelParams p) {
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
  score_tiles<kD, kU8, kHot>(p, reinterpret_cast<unsigned char*>(smem_raw), b, h, n, list, j0,
                             j1);
  detail::stamp(p.stamps, p.stamp_score, stamps::kExit);
}
// ---- top-k ----------------------------------------------------------------------------------

// The split of one (sequence, kv head)'s pages, as topk_split (topk_rank.hpp): sinks
// [0, sinks) and [window, n) kept (`kept` pages, by the rule of select/kept.hpp), `total`
// selected. bad: a bad indptr, last_page_len or a selection longer than the lists (flagged by
// `flag`'s thread).
struct TopkSplit {
  int n, sinks, window, kept, total;
  bool bad;
};
__device__ TopkSplit topk_split_of(const SelParams& p, int b, bool flag) {
  TopkSplit s{seq_pages(p, b), 0, 0, 0, 0, false};
  const int n = s.n;
  int last = 0;
  s.bad = n < 0;
  if (!s.bad && n > 0) {
    last = p.last_len[b];
    if (last < 1 || last > p.page_size) {
      if (flag) atomicOr(p.err, kBadLastLen);
      s.bad = true;
    }
  }
  if (!s.bad && n > 0) {
    const std::int64_t length = static_cast<std::int64_t>(n - 1) * p.page_size + last;
    const select::KeptRanges<int> k =
        select::kept_pages(n, length, p.page_size, p.sinks, p.window_tokens);
    s.sinks = k.first_end;
    s.window = k.last_begin;
    s.kept = k.count(n);
    s.total = min(n, max(p.budget, s.kept));
    if (s.total > p.max_per_head) {
      if (flag) atomicOr(p.err, kBadCapacity);
      s.bad = true;
    }
  }
  return s;
}

// The two passes of the ordered compaction (both top-k kernels). Warp-contiguous ids
// [wbeg, wend), walked 32 at a time in id order; classify(j, gt, eq) puts candidate j above
// the threshold (always taken) or on it (taken in id order until need_eq). The counting pass
// and the emitting pass must classify alike.
template <class Classify>
__device__ void warp_counts(int wbeg, int wend, int lane, const Classify& classify, int& eq_w,
                            int& gt_w) {
  eq_w = gt_w = 0;
  for (int j0 = wbeg; j0 < wend; j0 += 32) {
    bool gt = false, eq = false;
    classify(j0 + lane, gt, eq);
    gt_w += __popc(__ballot_sync(0xffffffffu, gt));
    eq_w += __popc(__ballot_sync(0xffffffffu, eq));
  }
}
// Writes the selected ids at out[sel_r + rank]; eq_r, sel_r: the ties and the selected ids
// before this warp's range. mask (optional): 1/0 per id of the range.
template <class Classify>
__device__ void warp_emit(int wbeg, int wend, int lane, const Classify& classify, int need_eq,
                          int eq_r, int sel_r, std::int32_t* out, std::uint8_t* mask) {
  const unsigned lt_mask = (1u << lane) - 1u;
  for (int j0 = wbeg; j0 < wend; j0 += 32) {
    const int j = j0 + lane;
    bool gt = false, eq = false;
    classify(j, gt, eq);
    const unsigned eqb = __ballot_sync(0xffffffffu, eq);
    const bool sel = gt || (eq && eq_r + __popc(eqb & lt_mask) < need_eq);
    const unsigned selb = __ballot_sync(0xffffffffu, sel);
    if (sel) out[sel_r + __popc(selb & lt_mask)] = j;
    if (mask != nullptr && j < wend) mask[j] = sel ? 1 : 0;
    eq_r += __popc(eqb);
    sel_r += __popc(selb);
  }
}

// Selection of one (sequence, kv head) by a cluster of kC CTAs (thread-block cluster,
// distributed shared memory). grid (kC, kv heads, batch), kTopkThreads threads, clusters of kC
// along x set at launch (launch_topk).
// CTA r of the cluster owns the r-th contiguous slice of the candidates [sinks, window): it
// caches the slice's keys, builds each radix pass's 256-bin histogram of its slice; after a
// cluster barrier every CTA sums the cluster's histograms (integer sums: the same in every CTA)
// and finds the same bin, so the threshold T and need_eq come out as with one CTA. The ordered
// compaction gives each CTA the counts of the lower-ranked slices (id order = rank order), so
// the ids are written ascending without a sort. All CTAs of a cluster take the same branches
// (they compute the same n, kept, need), so no barrier is left waiting.
template <int kC>
__global__ void __launch_bounds__(kTopkThreads) quest_topk_kernel(SelParams p) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  extern __shared__ std::uint32_t s_keys[];  // this CTA's slice [slo, slo + cached)
  __shared__ int s_hist[2][256];             // by pass parity (other CTAs read them)
  __shared__ int s_warp_a[kTopkWarps], s_warp_b[kTopkWarps];
  __shared__ int s_base_eq[kTopkWarps], s_base_sel[kTopkWarps];
  __shared__ int s_cta_eq, s_cta_gt;  // this slice's counts (other CTAs read them)
  __shared__ int s_bin, s_krem;

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  std::int32_t* out =
      p.out_ids + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_per_head;
  std::int32_t* out_count = p.out_count + b * p.num_kv_heads + h;
  const bool leader = rank == 0;  // writes the kept pages, the -1 padding and the count

  const TopkSplit sp = topk_split_of(p, b, tid == 0);
  const int n = sp.n, sinks = sp.sinks, window = sp.window, kept = sp.kept, total = sp.total;
  const bool bad = sp.bad;
  if (bad || n == 0) {
    if (leader) {
      for (int i = tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
      if (tid == 0) *out_count = 0;
    }
    return;
  }
  const int need = total - kept;  // > 0 only when sinks < window
  const int s0 = min(sinks, window);
  const int nsel = max(need, 0);
  if (leader) {
    for (int j = tid; j < s0; j += kTopkThreads) out[j] = j;
    for (int j = window + tid; j < n; j += kTopkThreads) out[s0 + nsel + (j - window)] = j;
    for (int i = total + tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
    if (tid == 0) *out_count = total;
  }
  if (nsel == 0) return;

  const std::uint32_t* keys =
      p.keys + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_pages;
  const int lo = sinks, hi = window, cand = hi - lo;
  const bool take_all = nsel >= cand;
  // This CTA's slice [slo, shi) of the candidates (whole warps of 32 ids).
  const int slice = (cand + kC * 32 - 1) / (kC * 32) * 32;
  const int slo = min(hi, lo + rank * slice), shi = min(hi, slo + slice);
  const int scount = shi - slo;
  const int cached = take_all ? 0 : min(scount, p.key_cache);
  for (int i = tid; i < cached; i += kTopkThreads) s_keys[i] = __ldg(keys + slo + i);
  __syncthreads();
  const auto key_at = [&](int j) {
    const int i = j - slo;
    return i < cached ? s_keys[i] : __ldg(keys + j);
  };
  // Threshold T = the nsel-th largest key of all candidates; k_rem = how many keys equal to T
  // are taken.
  std::uint32_t prefix = 0, pmask = 0;
  int k_rem = nsel;
  if (!take_all) {
    const int iters = (scount + kTopkThreads - 1) / kTopkThreads;
    int parity = 0;
    for (int shift = 24; shift >= 0; shift -= 8, parity ^= 1) {
      // s_hist[parity] was last read (by every CTA) before the previous pass's cluster barrier.
      int* hist = s_hist[parity];
      for (int i = tid; i < 256; i += kTopkThreads) hist[i] = 0;
      __syncthreads();
      for (int it = 0; it < iters; ++it) {
        const int j = slo + it * kTopkThreads + tid;
        unsigned bin = 256;
        if (j < shi) {
          const std::uint32_t key = key_at(j);
          if ((key & pmask) == prefix) bin = (key >> shift) & 255u;
        }
        const unsigned peers = __match_any_sync(0xffffffffu, bin);
        if (bin < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
      cluster.sync();  // every CTA's histogram of this pass is complete
      if (warp == 0) {
        // Lane l holds bins [8l, 8l + 8) summed over the cluster; suffix sums over lanes find
        // the bin holding the k_rem-th largest key of the current prefix.
        int c[8], sum = 0;
#pragma unroll
        for (int i = 0; i < 8; ++i) c[i] = 0;
        for (int r = 0; r < kC; ++r) {
          const int* rh = cluster.map_shared_rank(hist, r);
#pragma unroll
          for (int i = 0; i < 8; ++i) c[i] += rh[8 * lane + i];
        }
#pragma unroll
        for (int i = 0; i < 8; ++i) sum += c[i];
        int suffix = sum;  // sum over lanes >= lane
#pragma unroll
        for (int off = 1; off < 32; off *= 2) {
          const int o = __shfl_down_sync(0xffffffffu, suffix, off);
          if (lane + off < 32) suffix += o;
        }
        const int above = suffix - sum;  // keys in bins of higher lanes
        if (suffix >= k_rem && above < k_rem) {
          int acc = above;
          for (int i = 7; i >= 0; --i) {
            if (acc + c[i] >= k_rem) {
              s_bin = 8 * lane + i;
              s_krem = k_rem - acc;
              break;
            }
            acc += c[i];
          }
        }
      }
      __syncthreads();
      prefix |= static_cast<std::uint32_t>(s_bin) << shift;
      pmask |= 255u << shift;
      k_rem = s_krem;
      __syncthreads();  // s_bin / s_krem are rewritten next pass
    }
  }
  const std::uint32_t T = prefix;
  const int need_eq = k_rem;

  // Warp w owns the slice's ids [slo + w * seg, slo + (w + 1) * seg), walked 32 at a time in id
  // order: ranks are running ballot counts, so ids come out ascending without a sort.
  const int seg = ((scount + kTopkWarps * 32 - 1) / (kTopkWarps * 32)) * 32;
  const int wbeg = min(shi, slo + warp * seg), wend = min(shi, wbeg + seg);
  // Candidate j against the threshold: above it (always taken) or equal to it (taken in id
  // order until need_eq); the counting pass and the emitting pass must agree exactly.
  const auto classify = [&](int j, bool& gt, bool& eq) {
    if (j >= wend) return;
    const std::uint32_t key = key_at(j);
    gt = take_all || key > T;
    eq = !take_all && key == T;
  };
  int eq_w, gt_w;
  warp_counts(wbeg, wend, lane, classify, eq_w, gt_w);
  if (lane == 0) {
    s_warp_a[warp] = eq_w;
    s_warp_b[warp] = gt_w;
  }
  __syncthreads();
  if (tid == 0) {
    int eq = 0, gt = 0;
    for (int w = 0; w < kTopkWarps; ++w) {
      eq += s_warp_a[w];
      gt += s_warp_b[w];
    }
    s_cta_eq = eq;
    s_cta_gt = gt;
  }
  cluster.sync();  // every slice's counts are published
  if (tid == 0) {
    // The lower slices first (ties to the lower id), then this CTA's warps.
    int eq_base = 0, sel_base = 0;
    for (int r = 0; r < rank; ++r) {
      const int eq_r = *cluster.map_shared_rank(&s_cta_eq, r);
      const int gt_r = *cluster.map_shared_rank(&s_cta_gt, r);
      sel_base += gt_r + min(max(need_eq - eq_base, 0), eq_r);
      eq_base += eq_r;
    }
    for (int w = 0; w < kTopkWarps; ++w) {
      s_base_eq[w] = eq_base;
      s_base_sel[w] = sel_base;
      const int take = min(max(need_eq - eq_base, 0), s_warp_a[w]);
      sel_base += s_warp_b[w] + take;
      eq_base += s_warp_a[w];
    }
  }
  // No CTA leaves (or reuses) its shared memory while another may still read it; also orders
  // s_base_* for this CTA's threads.
  cluster.sync();
  warp_emit(wbeg, wend, lane, classify, need_eq, s_base_eq[warp], s_base_sel[warp], out + s0,
            nullptr);
#endif
}

// ---- top-k, one CTA per (sequence, kv head) ----------------------------------------------------

// The block top-k is launched with programmatic dependent launch (device.cuh) so that its
// launch and prologue (kept pages, padding, count) overlap the scoring kernel (which allows
// dependents once its CTAs have started); it waits for the scoring grid (wait_for_predecessor)
// before reading a key.

constexpr int kBlkBinsLog = 11;
constexpr int kBlkBins = 1 << kBlkBinsLog;  // 2 per thread

// The selection of one (sequence, kv head) by one CTA of kTopkThreads threads, grid (1, kv
// heads, batch): the same result as quest_topk_kernel (and the CPU's topk_one), found with
// fewer, cheaper passes and no cluster barriers.
//  - The candidates' keys are cached in shared memory (up to key_cache; the rest is read from
//    L2 on every pass) while their min and max are reduced (redux.sync).
//  - A window [wlo, whi] of key values always holds the threshold: at first [min, max]. A
//    pass bins the candidates in the window by (key - wlo) >> shift into 2048 bins (shift so
//    that the window fits: equal-width bins over the values the keys actually take, not over
//    the key bits, so the first pass already splits keys that share their top bits — bounds
//    of one binade share the top 9), finds the bin of the k_rem-th largest key by a suffix scan
//    of the histogram, and narrows the window to that bin. Windows shrink by 2^11 per pass:
//    at most 3 passes; fewer when min == max, or when the bin holds exactly the keys still
//    needed (then every key of the window is taken).
//  - Selected: every key above the window, and the first k_rem keys inside it in id order
//    (inside a window of one value: ties to the lower page id, as the CPU; a window whose keys
//    are all taken: order irrelevant). Ids are written ascending without a sort by two ballot
//    passes over warp-contiguous id ranges (counts, then positions).
// Shared-memory atomics only count; nothing depends on timing (deterministic).
// out_mask (optional): 1 for every selected logical page of [0, n), 0 for the others.
__global__ void __launch_bounds__(kTopkThreads) quest_topk_block_kernel(SelParams p) {
  extern __shared__ std::uint32_t s_keys[];
  __shared__ int s_hist[kBlkBins];
  __shared__ int s_wsum[kTopkWarps];
  __shared__ std::uint32_t s_wmin[kTopkWarps], s_wmax[kTopkWarps];
  __shared__ int s_warp_a[kTopkWarps], s_warp_b[kTopkWarps];
  __shared__ int s_base_eq[kTopkWarps], s_base_sel[kTopkWarps];
  __shared__ int s_bin, s_above, s_cnt;

  const int h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  std::int32_t* out =
      p.out_ids + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_per_head;
  std::int32_t* out_count = p.out_count + b * p.num_kv_heads + h;
  std::uint8_t* mask =
      p.out_mask != nullptr
          ? p.out_mask + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_pages
          : nullptr;

  detail::stamp(p.stamps, p.stamp_score + 1, 0);
  const TopkSplit sp = topk_split_of(p, b, tid == 0);
  const int n = sp.n, sinks = sp.sinks, window = sp.window, kept = sp.kept, total = sp.total;
  const bool bad = sp.bad;
  if (bad || n == 0) {
    for (int i = tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
    if (tid == 0) *out_count = 0;
    if (mask != nullptr && n > 0)
      for (int j = tid; j < n; j += kTopkThreads) mask[j] = 0;
    // Every exit waits for the scoring grid, so this grid never completes before it (a later
    // launch in the stream then finds both done).
    detail::wait_for_predecessor();
    return;
  }
  const int need = total - kept;
  const int s0 = min(sinks, window);
  const int nsel = max(need, 0);
  for (int j = tid; j < s0; j += kTopkThreads) out[j] = j;
  for (int j = window + tid; j < n; j += kTopkThreads) out[s0 + nsel + (j - window)] = j;
  for (int i = total + tid; i < p.max_per_head; i += kTopkThreads) out[i] = -1;
  if (tid == 0) *out_count = total;
  if (mask != nullptr) {
    for (int j = tid; j < s0; j += kTopkThreads) mask[j] = 1;
    for (int j = max(window, s0) + tid; j < n; j += kTopkThreads) mask[j] = 1;
    if (nsel == 0)
      for (int j = s0 + tid; j < window; j += kTopkThreads) mask[j] = 0;
  }
  detail::wait_for_predecessor();
  detail::stamp(p.stamps, p.stamp_score + 1, 1);
  // The next kernel (page scoring, the decode) may launch now and wait on the device: after
  // this CTA's wait, so its own early reads find the scoring done (the decode merge reads the
  // counts before its wait).
  detail::allow_dependents();
  if (nsel == 0) return;

  const std::uint32_t* keys =
      p.keys + (static_cast<std::int64_t>(b) * p.num_kv_heads + h) * p.max_pages;
  const int lo = sinks, hi = window, cand = hi - lo;
  const bool take_all = nsel >= cand;
  const int cached = take_all ? 0 : min(cand, p.key_cache);
  // Plain loads, not __ldg: the scoring grid wrote the keys while this grid was already
  // resident (programmatic dependent launch), so they are not read-only for its lifetime.
  const auto key_at = [&](int j) {
    const int i = j - lo;
    return i < cached ? s_keys[i] : keys[j];
  };
  std::uint32_t wlo = 0, whi = 0xffffffffu;
  int k_rem = nsel;
  if (!take_all) {
    std::uint32_t kmin = 0xffffffffu, kmax = 0;
    for (int i = tid; i < cand; i += kTopkThreads) {
      const std::uint32_t key = keys[lo + i];
      if (i < cached) s_keys[i] = key;
      kmin = min(kmin, key);
      kmax = max(kmax, key);
    }
    kmin = __reduce_min_sync(0xffffffffu, kmin);
    kmax = __reduce_max_sync(0xffffffffu, kmax);
    if (lane == 0) {
      s_wmin[warp] = kmin;
      s_wmax[warp] = kmax;
    }
    __syncthreads();  // also publishes s_keys
    wlo = __reduce_min_sync(0xffffffffu, s_wmin[lane]);
    whi = __reduce_max_sync(0xffffffffu, s_wmax[lane]);
    // Invariant: every key above whi is taken (nsel - k_rem of them), and the window holds at
    // least k_rem keys.
    while (wlo != whi) {
      const std::uint32_t range = whi - wlo;
      const int shift = max(0, 32 - __clz(static_cast<int>(range)) - kBlkBinsLog);
      s_hist[2 * tid] = 0;
      s_hist[2 * tid + 1] = 0;
      __syncthreads();
      // Uniform trip count (whole warps vote). The lanes whose bin is lane 0's add with one
      // atomic: runs of equal keys — the unscored pages (key 0) of the hierarchical selector,
      // ties — would otherwise serialise on one shared-memory address.
      for (int j0 = lo; j0 < hi; j0 += kTopkThreads) {
        const int j = j0 + tid;
        unsigned bin = 0xffffffffu;
        if (j < hi) {
          const std::uint32_t key = key_at(j);
          if (key >= wlo && key <= whi) bin = (key - wlo) >> shift;
        }
        const unsigned bin0 = __shfl_sync(0xffffffffu, bin, 0);
        const unsigned same = __ballot_sync(0xffffffffu, bin == bin0);
        if (bin0 != 0xffffffffu && lane == 0) atomicAdd(&s_hist[bin0], __popc(same));
        if (bin != 0xffffffffu && bin != bin0) atomicAdd(&s_hist[bin], 1);
      }
      __syncthreads();
      // Suffix sums over the bins from the top: thread t owns bins 2t (lower) and 2t + 1.
      const int c_lo = s_hist[2 * tid], c_hi = s_hist[2 * tid + 1];
      const int v = c_lo + c_hi;
      int suf = v;  // over the lanes >= lane of this warp
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int o = __shfl_down_sync(0xffffffffu, suf, off);
        if (lane + off < 32) suf += o;
      }
      if (lane == 0) s_wsum[warp] = suf;
      __syncthreads();
      // Keys in the warps above this one: every warp scans the 32 warp sums itself.
      int ws = s_wsum[lane];
#pragma unroll
      for (int off = 1; off < 32; off *= 2) {
        const int o = __shfl_down_sync(0xffffffffu, ws, off);
        if (lane + off < 32) ws += o;
      }
      const int warps_above = __shfl_sync(0xffffffffu, ws, (warp + 1) & 31);
      const int incl = suf + (warp + 1 < kTopkWarps ? warps_above : 0);  // bins >= 2t
      const int above = incl - v;                                        // bins > 2t + 1
      if (above < k_rem && incl >= k_rem) {                              // exactly one thread
        if (above + c_hi >= k_rem) {
          s_bin = 2 * tid + 1;
          s_above = above;
          s_cnt = c_hi;
        } else {
          s_bin = 2 * tid;
          s_above = above + c_hi;
          s_cnt = c_lo;
        }
      }
      __syncthreads();
      const std::uint32_t bin_lo = wlo + (static_cast<std::uint32_t>(s_bin) << shift);
      const std::uint64_t bin_hi = static_cast<std::uint64_t>(bin_lo) + ((1ull << shift) - 1);
      k_rem -= s_above;
      const bool whole = s_cnt == k_rem;
      wlo = bin_lo;
      whi = static_cast<std::uint32_t>(min(static_cast<std::uint64_t>(whi), bin_hi));
      __syncthreads();  // s_bin, s_above, s_cnt and s_hist are rewritten by the next pass
      if (whole) break;
    }
  }
  const int need_eq = k_rem;

  // Warp w owns the candidate ids [lo + w * seg, lo + (w + 1) * seg), walked 32 at a time in
  // id order. The counting pass and the emitting pass classify alike.
  const int seg = ((cand + kTopkWarps * 32 - 1) / (kTopkWarps * 32)) * 32;
  const int wbeg = min(hi, lo + warp * seg), wend = min(hi, wbeg + seg);
  const auto classify = [&](int j, bool& gt, bool& eq) {
    if (j >= wend) return;
    const std::uint32_t key = key_at(j);
    gt = take_all || key > whi;
    eq = !take_all && key >= wlo && key <= whi;
  };
  int eq_w, gt_w;
  warp_counts(wbeg, wend, lane, classify, eq_w, gt_w);
  if (lane == 0) {
    s_warp_a[warp] = eq_w;
    s_warp_b[warp] = gt_w;
  }
  __syncthreads();
  if (tid == 0) {
    int eq_base = 0, sel_base = 0;
    for (int w = 0; w < kTopkWarps; ++w) {
      s_base_eq[w] = eq_base;
      s_base_sel[w] = sel_base;
      sel_base += s_warp_b[w] + min(max(need_eq - eq_base, 0), s_warp_a[w]);
      eq_base += s_warp_a[w];
    }
  }
  __syncthreads();
  warp_emit(wbeg, wend, lane, classify, need_eq, s_base_eq[warp], s_base_sel[warp], out + s0, mask);
  detail::stamp(p.stamps, p.stamp_score + 1, stamps::kExit);
}

// ---- group summaries --------------------------------------------------------------------------

struct GroupParams {
  const std::int32_t *indptr, *indices, *gindptr, *gindices;
  const std::uint16_t *mn, *mx;  // page store, bf16 bits
  std::uint16_t *gmn, *gmx;      // group store
  int pool_pages, slots, num_kv_heads, head_dim, group_pages, nnz, gnnz;
  bool last_only;
  unsigned* err;
};

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t x) {
  return __uint_as_float(static_cast<unsigned>(x) << 16);
}

// grid (groups or 1, kv heads, batch), blockDim = head_dim (<= 256): thread c reduces channel
// c over the group's pages. Min and max of bf16 values are bf16 values: the bits are copied.
__global__ void group_update_kernel(GroupParams p) {
  const int h = blockIdx.y, b = blockIdx.z, c = threadIdx.x;
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int gbegin = p.gindptr[b], gend = p.gindptr[b + 1];
  const int n = end - begin;
  const int ng = (n + p.group_pages - 1) / p.group_pages;
  if (n < 0 || begin < 0 || end > p.nnz || gbegin < 0 || gend > p.gnnz || gend - gbegin != ng) {
    if (c == 0 && blockIdx.x == 0) atomicOr(p.err, kBadIndptr);
    return;
  }
  const int gi = p.last_only ? ng - 1 : static_cast<int>(blockIdx.x);
  if (gi < 0 || gi >= ng) return;
  const int slot = p.gindices[gbegin + gi];
  if (slot < 0 || slot >= p.slots) {
    if (c == 0) atomicOr(p.err, kBadPhysical);
    return;
  }
  float lo = INFINITY, hi = -INFINITY;
  std::uint16_t lo_bits = 0x7f80u, hi_bits = 0xff80u;  // +inf, -inf
  const int j1 = min(n, (gi + 1) * p.group_pages);
  for (int j = gi * p.group_pages; j < j1; ++j) {
    const int phys = p.indices[begin + j];
    if (phys < 0 || phys >= p.pool_pages) {
      if (c == 0) atomicOr(p.err, kBadPhysical);
      return;
    }
    const std::int64_t o = (static_cast<std::int64_t>(phys) * p.num_kv_heads + h) * p.head_dim + c;
    const std::uint16_t a = p.mn[o], z = p.mx[o];
    const float fa = bf16_bits_to_float(a), fz = bf16_bits_to_float(z);
    // std::min / std::max order: the first of equal values stays (-0 vs +0 as the CPU).
    if (fa < lo) {
      lo = fa;
      lo_bits = a;
    }
    if (hi < fz) {
      hi = fz;
      hi_bits = z;
    }
  }
  const std::int64_t go = (static_cast<std::int64_t>(slot) * p.num_kv_heads + h) * p.head_dim + c;
  p.gmn[go] = lo_bits;
  p.gmx[go] = hi_bits;
}

// ---- host -----------------------------------------------------------------------------------


using ScoreFn = void (*)(SelParams);

// The scoring launch of one (head_dim, group): the kernel (its dynamic shared-memory limit
// raised to the device's once), warps per CTA (as many as fit, <= kScoreMaxWarps), shared
// memory, and resident CTAs per SM (for the chunk plan). Cached per (head_dim, group): after
// the first step of a shape no CUDA call is made (stream capture).
struct ScorePlan {
  ScoreFn fn = nullptr;      // a warp scores one or two tiles (loops by 2: small code)
  ScoreFn fn_hot = nullptr;  // a warp scores hot_tiles() or more (loops fully unrolled)
  int warps = 0;
  std::size_t smem = 0;
  int ctas_per_sm = 1;
};

// ScoreSmem at run time: one scoring warp's stages and the staged q of a group.
struct ScoreSizes {
  std::size_t warp_bytes, q_bytes;
  std::size_t bytes(int warps) const {
    return static_cast<std::size_t>(warps) * warp_bytes + q_bytes;
  }
};
template <int kD>
ScoreSizes score_sizes_of(bool u8, int group) {
  return u8 ? ScoreSizes{ScoreSmem<kD, true>::kWarpBytes, ScoreSmem<kD, true>::q_bytes(group)}
            : ScoreSizes{ScoreSmem<kD>::kWarpBytes, ScoreSmem<kD>::q_bytes(group)};
}
ScoreSizes score_sizes(int d, bool u8, int group) {
  return d == 64    ? score_sizes_of<64>(u8, group)
         : d == 128 ? score_sizes_of<128>(u8, group)
                    : score_sizes_of<256>(u8, group);
}

ScorePlan score_plan(int d, int group, bool u8) {
  static std::mutex mu;
  static bool ready[2][3] = {};
  static ScorePlan cache[2][3][kMaxGroupDims / 64 + 1];  // group <= kMaxGroupDims / head_dim
  const int idx = d == 64 ? 0 : d == 128 ? 1 : 2;
  const int e = u8 ? 1 : 0;
  const ScoreFn fns[2][2][3] = {
      {{quest_score_kernel<64, false, false>, quest_score_kernel<128, false, false>,
        quest_score_kernel<256, false, false>},
       {quest_score_kernel<64, true, false>, quest_score_kernel<128, true, false>,
        quest_score_kernel<256, true, false>}},
      {{quest_score_kernel<64, false, true>, quest_score_kernel<128, false, true>,
        quest_score_kernel<256, false, true>},
       {quest_score_kernel<64, true, true>, quest_score_kernel<128, true, true>,
        quest_score_kernel<256, true, true>}}};
  std::lock_guard<std::mutex> lock(mu);
  const std::size_t optin = detail::smem_optin();  // the kernels hold no static arrays
  if (!ready[e][idx]) {
    for (int hot = 0; hot < 2; ++hot)
      detail::set_dynamic_smem(fns[hot][e][idx], optin, "the Quest scoring kernel");
    ready[e][idx] = true;
  }
  if (cache[e][idx][group].fn != nullptr) return cache[e][idx][group];
  const ScoreSizes sz = score_sizes(d, u8, group);
  const std::size_t room = optin > sz.q_bytes ? optin - sz.q_bytes : 0;
  ScorePlan plan;
  plan.fn = fns[0][e][idx];
  plan.fn_hot = fns[1][e][idx];
  plan.warps = static_cast<int>(std::min<std::size_t>(kScoreMaxWarps, room / sz.warp_bytes));
  require(plan.warps >= 1, ErrorCode::unsupported, "q",
          "the scoring kernel's shared memory does not fit this device for group ", group,
          " and head_dim ", d);
  plan.smem = sz.bytes(plan.warps);
  // The chunk plan counts on the fewer resident CTAs of the two (registers may differ).
  int ctas = 0, ctas_hot = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, plan.fn, plan.warps * 32,
                                                           plan.smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(score)");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_hot, plan.fn_hot,
                                                           plan.warps * 32, plan.smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(score)");
  plan.ctas_per_sm = std::max(1, std::min(ctas, ctas_hot));
  cache[e][idx][group] = plan;
  return plan;
}

using TopkFn = void (*)(SelParams);

// The top-k kernel for clusters of c CTAs, its dynamic shared-memory limit raised once (the key
// cache).
TopkFn topk_kernel(int c) {
  static const TopkFn fns[4] = {quest_topk_kernel<1>, quest_topk_kernel<2>, quest_topk_kernel<4>,
                                quest_topk_kernel<8>};
  static std::once_flag once;
  std::call_once(once, [] {
    for (TopkFn f : fns)
      detail::set_dynamic_smem(f, sizeof(std::uint32_t) * kKeyCache, "the cluster top-k");
  });
  return fns[c == 1 ? 0 : c == 2 ? 1 : c == 4 ? 2 : 3];
}

// CTAs per (sequence, kv head) in the top-k: the most (<= 8, a power of two) that keep all the
// pairs' CTAs in one wave of one 1024-thread CTA per SM and give each CTA at least
// kTopkMinSlice candidates; 1 when the pairs alone fill the GPU: the cluster's barriers cost
// more than one CTA's scan on short sequences (docs/gpu-results.md, tuning notes).
constexpr int kTopkMinSlice = 8192;
int plan_topk_cluster(int pairs, int max_pages) {
  // MASSKV_TOPK_CLUSTER=1|2|4|8 forces the size (the GPU check runs every size on every case).
  static const int forced = [] {
    const char* e = std::getenv("MASSKV_TOPK_CLUSTER");
    const int v = e != nullptr ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 0;
  }();
  if (forced != 0) return forced;
  int c = kTopkMaxCluster;
  while (c > 1 && (static_cast<std::int64_t>(pairs) * c > device_sms() ||
                   max_pages / c < kTopkMinSlice))
    c /= 2;
  return c;
}

// ---- hierarchical page top-k: only the chosen groups' pages -------------------------------------

constexpr int kHierThreads = 256;
constexpr int kHierCand = 8192;  // candidate pages (chosen groups × 16) a CTA holds

// The least power of two >= x (x >= 1).
__host__ __device__ constexpr int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// hier_top_p_kernel's dynamic shared memory for `groups` chosen groups a (sequence, kv head).
constexpr std::size_t top_p_smem(int groups) {
  const int cap = groups * kWarpPages;
  return sizeof(unsigned long long) * static_cast<std::size_t>(2 * cap + pow2_ceil(cap));
}

// The page-level selection of hier_select for one (sequence, kv head) (hier_page_topk_kernel,
// grid (1, kv heads, batch); hier_fused_kernel's last step): the flat rule (kept pages, then
// the best keys, ties to the lower id) over keys that are 0 outside the chosen groups, found
// from those groups' pages alone. The flat top-k kernels rank every page of the sequence
// (65536 at 1M tokens, 40 µs), although at most groups × 16 can have a key.
//  - Candidates: the pages of the chosen groups (the group top-k's ascending list) inside
//    [sinks, window), as 64-bit (key, ~id) in id order; valid keys are > 0 (ordered_key).
//  - Enough keyed candidates: the top nsel by radix selection, written ascending by a scan.
//  - Fewer (a cover below 1): every keyed page and the lowest-id pages of key 0, as the flat
//    rule, merged in id order by block scans over [sinks, window).
// One (sequence b, kv head h) by the CTA's kHierThreads threads: sp its split
// (topk_split_of(p, b, ...)), gl the chosen groups (ascending), mg of them; s_cand room for
// mg * kWarpPages candidates; s_hist 256, s_pick 3, s_warp kHierThreads / 32 ints of shared
// memory.
__device__ __forceinline__ void hier_page_topk(const SelParams& p, int b, int h,
                                               const TopkSplit& sp, const std::int32_t* gl,
                                               int mg, unsigned long long* s_cand, int* s_hist,
                                               int* s_pick, int* s_warp) {
  const int tid = threadIdx.x;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  std::int32_t* out = p.out_ids + slot * p.max_per_head;
  std::int32_t* out_count = p.out_count + slot;
  const int n = sp.n, sinks = sp.sinks, window = sp.window;
  if (sp.bad || n == 0) {
    for (int i = tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
    if (tid == 0) *out_count = 0;
    return;
  }
  const int s0 = min(sinks, window);
  int nsel = max(sp.total - sp.kept, 0);
  const std::uint32_t* keys = p.keys + slot * p.max_pages;
  const int m = nsel > 0 ? mg * kWarpPages : 0;
  int keyed = 0;
  for (int i = tid; i < m; i += kHierThreads) {
    const int j = gl[i / kWarpPages] * kWarpPages + i % kWarpPages;
    const std::uint32_t key = j >= sinks && j < window ? keys[j] : 0u;
    s_cand[i] = key != 0u ? (static_cast<unsigned long long>(key) << 32) |
                                static_cast<std::uint32_t>(~j)
                          : 0ull;
    keyed += key != 0u;
  }
  int all_keyed = 0;
  block_select::exclusive_scan<kHierThreads>(keyed, s_warp, all_keyed);  // also a barrier
  detail::stamp(p.stamps, p.stamp_score + 1, 2);
  // The adaptive rule takes keyed pages only: the list may be shorter than the budget.
  if (p.adaptive) nsel = min(nsel, all_keyed);
  const int total = sp.kept + nsel;
  for (int j = tid; j < s0; j += kHierThreads) out[j] = j;
  for (int j = window + tid; j < n; j += kHierThreads) out[s0 + nsel + (j - window)] = j;
  for (int i = total + tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
  if (tid == 0) *out_count = total;
  if (nsel == 0) return;
  std::int32_t* dst = out + s0;
  if (all_keyed >= nsel) {
    const unsigned long long thr =
        block_select::radix_threshold<kHierThreads>(s_cand, m, nsel, s_hist, s_pick);
    detail::stamp(p.stamps, p.stamp_score + 1, 3);
    // Candidates are in id order: the taken ones written in that order.
    block_select::ordered_compact<kHierThreads>(
        m, s_warp, [&](int i) { return s_cand[i] >= thr; },
        [&](int i, int r) { dst[r] = static_cast<std::int32_t>(~static_cast<std::uint32_t>(s_cand[i])); });
  } else {
    // Every keyed page plus the first `zeros` pages of key 0, in id order: kHierThreads pages
    // a round, each page's rank among the key-0 pages and among the taken ones by block scans.
    const int zeros = nsel - all_keyed;
    // Keyed: a nonzero key of a chosen group's page (other pages' keys are 0 after both paths;
    // testing membership keeps this rule independent of that).
    const auto chosen = [&](int grp) {  // the list is ascending
      int lo = 0, hi = mg;
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (gl[mid] < grp) lo = mid + 1; else hi = mid;
      }
      return lo < mg && gl[lo] == grp;
    };
    int zeros_before = 0, taken_before = 0;
    for (int j0 = sinks; j0 < window && taken_before < nsel; j0 += kHierThreads) {
      const int j = j0 + tid;
      const bool live = j < window;
      const bool keyed_j = live && chosen(j / kWarpPages) && keys[j] != 0u;
      const bool zero_j = live && !keyed_j;
      int round_zeros = 0;
      const int zrank = zeros_before + block_select::exclusive_scan<kHierThreads>(
                                           zero_j ? 1 : 0, s_warp, round_zeros);
      const bool take = keyed_j || (zero_j && zrank < zeros);
      int round_taken = 0;
      const int at = taken_before + block_select::exclusive_scan<kHierThreads>(
                                        take ? 1 : 0, s_warp, round_taken);
      if (take) dst[at] = j;
      zeros_before += round_zeros;
      taken_before += round_taken;
    }
  }
}

__global__ void __launch_bounds__(kHierThreads) hier_page_topk_kernel(SelParams p,
                                                                      const std::int32_t* gids,
                                                                      const std::int32_t* gcount,
                                                                      int gstride) {
  extern __shared__ unsigned long long s_cand[];  // [gstride * kWarpPages]
  __shared__ int s_hist[256], s_pick[3], s_warp[kHierThreads / 32];
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  detail::stamp(p.stamps, p.stamp_score + 1, 0);
  // The split reads the page table only, written before this step's first (plain) launch:
  // before the wait, so its round trip overlaps the predecessor's tail.
  const TopkSplit sp = topk_split_of(p, b, threadIdx.x == 0);
  detail::wait_for_predecessor();
  // The group list's lines into L1 now: its address needs no load, while its first use waits
  // for the count (gathering the candidates took ~2 µs after the wait, profile-phases).
  detail::prefetch_l1_lines(gids + slot * gstride, gids + (slot + 1) * gstride, threadIdx.x,
                            kHierThreads);
  detail::stamp(p.stamps, p.stamp_score + 1, 1);
  detail::allow_dependents();  // the decode launches now and waits on the device (as above)
  hier_page_topk(p, b, h, sp, gids + slot * gstride, min(gcount[slot], gstride), s_cand, s_hist,
                 s_pick, s_warp);
  detail::stamp(p.stamps, p.stamp_score + 1, stamps::kExit);
}

// ---- hierarchical selection in one kernel ------------------------------------------------------

constexpr int kFusedThreads = kHierThreads;  // 8 scoring warps (stages fit at d 64 and 128)

// hier_select in one launch (SelectLaunch::HierKernel::fused; hier_launch says when): a
// thread-block cluster of C CTAs per (sequence, kv head), grid (C, kv heads, batch),
// kFusedThreads threads. Why: at B = 1 the four launches of the separate path are each a few
// µs of latency while the bytes they move take well under one (docs/gpu-results.md).
//  0. CTA x scores group tiles [x·T, (x + 1)·T) of the pair (quest_score_kernel's code,
//     score_tiles, on the group store) into the group keys; cluster barrier.
//  1. Every CTA ranks all the pair's group keys itself, as the block top-k does at the group
//     level (the kept groups, then the best others by key, ties to the lower id): the top nsel
//     of the 64-bit (key, ~id) by radix selection, written ascending by an ordered compaction.
//     The CTAs compute the same list from the same keys, so nothing is exchanged; CTA 0 writes
//     it to the workspace (SelectWorkspace::group_ids).
//  2. CTA x scores the tiles of list entries [x·S, (x + 1)·S), S = ceil(count / C) (score_tiles,
//     list mode, on the page store: bf16 or 8-bit); cluster barrier.
//  3. CTA 0 selects the pages (hier_page_topk) from the chosen groups' keys.
// Page keys outside the chosen groups are 0, as after the separate launches (step 0 zeroes the
// sequence's keys). Global writes before each cluster barrier are fenced (__threadfence), so
// the other CTAs read them after it.
// Dynamic shared memory: [0, list_off) the group candidates (1), the scoring stages and q (0,
// 2), the page candidates (3), one after the other; the group list (gstride ints) at list_off.
template <int kD, bool kU8>
__global__ void __launch_bounds__(kFusedThreads, 1) hier_fused_kernel(SelParams gp, SelParams pp,
                                                                   std::int32_t* gids,
                                                                   std::int32_t* gcount,
                                                                   int gstride, int list_off) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  extern __shared__ uint4 smem_raw[];
  __shared__ int s_hist[256], s_pick[3], s_warp[kFusedThreads / 32];
  unsigned char* smem = reinterpret_cast<unsigned char*>(smem_raw);
  auto* s_cand = reinterpret_cast<unsigned long long*>(smem);
  auto* s_glist = reinterpret_cast<std::int32_t*>(smem + list_off);
  cg::cluster_group cluster = cg::this_cluster();
  const int x = blockIdx.x, C = gridDim.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const std::int64_t slot = static_cast<std::int64_t>(b) * gp.num_kv_heads + h;
  // A decode launched next by programmatic dependent launch may be scheduled now (it waits for
  // this grid to finish before it reads anything), so its launch overlaps this selection.
  detail::allow_dependents();
  detail::stamp(gp.stamps, stamps::hier_fused, 0);
  // No early return anywhere: every CTA reaches both cluster barriers.

  // 0. This CTA's share of the page keys set to 0 (the chosen groups' are written in step 2,
  // after the barrier: every other page keeps 0, as after the separate launches), then its
  // group tiles.
  {
    const int n = max(seq_pages(pp, b), 0);
    const int per = (n + C - 1) / C;
    std::uint32_t* keys = pp.keys + slot * pp.max_pages;
    for (int j = x * per + tid; j < min(n, (x + 1) * per); j += kFusedThreads) keys[j] = 0u;
  }
  {
    const int ng = seq_pages(gp, b);  // groups of the sequence (flags a bad group table)
    const int per = ((max(ng, 0) + kWarpPages - 1) / kWarpPages + C - 1) / C * kWarpPages;
    const int j0 = min(max(ng, 0), x * per), j1 = min(max(ng, 0), j0 + per);
    score_tiles<kD, false>(gp, smem, b, h, ng, nullptr, j0, j1);
  }
  detail::stamp(gp.stamps, stamps::hier_fused, 1);
  __threadfence();
  cluster.sync();  // every CTA's group keys and zeroed page keys written
  detail::stamp(gp.stamps, stamps::hier_fused, 2);

  // 1. The group list (uniform branches: every thread computes the same split).
  const TopkSplit sp = topk_split_of(gp, b, x == 0 && tid == 0);
  const int total = sp.bad || sp.n == 0 ? 0 : sp.total;
  if (total > 0) {
    const int s0 = min(sp.sinks, sp.window);
    const int nsel = max(sp.total - sp.kept, 0);
    for (int j = tid; j < s0; j += kFusedThreads) s_glist[j] = j;
    for (int j = sp.window + tid; j < sp.n; j += kFusedThreads)
      s_glist[s0 + nsel + (j - sp.window)] = j;
    const int lo = sp.sinks, cand = sp.window - sp.sinks;
    std::int32_t* dst = s_glist + s0;
    if (nsel >= cand) {  // every candidate (nsel <= cand: total <= n)
      for (int i = tid; i < nsel; i += kFusedThreads) dst[i] = lo + i;
    } else if (nsel > 0) {
      const std::uint32_t* keys = gp.keys + slot * gp.max_pages;
      for (int i = tid; i < cand; i += kFusedThreads) {
        const int j = lo + i;
        s_cand[i] = (static_cast<unsigned long long>(keys[j]) << 32) |
                    static_cast<std::uint32_t>(~j);
      }
      __syncthreads();
      const unsigned long long thr =
          block_select::radix_threshold<kFusedThreads>(s_cand, cand, nsel, s_hist, s_pick);
      block_select::ordered_compact<kFusedThreads>(
          cand, s_warp, [&](int i) { return s_cand[i] >= thr; },
          [&](int i, int r) { dst[r] = lo + i; });
    }
  }
  __syncthreads();  // the list; the candidates' memory is the scoring's from here on
  detail::stamp(gp.stamps, stamps::hier_fused, 3);
  if (x == 0) {
    std::int32_t* out = gids + slot * gstride;
    for (int i = tid; i < gstride; i += kFusedThreads) out[i] = i < total ? s_glist[i] : -1;
    if (tid == 0) gcount[slot] = total;
  }

  // 2. This CTA's share of the chosen groups' pages.
  {
    const int share = (total + C - 1) / C;
    const int j0 = min(total, x * share), j1 = min(total, j0 + share);
    score_tiles<kD, kU8>(pp, smem, b, h, seq_pages(pp, b), s_glist, j0, j1);
  }
  detail::stamp(gp.stamps, stamps::hier_fused, 4);
  __threadfence();
  cluster.sync();  // every CTA's page keys written
  detail::stamp(gp.stamps, stamps::hier_fused, 5);

  // 3. The page selection, by CTA 0 (its stages are free: candidates at offset 0).
  if (x == 0)
    hier_page_topk(pp, b, h, topk_split_of(pp, b, tid == 0), s_glist, total, s_cand, s_hist,
                   s_pick, s_warp);
  detail::stamp(gp.stamps, stamps::hier_fused, stamps::kExit);
#endif
}

// Hierarchical top-p (select::hier_top_p): what the page pass needs beyond SelParams.
struct TopPParams {
  const float* mean;  // page summaries [page][kv][d], count [page]
  const float* m2;
  const std::int32_t* count;
  int pool;
  const double* mv;  // group_moments_kernel's [B][Hq][mv_stride][2] over the moment groups
  int mv_stride;
  const std::int32_t *mindptr, *mindices, *mcount;  // moment table and counts
  int mslots, mnnz;
  double p, scale;
  double* masses;  // optional [B][Hkv][max_pages]: the mass of every kept and candidate page
  // Workspace: per (sequence, kv head) `items` items (its kept pages, then the candidate slots):
  // lw [item][q head of the group] = log n + m + v/2 (-inf: no mass), page [item] (-1: none).
  double* lw;
  std::int32_t* item_page;
  int items;
};

// Item `it` of (sequence, kv head): kept pages first (sinks [0, s0), window [window, n)), then
// the chosen groups' pages of [sinks, window) in id order (none when nothing is to be taken).
struct TopPItems {
  int s0, window, kept, m, sinks;
  const std::int32_t* gids;
  __device__ int page(int it) const {
    if (it < kept) return it < s0 ? it : window + (it - s0);
    const int ci = it - kept;
    if (ci >= m) return -1;
    const int j = gids[ci / kWarpPages] * kWarpPages + ci % kWarpPages;
    return j >= sinks && j < window ? j : -1;
  }
};
__device__ TopPItems top_p_items(const SelParams& p, const TopkSplit& sp, const std::int32_t* gids,
                                 const std::int32_t* gcount, int gstride, std::int64_t slot) {
  TopPItems r;
  r.sinks = sp.sinks;
  r.window = sp.window;
  r.s0 = min(sp.sinks, sp.window);
  r.kept = r.s0 + (sp.n - sp.window);
  r.m = sp.total > sp.kept ? min(gcount[slot], gstride) * kWarpPages : 0;
  r.gids = gids + slot * gstride;
  return r;
}

// grid (ceil(items / 32), kv heads, batch): an octet of lanes per item computes, for every q
// head of the group, log n + m + v/2 of the item's page from its summaries (octet_moments: the
// CPU's m and v bits). Spread over the GPU: one CTA per (sequence, kv head) doing this in
// turn was slow (docs/gpu-results.md, tuning notes).
template <int kD>
__global__ void __launch_bounds__(kHierThreads) top_p_weights_kernel(SelParams p, TopPParams t,
                                                                     const std::int32_t* gids,
                                                                     const std::int32_t* gcount,
                                                                     int gstride) {
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  detail::wait_for_predecessor();  // the group top-k's lists
  const TopkSplit sp = topk_split_of(p, b, false);
  if (sp.bad || sp.n == 0) return;
  const TopPItems items = top_p_items(p, sp, gids, gcount, gstride, slot);
  const int it = blockIdx.x * (kHierThreads / 8) + tid / 8;
  if (it >= items.kept + items.m || it >= t.items) return;  // whole octets
  const int j = items.page(it);
  const int g = p.group;
  double* lw = t.lw + (slot * t.items + it) * g;
  if (tid % 8 == 0) t.item_page[slot * t.items + it] = j;
  if (j < 0) return;
  const int phys = p.indices[p.indptr[b] + j];
  const bool ok = phys >= 0 && phys < t.pool;
  if (!ok && tid % 8 == 0) atomicOr(p.err, kBadPhysical);
  const int cnt = ok ? t.count[phys] : 0;
  const std::int64_t row = (static_cast<std::int64_t>(ok ? phys : 0) * p.num_kv_heads + h) * kD;
  for (int i = 0; i < g; ++i) {
    double m, v;
    detail::octet_moments<kD>(t.mean + row, t.m2 + row, p.q + b * p.q_s0 + (h * g + i) * p.q_s1,
                              static_cast<double>(cnt), t.scale, m, v);
    if (tid % 8 == 0)
      lw[i] = cnt > 0 ? __dadd_rn(__dadd_rn(log(static_cast<double>(cnt)), m), 0.5 * v)
                      : -INFINITY;
  }
}

// Descending bitonic sort of n (a power of two) keys in shared memory by the CTA.
__device__ void block_sort_desc(unsigned long long* keys, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const unsigned long long a = keys[lo], c = keys[hi];
        if ((a < c) == desc) {
          keys[lo] = c;
          keys[hi] = a;
        }
      }
    }
  __syncthreads();
}

// One CTA per (sequence, kv head): log Z per q head (a warp's log-sum-exp over the moment
// groups), each item's mass mean_h exp(lw_h - log Z_h) (select::hier_top_p's operations and
// order), the kept pages' masses summed in page order, the candidates keyed (float mass,
// ~position), the top `need` found by radix selection and sorted, then one thread takes them
// while the count is below p (the CPU's additions in the CPU's order: the same decisions on the
// same masses), and the list is written ascending.
__global__ void __launch_bounds__(kHierThreads) hier_top_p_kernel(SelParams p, TopPParams t,
                                                                  const std::int32_t* gids,
                                                                  const std::int32_t* gcount,
                                                                  int gstride) {
  // Sized by the chosen groups' pages, cap = gstride * kWarpPages (<= kHierCand; top_p_smem):
  // [cap] candidate keys, then flags; [pow2_ceil(cap)] the top ones, sorted; [cap] masses.
  extern __shared__ unsigned long long s_dyn[];
  const int cap = gstride * kWarpPages;
  unsigned long long* s_key = s_dyn;
  unsigned long long* s_sel = s_key + cap;
  double* s_mass = reinterpret_cast<double*>(s_sel + pow2_ceil(cap));
  __shared__ double s_logz[kMaxGroupDims / 64];
  __shared__ int s_hist[256], s_pick[3], s_warp[kHierThreads / 32], s_taken;
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  std::int32_t* out = p.out_ids + slot * p.max_per_head;
  detail::wait_for_predecessor();  // the weights
  const TopkSplit sp = topk_split_of(p, b, tid == 0);
  const int n = sp.n, g = p.group;
  if (sp.bad || n == 0) {
    for (int i = tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
    if (tid == 0) p.out_count[slot] = 0;
    return;
  }
  const TopPItems items = top_p_items(p, sp, gids, gcount, gstride, slot);
  const int Hq = p.num_kv_heads * g;
  // A moment table the moments kernel flagged ("moment_indptr") counts as no groups here.
  const int mbegin = t.mindptr[b], mend = t.mindptr[b + 1];
  const int ng = mbegin >= 0 && mend >= mbegin && mend <= t.mnnz && mend - mbegin <= t.mv_stride
                     ? mend - mbegin
                     : 0;
  for (int i = warp; i < g; i += kHierThreads / 32) {
    const double* mv = t.mv + (static_cast<std::int64_t>(b) * Hq + h * g + i) * t.mv_stride * 2;
    const auto term = [&](int G) {
      const int ms = t.mindices[mbegin + G];
      const int cnt = ms >= 0 && ms < t.mslots ? t.mcount[ms] : 0;
      return cnt > 0 ? __dadd_rn(__dadd_rn(log(static_cast<double>(cnt)), mv[2 * G]),
                                 0.5 * mv[2 * G + 1])
                     : -INFINITY;
    };
    double mx = -INFINITY;
    for (int G = lane; G < ng; G += 32) mx = fmax(mx, term(G));
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int G = lane; G < ng; G += 32) {
      const double x = term(G);
      sum += x == -INFINITY ? 0.0 : exp(x - mx);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) s_logz[i] = mx + log(sum);
  }
  __syncthreads();
  double* masses = t.masses != nullptr ? t.masses + slot * p.max_pages : nullptr;
  const auto mass_of = [&](int it) {
    const double* lw = t.lw + (slot * t.items + it) * g;
    double agg = 0;
    for (int i = 0; i < g; ++i)
      agg = __dadd_rn(agg, __ddiv_rn(exp(__dsub_rn(lw[i], s_logz[i])), static_cast<double>(g)));
    return agg;
  };
  // Kept pages: thread 0 sums their masses in page order (few: the sinks and the window).
  double held = 0;
  if (tid == 0)
    for (int it = 0; it < items.kept; ++it) {
      const double mk = t.item_page[slot * t.items + it] >= 0 ? mass_of(it) : 0.0;
      held += mk;
      if (masses) masses[items.page(it)] = mk;
    }
  // Candidates: position ci = item - kept, in id order.
  const int m = items.m;
  int keyed = 0;
  for (int ci = tid; ci < m; ci += kHierThreads) {
    const int j = t.item_page[slot * t.items + items.kept + ci];
    const double mass = j >= 0 ? mass_of(items.kept + ci) : 0.0;
    s_mass[ci] = mass;
    s_key[ci] = j >= 0 ? (static_cast<unsigned long long>(ordered_key(static_cast<float>(mass)))
                          << 32) | static_cast<std::uint32_t>(~ci)
                       : 0ull;
    keyed += j >= 0;
    if (j >= 0 && masses) masses[j] = mass;
  }
  int all_keyed = 0;
  block_select::exclusive_scan<kHierThreads>(keyed, s_warp, all_keyed);  // also a barrier
  const int need = max(sp.total - sp.kept, 0);
  const int nsel = min(need, all_keyed);
  if (nsel > 0) {
    const unsigned long long thr =
        block_select::radix_threshold<kHierThreads>(s_key, m, nsel, s_hist, s_pick);
    block_select::ordered_compact<kHierThreads>(
        m, s_warp, [&](int i) { return s_key[i] >= thr; },
        [&](int i, int r) { s_sel[r] = s_key[i]; });
    const int pow2 = pow2_ceil(nsel);
    for (int i = nsel + tid; i < pow2; i += kHierThreads) s_sel[i] = 0ull;
    block_sort_desc(s_sel, pow2);
  }
  if (tid == 0) {
    int taken = 0;
    while (taken < nsel && held < t.p)
      held += s_mass[~static_cast<std::uint32_t>(s_sel[taken++])];
    s_taken = taken;
  }
  __syncthreads();
  const int taken = s_taken;
  // Flag the taken positions in s_key's space (0: not taken), then write in id order.
  for (int i = tid; i < m; i += kHierThreads) s_key[i] = 0ull;
  __syncthreads();
  for (int e = tid; e < taken; e += kHierThreads)
    s_key[~static_cast<std::uint32_t>(s_sel[e])] = 1ull;
  __syncthreads();
  const int s0 = items.s0, window = items.window, total = items.kept + taken;
  for (int j = tid; j < s0; j += kHierThreads) out[j] = j;
  for (int j = window + tid; j < n; j += kHierThreads) out[s0 + taken + (j - window)] = j;
  for (int i = total + tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
  if (tid == 0) p.out_count[slot] = total;
  if (taken == 0) return;
  block_select::ordered_compact<kHierThreads>(
      m, s_warp, [&](int i) { return s_key[i] != 0ull; },
      [&](int i, int r) { out[s0 + r] = t.item_page[slot * t.items + items.kept + i]; });
}

// Keys a top-k CTA caches in shared memory (SelParams::key_cache's cap; the rest it reads
// from global memory): kKeyCache, or what the device leaves beside the block kernel's static
// arrays where that is less (an sm_80 GPU's 163 KB), in whole 1024-key steps.
int key_cache_cap() {
  static const int cap = static_cast<int>(
      std::min<std::size_t>(kKeyCache, detail::dynamic_smem_room(quest_topk_block_kernel) /
                                           sizeof(std::uint32_t) / 1024 * 1024));
  return cap;
}

// The block top-k kernel (one CTA per pair, no cluster), its shared-memory limit raised once.
TopkFn block_topk_kernel() {
  static std::once_flag once;
  std::call_once(once, [] {
    detail::set_dynamic_smem(quest_topk_block_kernel, sizeof(std::uint32_t) * key_cache_cap(),
                             "the block top-k");
  });
  return quest_topk_block_kernel;
}

// Which top-k runs: the block kernel (default), or the cluster kernel when
// MASSKV_TOPK=cluster or MASSKV_TOPK_CLUSTER forces a cluster size (the GPU check runs both).
bool use_cluster_topk() {
  static const bool cluster = [] {
    const char* e = std::getenv("MASSKV_TOPK");
    const char* c = std::getenv("MASSKV_TOPK_CLUSTER");
    return (e != nullptr && std::string_view(e) == "cluster") || (c != nullptr && *c != 0);
  }();
  return cluster;
}

// How hier_select's page pass finds the chosen groups' pages: walking the group list (list) or
// every tile of the sequence under the group mask (mask). List mode zeroes every page key first
// (one more node), so it pays only on long sequences: list from 16384 pages a sequence
// (docs/gpu-results.md, tuning notes); MASSKV_HIER_SCAN=list or =mask forces one (the check
// runs both).
bool hier_list_mode(int max_pages) {
  static const int forced = [] {
    const char* e = std::getenv("MASSKV_HIER_SCAN");
    if (e == nullptr) return 0;
    return std::string_view(e) == "list" ? 1 : std::string_view(e) == "mask" ? 2 : 0;
  }();
  return forced == 1 || (forced == 0 && max_pages >= 16384);
}

// One wave: the (sequence, kv head) pairs split into as many chunks as resident CTA slots
// allow (each CTA's warps then stream many tiles through their pipelines); chunks of whole
// kChunkAlign pages. With more pairs than slots, one chunk per pair.
int plan_score_chunk(int pairs, int max_pages, int ctas_per_sm) {
  const int slots = std::max(1, device_sms() * ctas_per_sm);
  const int chunks = std::max(1, slots / std::max(1, pairs));
  int cp = (max_pages + chunks - 1) / chunks;
  cp = (cp + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  return std::max(cp, kChunkAlign);
}

// Tiles per scoring warp from which the fully unrolled kernel is faster (8: measured against 3
// and 64, docs/gpu-results.md, tuning notes). MASSKV_SCORE_HOT_TILES=n overrides it
// (profile-phases compares values side by side).
int hot_tiles() {
  static const int v = [] {
    const char* e = std::getenv("MASSKV_SCORE_HOT_TILES");
    const int n = e != nullptr ? std::atoi(e) : 0;
    return n > 0 ? n : 8;
  }();
  return v;
}

struct Prepared {
  SelParams p{};
  dim3 score_grid, topk_grid;
  ScoreFn score = nullptr;  // plan.fn or plan.fn_hot by the chunk (set_score_kernel)
  ScorePlan plan;
  void (*topk)(SelParams) = nullptr;
  bool block_topk = false;  // the block kernel: launched with programmatic dependent launch
  int score_threads = 0;
  std::size_t smem = 0, topk_smem = 0;
};

// The scoring kernel for the chunk p.chunk_pages (pages, or 16 × list entries a CTA): the
// unrolled one where each warp has hot_tiles() tiles or more.
void set_score_kernel(Prepared& pr) {
  const int tiles = (pr.p.chunk_pages / kWarpPages + pr.plan.warps - 1) / pr.plan.warps;
  pr.score = tiles >= hot_tiles() ? pr.plan.fn_hot : pr.plan.fn;
}

void check_policy(const select::TopkPolicy& pol) {
  using enum ErrorCode;
  require(pol.budget_pages >= 0, invalid_argument, "budget_pages", "must be >= 0, got ",
          pol.budget_pages);
  require(pol.sink_pages >= 0, invalid_argument, "sink_pages", "must be >= 0, got ",
          pol.sink_pages);
  require(pol.window_tokens >= 0, invalid_argument, "window_tokens", "must be >= 0, got ",
          pol.window_tokens);
}

}  // namespace

struct SelectWorkspace::Impl {
  detail::GrowBuffer<std::uint32_t> keys;
  std::size_t keys_used = 0;
  int stride = 0;
  // Hierarchical selection: group keys, group lists and counts, the group mask.
  detail::GrowBuffer<std::uint32_t> gkeys;
  std::size_t gkeys_used = 0;
  int gstride = 0;
  detail::GrowBuffer<std::int32_t> gids, gcount;
  std::size_t gids_used = 0, gcount_used = 0;
  int glist_stride = 0;
  bool hier_fused = false;  // the last hier_select ran as one kernel
  detail::GrowBuffer<std::uint8_t> gmask;
  // Entmax-aware ranking: (m, v) per (sequence, q head, moment group) and τ̂ per (sequence, q head).
  detail::GrowBuffer<double> mv, tau;
  std::size_t tau_used = 0;
  // Top-p: log-weights per (item, q head) and the items' pages.
  detail::GrowBuffer<double> lw;
  detail::GrowBuffer<std::int32_t> item_page;
  detail::ErrorFlag err;
};

SelectWorkspace::SelectWorkspace() : impl_(std::make_unique<Impl>()) {}

SelectWorkspace::~SelectWorkspace() = default;

std::span<const std::uint32_t> SelectWorkspace::page_keys() const {
  return {impl_->keys.data(), impl_->keys_used};
}
int SelectWorkspace::keys_stride() const { return impl_->stride; }
std::span<const std::uint32_t> SelectWorkspace::group_keys() const {
  return {impl_->gkeys.data(), impl_->gkeys_used};
}
int SelectWorkspace::group_keys_stride() const { return impl_->gstride; }
std::span<const std::int32_t> SelectWorkspace::group_ids() const {
  return {impl_->gids.data(), impl_->gids_used};
}
bool SelectWorkspace::last_hier_fused() const { return impl_->hier_fused; }
std::span<const std::int32_t> SelectWorkspace::group_counts() const {
  return {impl_->gcount.data(), impl_->gcount_used};
}
int SelectWorkspace::group_list_stride() const { return impl_->glist_stride; }
std::span<const double> SelectWorkspace::tau() const {
  return {impl_->tau.data(), impl_->tau_used};
}

void SelectWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "select step");
  if (flag == 0) return;
  if (flag & kBadPhysical)
    fail(ErrorCode::out_of_range, "indices",
         "a page id outside [0, bounds.num_pages) was met on the GPU");
  if (flag & kBadIndptr)
    fail(ErrorCode::out_of_range, "indptr",
         "decreasing, past indices.size(), or a sequence longer than "
         "SelectLaunch::max_pages_per_seq");
  if (flag & kBadLastLen)
    fail(ErrorCode::out_of_range, "last_page_len", "a value outside [1, page_size] on the GPU");
  if (flag & kBadMomentSlot)
    fail(ErrorCode::out_of_range, "moment_indices",
         "a moment group slot outside the moment store was met on the GPU");
  if (flag & kBadMomentIndptr)
    fail(ErrorCode::out_of_range, "moment_indptr",
         "decreasing, past moment_indices.size(), or more groups than max_pages_per_seq needs");
  if (flag & kBadSelection)
    fail(ErrorCode::invalid_argument, "selection",
         "a list that is not ascending, or holds a page beyond its sequence, was met on the GPU");
  if (flag & kBadCapacity)
    fail(ErrorCode::shape_mismatch, "max_per_head",
         "a selection holds more pages than the output lists (see select_capacity)");
  fail(ErrorCode::non_finite, "q", "a page bound is NaN (non-finite q or summaries)");
}

int select_capacity(int max_pages_per_seq, int page_size, const select::TopkPolicy& policy) {
  check_policy(policy);
  require(page_size >= 1, ErrorCode::invalid_argument, "page_size", "must be >= 1");
  const int n = std::max(0, max_pages_per_seq);
  const std::int64_t window_pages =
      policy.window_tokens > 0
          ? (static_cast<std::int64_t>(policy.window_tokens) + page_size - 1) / page_size + 1
          : 1;
  const std::int64_t kept =
      std::min<std::int64_t>(n, static_cast<std::int64_t>(policy.sink_pages) + window_pages);
  return static_cast<int>(
      std::min<std::int64_t>(n, std::max<std::int64_t>(policy.budget_pages, kept)));
}

namespace {

// Which key buffer a launch writes: the page keys, or the group keys of hier_select.
enum class KeyLevel { pages, groups };

Prepared prepare(const QuestSelectArgs& a, const SelectLaunch& launch, bool outputs,
                 KeyLevel level = KeyLevel::pages) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const bool u8 = a.bounds8.min != nullptr;
  // The store's shape and pointers, whichever it is.
  struct {
    const void *min, *max;
    int num_pages, num_kv_heads, head_dim;
  } s = u8 ? decltype(s){a.bounds8.min, a.bounds8.max, a.bounds8.num_pages, a.bounds8.num_kv_heads,
                         a.bounds8.head_dim}
           : decltype(s){a.bounds.min, a.bounds.max, a.bounds.num_pages, a.bounds.num_kv_heads,
                         a.bounds.head_dim};
  const int d = s.head_dim;
  require(d == 64 || d == 128 || d == 256, unsupported, "head_dim",
          "the CUDA selector serves head_dim 64, 128, 256; got ", d);
  require(s.min != nullptr && s.max != nullptr && s.num_pages > 0 && s.num_kv_heads > 0,
          invalid_argument, "bounds", "null min/max or empty store");
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  };
  require(aligned16(s.min) && aligned16(s.max), invalid_argument, "bounds",
          "min and max must be 16-byte aligned");
  require(!u8 || (a.bounds8.grid != nullptr &&
                  reinterpret_cast<std::uintptr_t>(a.bounds8.grid) % 8 == 0),
          invalid_argument, "bounds", "the 8-bit store needs its grid, 8-byte aligned");
  const int B = a.q.n0, Hq = a.q.n1, Hkv = s.num_kv_heads;
  require(a.q.data != nullptr && a.q.n2 == d && B >= 0, shape_mismatch, "q",
          "must be [batch][q heads][head_dim] with the store's head_dim");
  require(Hq > 0 && Hq % Hkv == 0, shape_mismatch, "q", "q heads (", Hq,
          ") must be a multiple of the kv heads (", Hkv, ")");
  const int group = Hq / Hkv;
  require(static_cast<std::int64_t>(group) * d <= kMaxGroupDims, unsupported, "q",
          "group * head_dim must be <= ", kMaxGroupDims);
  require(a.table.indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch, "indptr",
          "needs batch + 1 entries (batch from q)");
  require(a.table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs batch entries");
  require(a.page_size >= 1, invalid_argument, "page_size", "must be >= 1, got ", a.page_size);
  check_policy(a.policy);
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  require(launch.chunk_pages >= 0 && launch.chunk_pages % kChunkAlign == 0,
          invalid_argument, "chunk_pages", "must be 0 or a multiple of ", kChunkAlign);
  if (outputs) {
    require(a.max_per_head >= 0, invalid_argument, "max_per_head", "must be >= 0");
    require(a.ids.size() == static_cast<std::size_t>(B) * Hkv * a.max_per_head &&
                (a.ids.data() != nullptr || a.ids.empty()),
            shape_mismatch, "ids", "needs batch * kv heads * max_per_head entries");
    require(a.count.size() == static_cast<std::size_t>(B) * Hkv, shape_mismatch, "count",
            "needs batch * kv heads entries");
  }
  const float scale = a.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : a.scale;
  require(std::isfinite(scale) && scale > 0, invalid_argument, "scale",
          "must be finite and > 0, got ", a.scale);

  const ScorePlan splan = score_plan(d, group, u8);
  Prepared pr;
  SelParams& p = pr.p;
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.mn = reinterpret_cast<const std::uint16_t*>(s.min);
  p.mx = reinterpret_cast<const std::uint16_t*>(s.max);
  p.grid = u8 ? a.bounds8.grid : nullptr;
  p.pool_pages = s.num_pages;
  p.num_kv_heads = Hkv;
  p.group = group;
  p.page_size = a.page_size;
  p.indptr = a.table.indptr.data();
  p.indices = a.table.indices.data();
  require(a.table.indices.size() <= static_cast<std::size_t>(INT32_MAX), shape_mismatch, "indices",
          "more than 2^31 - 1 entries");
  p.nnz = static_cast<int>(a.table.indices.size());
  p.last_len = a.table.last_page_len.data();
  p.scale = scale;
  p.slack_f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
  p.max_pages = launch.max_pages_per_seq;
  p.chunk_pages = launch.chunk_pages > 0 ? launch.chunk_pages
                                         : plan_score_chunk(B * Hkv, launch.max_pages_per_seq,
                                                            splan.ctas_per_sm);
  p.budget = a.policy.budget_pages;
  p.sinks = a.policy.sink_pages;
  p.window_tokens = a.policy.window_tokens;
  p.max_per_head = a.max_per_head;
  p.out_ids = a.ids.data();
  p.out_count = a.count.data();

  SelectWorkspace::Impl& ws = launch.workspace->impl();
  const std::size_t nkeys = static_cast<std::size_t>(B) * Hkv * launch.max_pages_per_seq;
  if (level == KeyLevel::pages) {
    ws.keys.reserve(nkeys, "cudaMalloc(page keys)");
    ws.keys_used = nkeys;
    ws.stride = launch.max_pages_per_seq;
    p.keys = ws.keys.data();
  } else {
    ws.gkeys.reserve(nkeys, "cudaMalloc(group keys)");
    ws.gkeys_used = nkeys;
    ws.gstride = launch.max_pages_per_seq;
    p.keys = ws.gkeys.data();
  }
  p.err = ws.err.get();
  p.stamps = launch.phase_stamps;
  p.stamp_score = level == KeyLevel::pages ? stamps::page_score : stamps::group_score;

  const int chunks = (launch.max_pages_per_seq + p.chunk_pages - 1) / p.chunk_pages;
  require(B <= 65535, unsupported, "q", "batch must be <= 65535");
  require(Hkv <= 65535, unsupported, "bounds", "num_kv_heads must be <= 65535");
  pr.score_grid = dim3(chunks, Hkv, B);
  // The block kernel where one CTA per pair is the plan; clusters where the plan splits a
  // pair's pages (long sequences), where they beat it (docs/gpu-results.md, tuning notes).
  // Before sm_90 (no clusters) the block kernel serves every length.
  require(detail::hopper_paths() || !use_cluster_topk(), unsupported, "MASSKV_TOPK",
          "the cluster top-k needs sm_90 (thread-block clusters)");
  const int planned =
      detail::hopper_paths() ? plan_topk_cluster(B * Hkv, launch.max_pages_per_seq) : 1;
  pr.block_topk = !use_cluster_topk() && planned == 1;
  const int tc = pr.block_topk ? 1 : planned;
  pr.topk_grid = dim3(tc, Hkv, B);
  pr.topk = pr.block_topk ? block_topk_kernel() : topk_kernel(tc);
  pr.plan = splan;
  set_score_kernel(pr);
  pr.score_threads = splan.warps * 32;
  pr.smem = splan.smem;
  // A CTA's slice of the candidates (whole warps), cached up to key_cache_cap() keys.
  const int slice = (launch.max_pages_per_seq + tc * 32 - 1) / (tc * 32) * 32;
  p.key_cache = std::min(slice, key_cache_cap());
  pr.topk_smem = sizeof(std::uint32_t) * static_cast<std::size_t>(p.key_cache);
  return pr;
}

// The top-k launch: the block kernel may start while the scoring kernel finishes (it waits
// for the keys on the device), the cluster kernel after it.
void launch_topk(const Prepared& pr, cudaStream_t stream) {
  if (!pr.block_topk) {  // clusters of kC = grid.x CTAs: one per (sequence, kv head)
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg =
        detail::cluster_config(pr.topk_grid, dim3(kTopkThreads), pr.topk_smem, stream, attr,
                               static_cast<int>(pr.topk_grid.x));
    check_cuda(cudaLaunchKernelEx(&cfg, pr.topk, pr.p), "quest top-k kernel launch");
    return;
  }
  detail::PdlLaunch l(stream, pr.topk_grid, dim3(kTopkThreads), pr.topk_smem);
  check_cuda(cudaLaunchKernelEx(&l.cfg, pr.topk, pr.p), "quest top-k kernel launch");
}

// hier_select's page top-k over the chosen groups' pages (programmatic dependent launch, as
// the block top-k: its prologue overlaps the page scoring's tail).
void launch_hier_page_topk(const SelParams& p, const std::int32_t* gids,
                           const std::int32_t* gcount, int gstride, dim3 grid,
                           cudaStream_t stream) {
  const std::size_t smem = sizeof(unsigned long long) * gstride * kWarpPages;
  static std::once_flag once;
  std::call_once(once, [] {
    detail::set_dynamic_smem(hier_page_topk_kernel, sizeof(unsigned long long) * kHierCand,
                             "the hierarchical page top-k");
  });
  detail::PdlLaunch l(stream, grid, dim3(kHierThreads), smem);
  check_cuda(cudaLaunchKernelEx(&l.cfg, hier_page_topk_kernel, p, gids, gcount, gstride),
             "hier page top-k kernel launch");
}

// MASSKV_HIER_FUSED=1: SelectLaunch::HierKernel::automatic takes hier_fused_kernel where it
// serves (hier_fused_plan); unset or 0: the separate launches, the default because they measured
// faster (fewer CTAs per scan in the fused kernel, and every CTA ranks all the group keys
// itself; docs/gpu-results.md, tuning notes).
bool hier_fused_wanted() {
  static const bool on = [] {
    const char* e = std::getenv("MASSKV_HIER_FUSED");
    return e != nullptr && std::string_view(e) == "1";
  }();
  return on;
}

constexpr int kFusedMaxCtas = 8;  // CTAs per (sequence, kv head): a portable cluster

struct FusedPlan {
  void (*fn)(SelParams, SelParams, std::int32_t*, std::int32_t*, int, int) = nullptr;
  int ctas = 0;  // the cluster (grid.x)
  int list_off = 0;
  std::size_t smem = 0;
};

// The fused kernel for this call, or fn == null where it does not serve: head_dim 64 or 128,
// at most kHierCand chosen pages, everything in the shared memory that fits, and clusters the
// device can schedule. pairs = batch * kv heads.
FusedPlan plan_hier_fused(int d, bool u8, int group, int max_groups, int gcap, int pairs);
FusedPlan hier_fused_plan(int d, bool u8, int group, int max_groups, int gcap, int pairs) {
  // Cached per device (the shared-memory attribute is set per device): the occupancy query
  // costs host time on every step otherwise. Bounded: shapes that change every step (batch,
  // max pages) start it over now and then.
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mu;
  static std::map<std::tuple<int, int, bool, int, int, int, int>, FusedPlan> cache;
  const auto key = std::make_tuple(device, d, u8, group, max_groups, gcap, pairs);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 256) cache.clear();
  return cache[key] = plan_hier_fused(d, u8, group, max_groups, gcap, pairs);
}
FusedPlan plan_hier_fused(int d, bool u8, int group, int max_groups, int gcap, int pairs) {
  FusedPlan f;
  if (!detail::hopper_paths() || (d != 64 && d != 128) || gcap * kWarpPages > kHierCand)
    return f;
  const std::size_t region = std::max(
      {score_sizes(d, false, group).bytes(kFusedThreads / 32),  // step 0: bf16 groups
       score_sizes(d, u8, group).bytes(kFusedThreads / 32),     // step 2: the page store
       sizeof(unsigned long long) * static_cast<std::size_t>(max_groups),         // step 1
       sizeof(unsigned long long) * static_cast<std::size_t>(gcap) * kWarpPages});  // step 3
  const std::size_t off = (region + 15) / 16 * 16;
  const std::size_t smem = off + sizeof(std::int32_t) * static_cast<std::size_t>(gcap);
  using Fn = decltype(f.fn);
  static const Fn fns[2][2] = {{hier_fused_kernel<64, false>, hier_fused_kernel<64, true>},
                               {hier_fused_kernel<128, false>, hier_fused_kernel<128, true>}};
  const Fn fn = fns[d == 64 ? 0 : 1][u8 ? 1 : 0];
  const std::size_t dyn_max = detail::dynamic_smem_room(fn);
  if (smem > dyn_max) return f;
  detail::set_dynamic_smem(fn, dyn_max, "the fused hierarchical selection");
  f.fn = fn;
  // Enough CTAs for one scoring warp per tile of the larger scan (group tiles or chosen
  // groups), at most one CTA per SM for all the pairs (B = 16 with 8 kv heads: clusters of 1).
  const int tiles = std::max((max_groups + kWarpPages - 1) / kWarpPages, gcap);
  int c = std::clamp((tiles + kFusedThreads / 32 - 1) / (kFusedThreads / 32), 1, kFusedMaxCtas);
  c = static_cast<int>(std::bit_floor(static_cast<unsigned>(c)));
  while (c > 1 && static_cast<std::int64_t>(pairs) * c > device_sms()) c /= 2;
  // The device must co-schedule one cluster of this size (its CTAs' shared memory).
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg =
      detail::cluster_config(dim3(c), dim3(kFusedThreads), smem, nullptr, attr, c);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, f.fn, &cfg) != cudaSuccess || clusters < 1) {
    (void)cudaGetLastError();
    f.fn = nullptr;
    return f;
  }
  f.ctas = c;
  f.list_off = static_cast<int>(off);
  f.smem = smem;
  return f;
}

// One launch: a cluster of f.ctas CTAs per (sequence, kv head).
void launch_hier_fused(const FusedPlan& f, const SelParams& gp, const SelParams& pp,
                       std::int32_t* gids, std::int32_t* gcount, int gstride, int kv_heads,
                       int batch, cudaStream_t stream) {
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = detail::cluster_config(
      dim3(f.ctas, kv_heads, batch), dim3(kFusedThreads), f.smem, stream, attr, f.ctas);
  check_cuda(cudaLaunchKernelEx(&cfg, f.fn, gp, pp, gids, gcount, gstride, f.list_off),
             "hier fused kernel launch");
}

// The dynamic shared memory hier_top_p_kernel may use, its limit raised once: kHierCand
// candidates' worth, or what the device leaves (an sm_80 GPU: about 6000 candidates).
std::size_t top_p_room() {
  static const std::size_t room = [] {
    const std::size_t r = std::min(top_p_smem(kHierCand / kWarpPages),
                                   detail::dynamic_smem_room(hier_top_p_kernel));
    detail::set_dynamic_smem(hier_top_p_kernel, r, "the top-p selection");
    return r;
  }();
  return room;
}

// hier_top_p's page pass: the weights over the GPU, then the selection per (sequence, kv head)
// (both by programmatic dependent launch, as the page top-k).
void launch_hier_top_p(const SelParams& p, const TopPParams& t, int d, const std::int32_t* gids,
                       const std::int32_t* gcount, int gstride, dim3 grid, cudaStream_t stream) {
  using Fn = void (*)(SelParams, TopPParams, const std::int32_t*, const std::int32_t*, int);
  const Fn weights = d == 64 ? top_p_weights_kernel<64>
                     : d == 128 ? top_p_weights_kernel<128>
                                : top_p_weights_kernel<256>;
  detail::PdlLaunch lw(stream, dim3((t.items + kHierThreads / 8 - 1) / (kHierThreads / 8), grid.y,
                                    grid.z),
                       dim3(kHierThreads));
  check_cuda(cudaLaunchKernelEx(&lw.cfg, weights, p, t, gids, gcount, gstride),
             "top-p weights kernel launch");
  detail::PdlLaunch l(stream, grid, dim3(kHierThreads), top_p_smem(gstride));
  check_cuda(cudaLaunchKernelEx(&l.cfg, hier_top_p_kernel, p, t, gids, gcount, gstride),
             "hier top-p kernel launch");
}

}  // namespace

void quest_score(const QuestSelectArgs& a, const SelectLaunch& launch) {
  const Prepared pr = prepare(a, launch, false);
  if (a.q.n0 == 0) return;
  cudaStream_t stream = launch.stream;
  pr.score<<<pr.score_grid, pr.score_threads, pr.smem, stream>>>(pr.p);
  check_cuda(cudaGetLastError(), "quest score kernel launch");
  if (launch.check_errors) launch.workspace->check(stream);
}

void quest_topk(const QuestSelectArgs& a, const SelectLaunch& launch) {
  const Prepared pr = prepare(a, launch, true);
  if (a.q.n0 == 0) return;
  launch_topk(pr, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

namespace {

// What hier_top_p adds to the hierarchical launch: the page pass becomes hier_top_p_kernel.
struct TopPExtra {
  kv::SummariesView pages;
  double p;
  std::span<double> masses;
};

// hier_select's launches, or hier_top_p's when topp is set (moments kernel only, then the
// group stage, then hier_top_p_kernel instead of the page scan and top-k).
void hier_launch(const HierSelectArgs& h, const SelectLaunch& launch, const TopPExtra* topp) {
  using enum ErrorCode;
  require(h.groups.num_kv_heads == (h.pages.bounds8.min != nullptr
                                        ? h.pages.bounds8.num_kv_heads
                                        : h.pages.bounds.num_kv_heads),
          shape_mismatch, "groups", "the group store needs the page store's kv heads");
  require(h.group_pages == kWarpPages, unsupported, "group_pages",
          "the CUDA hierarchical selector serves groups of ", kWarpPages, " pages, got ",
          h.group_pages);
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const QuestSelectArgs& a = h.pages;
  const int B = a.q.n0;
  require(h.group_indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch, "group_indptr",
          "needs batch + 1 entries");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int max_groups = (launch.max_pages_per_seq + kWarpPages - 1) / kWarpPages;
  // The group level: the group store over the group table, the last group kept (window 0),
  // the best m - 1 others (m = hier_groups without the per-sequence clamp, which the kernel's
  // min(n, budget) applies).
  QuestSelectArgs ga = a;
  ga.bounds = h.groups;
  ga.bounds8 = {};  // groups are bf16
  ga.table.indptr = h.group_indptr;
  ga.table.indices = h.group_indices;
  ga.policy.budget_pages = select::hier_groups(std::numeric_limits<int>::max(), kWarpPages,
                                               a.policy.budget_pages, h.cover);
  ga.policy.sink_pages = 0;
  ga.policy.window_tokens = 0;
  SelectWorkspace::Impl& ws = launch.workspace->impl();
  ws.hier_fused = false;
  const int gcap = std::min(max_groups, ga.policy.budget_pages);
  const std::size_t nlists = static_cast<std::size_t>(B) * h.groups.num_kv_heads;
  ws.gids.reserve(nlists * gcap, "cudaMalloc(group lists)");
  ws.gcount.reserve(nlists, "cudaMalloc(group counts)");
  ws.gmask.reserve(nlists * max_groups, "cudaMalloc(group mask)");
  ws.gids_used = nlists * gcap;
  ws.gcount_used = nlists;
  ws.glist_stride = gcap;
  ga.max_per_head = gcap;
  ga.ids = {ws.gids.data(), nlists * gcap};
  ga.count = {ws.gcount.data(), nlists};
  SelectLaunch gl = launch;
  gl.max_pages_per_seq = max_groups;
  gl.chunk_pages = 0;
  Prepared gp = prepare(ga, gl, true, KeyLevel::groups);
  gp.p.out_mask = ws.gmask.data();
  gp.block_topk = true;  // the mask comes from the block kernel
  gp.topk = block_topk_kernel();
  gp.topk_grid = dim3(1, h.groups.num_kv_heads, B);
  gp.p.key_cache = std::min((max_groups + 31) / 32 * 32, key_cache_cap());
  gp.topk_smem = sizeof(std::uint32_t) * static_cast<std::size_t>(gp.p.key_cache);
  // The page level, restricted to the chosen groups' pages (hier_list_mode): the scoring kernel
  // walks the group list (one group a warp; every other page key zeroed first), or every tile
  // of the sequence under the group mask (unchosen tiles: keys 0, nothing read).
  Prepared pp = prepare(a, launch, true);
  const bool list_mode = hier_list_mode(launch.max_pages_per_seq);
  if (list_mode) {
    const int list_chunk = pp.score_threads / 32;  // groups per CTA
    pp.p.tile_ids = ws.gids.data();
    pp.p.tile_count = ws.gcount.data();
    pp.p.tile_stride = gcap;
    pp.p.chunk_pages = list_chunk * kWarpPages;
    pp.score_grid.x = (gcap + list_chunk - 1) / list_chunk;
    set_score_kernel(pp);
  } else {
    pp.p.tile_mask = ws.gmask.data();
    pp.p.mask_stride = max_groups;
    pp.score = pp.plan.fn;  // the mask skips most of a warp's tiles: few are scored (not hot)
  }
  // Entmax-aware ranking: τ̂ per (sequence, q head) from the moment store, before any scan.
  // Top-p: the moment groups' m and v only (its normaliser).
  detail::TauParams tp{};
  const bool entmax_rank = h.moments.mean != nullptr && topp == nullptr;
  require(topp == nullptr || h.moments.mean != nullptr, invalid_argument, "moments",
          "top-p needs the pooled moment store");
  if (entmax_rank || topp != nullptr) {
    if (entmax_rank) {
      require(h.alpha == 1.5 || h.alpha == 2.0, unsupported, "alpha",
              "the GPU Gaussian-tau serves alpha 1.5 and 2 (closed forms), got ", h.alpha);
      require(std::isfinite(h.margin), invalid_argument, "margin", "must be finite");
    }
    const kv::SummariesView& ms = h.moments;
    require(ms.m2 != nullptr && ms.count != nullptr && ms.num_pages > 0 &&
                ms.num_kv_heads == h.groups.num_kv_heads && ms.head_dim == a.q.n2 &&
                reinterpret_cast<std::uintptr_t>(ms.mean) % 16 == 0 &&
                reinterpret_cast<std::uintptr_t>(ms.m2) % 16 == 0,
            invalid_argument, "moments",
            "needs mean, m2 (16-byte aligned) and count with the page store's heads and dims");
    require(h.moment_pages >= 1, invalid_argument, "moment_pages", "must be >= 1");
    require(h.moment_indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch,
            "moment_indptr", "needs batch + 1 entries");
    require((!h.adaptive && topp == nullptr) || gcap * kWarpPages <= kHierCand, unsupported,
            "budget_pages", "the adaptive and top-p rules rank at most ", kHierCand,
            " candidate pages (cover * budget)");
    // Before any launch: top-p's page kernel holds the chosen groups' pages in shared memory.
    require(topp == nullptr || top_p_smem(gcap) <= top_p_room(), unsupported, "budget_pages",
            "top-p over ", gcap, " chosen groups needs ", top_p_smem(gcap),
            " bytes of shared memory per block; this device leaves ", top_p_room(),
            " (a smaller budget or cover fits)");
    const int Hq = a.q.n1;
    tp.q = a.q.data;
    tp.q_s0 = a.q.s0;
    tp.q_s1 = a.q.s1;
    tp.batch = B;
    tp.num_q_heads = Hq;
    tp.num_kv_heads = ms.num_kv_heads;
    tp.head_dim = ms.head_dim;
    tp.mean = ms.mean;
    tp.m2 = ms.m2;
    tp.count = ms.count;
    tp.slots = ms.num_pages;
    tp.indptr = h.moment_indptr.data();
    tp.indices = h.moment_indices.data();
    tp.nnz = static_cast<int>(h.moment_indices.size());
    tp.max_groups = (launch.max_pages_per_seq + h.moment_pages - 1) / h.moment_pages;
    // select::group_tau_hat's scale: the f64 of the float scale, or 1/sqrt(d) in f64.
    tp.scale = a.scale == 0 ? 1.0 / std::sqrt(static_cast<double>(ms.head_dim)) : a.scale;
    tp.alpha = h.alpha;
    ws.mv.reserve(static_cast<std::size_t>(B) * Hq * tp.max_groups * 2, "cudaMalloc(moments)");
    ws.tau.reserve(static_cast<std::size_t>(B) * Hq, "cudaMalloc(tau)");
    ws.tau_used = static_cast<std::size_t>(B) * Hq;
    tp.mv = ws.mv.data();
    tp.tau = ws.tau.data();
    tp.err = ws.err.get();
    tp.bad_slot = kBadMomentSlot;
    tp.bad_indptr = kBadMomentIndptr;
    if (entmax_rank) {
      for (SelParams* sp : {&gp.p, &pp.p}) {
        sp->tau = ws.tau.data();
        sp->am1 = h.alpha - 1.0;
        sp->margin = h.margin;
      }
      pp.p.adaptive = h.adaptive ? 1 : 0;  // groups are never dropped (their rank bounds pages')
    }
  }
  if (B == 0) return;
  cudaStream_t stream = launch.stream;
  // Every path's first launch below is a plain one (or a memset then a plain one), so all
  // earlier writers of the page table are done before any of these kernels starts: the top-k
  // kernels read it before their programmatic-dependent-launch wait. Keep it so.
  if (topp != nullptr) {
    detail::launch_group_moments(tp, stream);
    gp.score<<<gp.score_grid, gp.score_threads, gp.smem, stream>>>(gp.p);
    check_cuda(cudaGetLastError(), "quest score kernel launch (groups)");
    launch_topk(gp, stream);
    TopPParams t{};
    t.mean = topp->pages.mean;
    t.m2 = topp->pages.m2;
    t.count = topp->pages.count;
    t.pool = topp->pages.num_pages;
    t.mv = tp.mv;
    t.mv_stride = tp.max_groups;
    t.mindptr = tp.indptr;
    t.mindices = tp.indices;
    t.mcount = tp.count;
    t.mslots = tp.slots;
    t.mnnz = tp.nnz;
    t.p = topp->p;
    t.scale = tp.scale;
    t.masses = topp->masses.data();
    // Items per (sequence, kv head): at most the kept pages (select_capacity's bound with a
    // budget of 0) and the chosen groups' pages.
    select::TopkPolicy kept_only = a.policy;
    kept_only.budget_pages = 0;
    t.items = select_capacity(launch.max_pages_per_seq, a.page_size, kept_only) + gcap * kWarpPages;
    const std::size_t lists = static_cast<std::size_t>(B) * h.groups.num_kv_heads;
    ws.lw.reserve(lists * t.items * (a.q.n1 / h.groups.num_kv_heads), "cudaMalloc(top-p weights)");
    ws.item_page.reserve(lists * t.items, "cudaMalloc(top-p items)");
    t.lw = ws.lw.data();
    t.item_page = ws.item_page.data();
    launch_hier_top_p(pp.p, t, a.q.n2, ws.gids.data(), ws.gcount.data(), gcap,
                      dim3(1, h.groups.num_kv_heads, B), stream);
    if (launch.check_errors) launch.workspace->check(stream);
    return;
  }
  if (entmax_rank) detail::launch_group_tau(tp, stream);
  const FusedPlan fused =
      launch.hier_kernel == SelectLaunch::HierKernel::fused ||
              (launch.hier_kernel == SelectLaunch::HierKernel::automatic && hier_fused_wanted())
          ? hier_fused_plan(a.q.n2, a.bounds8.min != nullptr, a.q.n1 / h.groups.num_kv_heads,
                            max_groups, gcap, B * h.groups.num_kv_heads)
          : FusedPlan{};
  ws.hier_fused = fused.fn != nullptr;
  if (fused.fn != nullptr) {
    SelParams fp = pp.p;  // the page pass walks the kernel's own group list
    fp.tile_mask = nullptr;
    fp.tile_ids = nullptr;
    fp.tile_count = nullptr;
    launch_hier_fused(fused, gp.p, fp, ws.gids.data(), ws.gcount.data(), gcap,
                      h.groups.num_kv_heads, B, stream);
    if (launch.check_errors) launch.workspace->check(stream);
    return;
  }
  if (list_mode) {
    check_cuda(cudaMemsetAsync(pp.p.keys, 0,
                               sizeof(std::uint32_t) * B * h.groups.num_kv_heads * pp.p.max_pages,
                               stream),
               "cudaMemsetAsync(page keys)");
  }
  gp.score<<<gp.score_grid, gp.score_threads, gp.smem, stream>>>(gp.p);
  check_cuda(cudaGetLastError(), "quest score kernel launch (groups)");
  launch_topk(gp, stream);
  {  // launched while the group top-k runs; its CTAs wait on the device for the group lists
    detail::PdlLaunch l(stream, pp.score_grid, dim3(pp.score_threads), pp.smem);
    check_cuda(cudaLaunchKernelEx(&l.cfg, pp.score, pp.p), "quest score kernel launch (pages)");
  }
  if (gcap * kWarpPages <= kHierCand) {
    launch_hier_page_topk(pp.p, ws.gids.data(), ws.gcount.data(), gcap,
                          dim3(1, h.groups.num_kv_heads, B), stream);
  } else {
    launch_topk(pp, stream);
  }
  if (launch.check_errors) launch.workspace->check(stream);
}

}  // namespace

void hier_select(const HierSelectArgs& h, const SelectLaunch& launch) {
  hier_launch(h, launch, nullptr);
}

void hier_top_p(const HierTopPArgs& a, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(a.p > 0 && a.p <= 1, invalid_argument, "p", "must be in (0, 1], got ", a.p);
  const kv::SummariesView& s = a.pages;
  const int d = a.hier.pages.q.n2;
  require(s.mean != nullptr && s.m2 != nullptr && s.count != nullptr && s.num_pages > 0 &&
              s.num_kv_heads == a.hier.groups.num_kv_heads && s.head_dim == d &&
              reinterpret_cast<std::uintptr_t>(s.mean) % 16 == 0 &&
              reinterpret_cast<std::uintptr_t>(s.m2) % 16 == 0,
          invalid_argument, "pages", "needs the page summaries' mean, m2 and count");
  const int B = a.hier.pages.q.n0, Hkv = s.num_kv_heads;
  require(a.masses.empty() ||
              a.masses.size() == static_cast<std::size_t>(B) * Hkv * launch.max_pages_per_seq,
          shape_mismatch, "masses", "needs batch * kv heads * max_pages_per_seq entries");
  const TopPExtra t{s, a.p, a.masses};
  hier_launch(a.hier, launch, &t);
}

void update_groups(const GroupUpdateArgs& g, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const select::BoundStoreView& s = g.pages;
  require(s.min != nullptr && s.max != nullptr && s.head_dim >= 1 && s.head_dim <= 256 &&
              s.num_kv_heads >= 1 && s.num_kv_heads <= 65535,
          invalid_argument, "pages", "null store, or head_dim outside [1, 256]");
  require(g.group_min != nullptr && g.group_max != nullptr && g.group_slots > 0, invalid_argument,
          "group_min", "null group store");
  require(g.group_pages >= 1, invalid_argument, "group_pages", "must be >= 1");
  require(!g.table.indptr.empty() && g.group_indptr.size() == g.table.indptr.size(), shape_mismatch,
          "group_indptr", "needs batch + 1 entries, as indptr");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int B = static_cast<int>(g.table.indptr.size()) - 1;
  require(B <= 65535, unsupported, "indptr", "batch must be <= 65535");
  GroupParams p{};
  p.indptr = g.table.indptr.data();
  p.indices = g.table.indices.data();
  p.gindptr = g.group_indptr.data();
  p.gindices = g.group_indices.data();
  p.mn = reinterpret_cast<const std::uint16_t*>(s.min);
  p.mx = reinterpret_cast<const std::uint16_t*>(s.max);
  p.gmn = reinterpret_cast<std::uint16_t*>(g.group_min);
  p.gmx = reinterpret_cast<std::uint16_t*>(g.group_max);
  p.pool_pages = s.num_pages;
  p.slots = g.group_slots;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.group_pages = g.group_pages;
  p.nnz = static_cast<int>(g.table.indices.size());
  p.gnnz = static_cast<int>(g.group_indices.size());
  p.last_only = g.last_only;
  p.err = launch.workspace->impl().err.get();
  if (B == 0) return;
  const int groups =
      g.last_only ? 1 : (launch.max_pages_per_seq + g.group_pages - 1) / g.group_pages;
  group_update_kernel<<<dim3(groups, s.num_kv_heads, B), s.head_dim, 0, launch.stream>>>(p);
  check_cuda(cudaGetLastError(), "group update kernel launch");
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

void extend_kept(const ExtendKeptArgs& e, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  check_policy(e.policy);
  require(e.page_size >= 1, invalid_argument, "page_size", "must be >= 1, got ", e.page_size);
  require(!e.table.indptr.empty(), shape_mismatch, "indptr", "needs batch + 1 entries");
  const int B = static_cast<int>(e.table.indptr.size()) - 1;
  require(B <= 65535, unsupported, "indptr", "batch must be <= 65535");
  require(e.table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs one entry per sequence");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  if (B == 0) return;
  require(e.max_in >= 0 && !e.count_in.empty() &&
              e.count_in.size() % static_cast<std::size_t>(B) == 0,
          shape_mismatch, "count_in", "needs [batch][kv heads] entries");
  const int Hkv = static_cast<int>(e.count_in.size() / static_cast<std::size_t>(B));
  require(Hkv <= 65535, unsupported, "count_in", "kv heads must be <= 65535");
  require(e.ids_in.size() == e.count_in.size() * static_cast<std::size_t>(e.max_in),
          shape_mismatch, "ids_in", "needs [batch][kv heads][max_in] entries");
  require(e.max_per_head >= 0 && e.count.size() == e.count_in.size(), shape_mismatch, "count",
          "needs [batch][kv heads] entries, as count_in");
  require(e.ids.size() == e.count.size() * static_cast<std::size_t>(e.max_per_head),
          shape_mismatch, "ids", "needs [batch][kv heads][max_per_head] entries");
  const auto overlaps = [](const void* a, std::size_t na, const void* b, std::size_t nb) {
    const auto* pa = static_cast<const char*>(a);
    const auto* pb = static_cast<const char*>(b);
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
  };
  const std::size_t w = sizeof(std::int32_t);
  const std::size_t ni = e.ids_in.size() * w, nc = e.count_in.size() * w;
  const std::size_t no = e.ids.size() * w, nk = e.count.size() * w;
  require(!overlaps(e.ids_in.data(), ni, e.ids.data(), no) &&
              !overlaps(e.ids_in.data(), ni, e.count.data(), nk) &&
              !overlaps(e.count_in.data(), nc, e.ids.data(), no) &&
              !overlaps(e.count_in.data(), nc, e.count.data(), nk),
          invalid_argument, "ids", "the outputs overlap the earlier selection");
  detail::ExtendParams p{};
  p.indptr = e.table.indptr.data();
  p.last_page_len = e.table.last_page_len.data();
  p.nnz = static_cast<int>(e.table.indices.size());
  p.page_size = e.page_size;
  p.max_pages = launch.max_pages_per_seq;
  p.num_kv_heads = Hkv;
  p.sink_pages = e.policy.sink_pages;
  p.window_tokens = e.policy.window_tokens;
  p.ids_in = e.ids_in.data();
  p.count_in = e.count_in.data();
  p.max_in = e.max_in;
  p.ids = e.ids.data();
  p.count = e.count.data();
  p.max_per_head = e.max_per_head;
  p.err = launch.workspace->impl().err.get();
  p.bad_indptr = kBadIndptr;
  p.bad_last_len = kBadLastLen;
  p.bad_capacity = kBadCapacity;
  p.bad_selection = kBadSelection;
  detail::launch_extend_kept(p, B, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

void update_moments(const MomentUpdateArgs& m, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const kv::SummariesView& s = m.pages;
  require(s.mean != nullptr && s.m2 != nullptr && s.count != nullptr && s.head_dim >= 1 &&
              s.head_dim <= 256 && s.num_kv_heads >= 1 && s.num_kv_heads <= 65535,
          invalid_argument, "pages", "null mean, m2 or count, or head_dim outside [1, 256]");
  require(m.mean != nullptr && m.m2 != nullptr && m.count != nullptr && m.slots > 0,
          invalid_argument, "mean", "null moment store");
  require(m.group_pages >= 1, invalid_argument, "group_pages", "must be >= 1");
  require(!m.table.indptr.empty() && m.moment_indptr.size() == m.table.indptr.size(),
          shape_mismatch, "moment_indptr", "needs batch + 1 entries, as indptr");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int B = static_cast<int>(m.table.indptr.size()) - 1;
  require(B <= 65535, unsupported, "indptr", "batch must be <= 65535");
  detail::MomentUpdateParams p{};
  p.indptr = m.table.indptr.data();
  p.indices = m.table.indices.data();
  p.mindptr = m.moment_indptr.data();
  p.mindices = m.moment_indices.data();
  p.mean = s.mean;
  p.m2 = s.m2;
  p.count = s.count;
  p.gmean = m.mean;
  p.gm2 = m.m2;
  p.gcount = m.count;
  p.pool_pages = s.num_pages;
  p.slots = m.slots;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.group_pages = m.group_pages;
  p.nnz = static_cast<int>(m.table.indices.size());
  p.mnnz = static_cast<int>(m.moment_indices.size());
  p.last_only = m.last_only;
  p.err = launch.workspace->impl().err.get();
  p.bad_page = kBadPhysical;
  p.bad_slot = kBadMomentSlot;
  p.bad_indptr = kBadMomentIndptr;
  detail::launch_moment_update(
      p, B, (launch.max_pages_per_seq + m.group_pages - 1) / m.group_pages, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

void quest_select(const QuestSelectArgs& a, const SelectLaunch& launch) {
  const Prepared pr = prepare(a, launch, true);
  if (a.q.n0 == 0) return;
  cudaStream_t stream = launch.stream;
  pr.score<<<pr.score_grid, pr.score_threads, pr.smem, stream>>>(pr.p);
  check_cuda(cudaGetLastError(), "quest score kernel launch");
  launch_topk(pr, stream);
  if (launch.check_errors) launch.workspace->check(stream);
}

}  // namespace masskv::cuda
