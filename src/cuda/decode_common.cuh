// What the CUDA decode kernels share (decode.cu: softmax; decode_entmax.cu: alpha-entmax): the
// launch parameters, the device error bits, the workspace, and the pieces of the chunk
// skeleton — a CTA owns one chunk of pages of one (sequence, kv head) and up to 8 q heads of
// that kv head, stages the chunk's page list in shared memory, and streams 16-byte rows with
// a per-thread cp.async ring (docs/design.md §2.6 split-K, §3 layout).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "device.cuh"
#include "masskv/cuda/decode.hpp"
#include "online_softmax.cuh"

namespace masskv::cuda::decode_impl {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxChunkPages = 1024;  // page list of one chunk lives in shared memory
constexpr int kMaxChunks = 4096;      // softmax merge weights live in shared memory
constexpr int kMaxGroup = 8;          // q heads per CTA (registers)
constexpr int kStages = 3;            // cp.async ring depth: tiles in flight per thread + 1
constexpr int kMaxNewton = 200;  // entmax tau: far above need (~log2(sqrt(n)) + 6, n equal z)

// Device error flag bits (DecodeWorkspace::check turns them into masskv::Error).
enum ErrBit : unsigned {
  kBadPhysical = 1u,   // indices[...] outside [0, num_pages)
  kBadSelection = 2u,  // selected logical page outside the sequence, or count out of range
  kBadIndptr = 4u,     // decreasing indptr, or more pages than the planned grid covers
  kBadLastLen = 8u,    // last_page_len outside [1, page_size]
};

struct Params {
  const float* q;
  std::int64_t q_s0, q_s1;
  float* out;
  std::int64_t o_s0, o_s1;
  float* lse;  // softmax: lse, entmax: tau (z units); may be null
  const std::uint16_t* k;
  const std::uint16_t* v;
  std::int64_t stride_page, stride_head, stride_slot;
  int pool_pages, num_kv_heads, num_q_heads, group, head_groups, log2_page;
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_len;
  int sparse;  // 0: dense (pages from the table), 1: pages from sel_ids
  const std::int32_t* sel_ids;
  const std::int32_t* sel_count;
  int sel_max;
  int max_pages;  // dense: bound the grid was planned for
  int chunk_pages, num_chunks;
  float q_mult;   // q is multiplied by this: softmax scale*log2(e) (base-2 logits),
                  // entmax scale*(alpha-1) (scores in z units)
  float* part_o;  // [B][Hq][num_chunks][D] (num_chunks > 1)
  float* part_w;  // [B][Hq][num_chunks]: softmax lse (natural log), entmax sum of p
  unsigned* err;
  std::uint64_t* stamps;  // DecodeLaunch::phase_stamps (profiling), usually null
  // entmax only (decode_entmax.cu)
  int pow_int;           // 1/(alpha-1) when it is 1 or 2, else 0 (general power)
  float pow_exp;         // 1/(alpha-1)
  float* cand_z;         // candidate scores [B*KH][n_cap][kG] (KH = kv heads * head groups)
  std::int32_t* cand_t;  // candidate token (in the chunk) [B*KH][n_cap]
  std::int32_t* cand_n;  // candidates per list [B*KH][num_chunks][row groups]
  float* cand_max;       // max z per list and head [B*KH][num_chunks][row groups][kG]
  std::int64_t n_cap;    // candidate slots per (sequence, kv head, head group)
  int per_list;          // candidate slots per (chunk, row group) list
  int kg;                // q heads per CTA of the kernels (the candidate stride)
  float* tau;            // [B][Hq] threshold of every q head (z units)
  unsigned* counter;     // [B*KH] chunks done in the accumulate pass (last one merges)
};

}  // namespace masskv::cuda::decode_impl

namespace masskv::cuda {

struct DecodeWorkspace::Impl {
  detail::GrowBuffer<float> part;  // o partials then lse (softmax) or sum-p (entmax) partials
  detail::GrowBuffer<float> cand_z, cand_max, tau;
  detail::GrowBuffer<std::int32_t> cand_t, cand_n;
  detail::GrowBuffer<unsigned> counter;  // zero between steps (the last CTA resets it)
  detail::ErrorFlag err;
};

}  // namespace masskv::cuda

namespace masskv::cuda::decode_impl {

// Programmatic dependent launch (device.cuh): the merge, tau and accumulate kernels may start
// while their predecessor finishes, and wait for it before reading what it produced.
using detail::allow_dependents;
using detail::PdlLaunch;
using detail::wait_for_predecessor;
using detail::stamp;

// Right after the wait, the chunk's q rows and its slice of the selection are requested into L1:
// their addresses need no load, while the chunk's own chain (sequence bounds and count, then
// the selected ids, then their physical pages, then q) is four dependent round trips; the hint
// shortens the softmax sparse step, the entmax cluster kernel gained nothing from it and has
// none (docs/gpu-results.md, tuning notes). kD: head_dim.
template <int kD>
__device__ __forceinline__ void prefetch_chunk_inputs(const Params& p) {
  constexpr int kRowLines = (kD * 4 + 127) / 128 + 1;  // lines a q row may touch (unaligned)
  constexpr int kQThreads = kMaxGroup * kRowLines;
  const int t = threadIdx.x;
  const int kvh = blockIdx.y / p.head_groups, hg = blockIdx.y % p.head_groups, b = blockIdx.z;
  const int heads = min(kMaxGroup, p.group - hg * kMaxGroup);
  const int q_head0 = kvh * p.group + hg * kMaxGroup;
  if (t < heads * kRowLines) {
    const float* row = p.q + b * p.q_s0 + (q_head0 + t / kRowLines) * p.q_s1;
    detail::prefetch_l1_lines(row, row + kD, t % kRowLines, kRowLines);
  }
  if (p.sparse && t >= kQThreads) {  // the threads after the q rows' ones
    const int unit0 = blockIdx.x * p.chunk_pages;
    const int end = min(p.sel_max, unit0 + p.chunk_pages);
    const std::int32_t* sel =
        p.sel_ids + (static_cast<std::int64_t>(b) * p.num_kv_heads + kvh) * p.sel_max;
    if (unit0 < end)
      detail::prefetch_l1_lines(sel + unit0, sel + end, t - kQThreads, kThreads - kQThreads);
  }
}

// Pages and units (pages to attend) of (b, kv head), with the ids checked. Returns the number
// of units; 0 when the sequence's table entry is bad (flagged).
__device__ __forceinline__ int seq_units(const Params& p, int b, int kvh, int& num_pages,
                                         int& last_len) {
  // All four loads first (their addresses are valid whatever the values): one round trip to
  // memory instead of three dependent ones before a chunk can fetch its first page.
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int len_b = p.last_len[b];
  const int count = p.sparse ? p.sel_count[b * p.num_kv_heads + kvh] : 0;
  num_pages = end - begin;
  last_len = 0;
  if (num_pages < 0) {
    atomicOr(p.err, kBadIndptr);
    num_pages = 0;
    return 0;
  }
  if (num_pages > 0) {
    last_len = len_b;
    if (last_len < 1 || last_len > (1 << p.log2_page)) {
      atomicOr(p.err, kBadLastLen);
      num_pages = 0;
      return 0;
    }
  }
  if (!p.sparse) {
    if (num_pages > p.max_pages) {
      atomicOr(p.err, kBadIndptr);
      num_pages = 0;
      return 0;
    }
    return num_pages;
  }
  if (count < 0 || count > p.sel_max) {
    atomicOr(p.err, kBadSelection);
    return 0;
  }
  return count;
}

// The CTA's place in the grid: chunk blockIdx.x of (sequence blockIdx.z, kv head
// blockIdx.y / head_groups), q heads of head group blockIdx.y % head_groups.
struct Chunk {
  int chunk, b, kvh, hg, heads_here, q_head0;
  int num_pages, last_len, units, unit0, n_pages;
  int bkh;  // (b * kv heads + kvh) * head groups + hg
};

__device__ __forceinline__ Chunk chunk_of(const Params& p) {
  Chunk c;
  c.chunk = blockIdx.x;
  c.kvh = blockIdx.y / p.head_groups;
  c.hg = blockIdx.y % p.head_groups;
  c.b = blockIdx.z;
  c.heads_here = min(kMaxGroup, p.group - c.hg * kMaxGroup);
  c.q_head0 = c.kvh * p.group + c.hg * kMaxGroup;
  c.units = seq_units(p, c.b, c.kvh, c.num_pages, c.last_len);
  c.unit0 = c.chunk * p.chunk_pages;
  c.n_pages = max(0, min(p.chunk_pages, c.units - c.unit0));
  c.bkh = (c.b * p.num_kv_heads + c.kvh) * p.head_groups + c.hg;
  return c;
}

// Chunks that run for a (sequence, kv head): those holding units, and chunk 0 always (it
// writes the empty result of a head without units).
__device__ __forceinline__ int live_chunks(const Params& p, int units) {
  return max(1, min(p.num_chunks, (units + p.chunk_pages - 1) / p.chunk_pages));
}

// Page list of the chunk into shared memory, every id checked here, so the token loops never
// see a bad id: s_phys = physical page (0 for a bad one), s_len = valid tokens (0 if bad).
__device__ __forceinline__ void stage_page_list(const Params& p, const Chunk& c, int* s_phys,
                                                std::uint16_t* s_len) {
  const int page_size = 1 << p.log2_page;
  const std::int32_t* sel =
      p.sparse ? p.sel_ids + (static_cast<std::int64_t>(c.b) * p.num_kv_heads + c.kvh) * p.sel_max
               : nullptr;
  const int seq_begin = c.num_pages > 0 ? p.indptr[c.b] : 0;
  for (int i = threadIdx.x; i < c.n_pages; i += blockDim.x) {
    int logical = c.unit0 + i, len = 0, phys_ok = 0;
    if (p.sparse) {
      logical = sel[c.unit0 + i];
      if (logical < 0 || logical >= c.num_pages) {
        atomicOr(p.err, kBadSelection);
        logical = -1;
      }
    }
    if (logical >= 0) {
      const int phys = p.indices[seq_begin + logical];
      if (phys < 0 || phys >= p.pool_pages) {
        atomicOr(p.err, kBadPhysical);
      } else {
        len = logical == c.num_pages - 1 ? c.last_len : page_size;
        phys_ok = phys;
      }
    }
    s_phys[i] = phys_ok;
    s_len[i] = static_cast<std::uint16_t>(len);
  }
}

// Whether token t of a chunk of n_pages pages (rows = n_pages << log2_page) is a valid one.
__device__ __forceinline__ bool token_ok(const Params& p, const std::uint16_t* s_len, int n_pages,
                                         int t) {
  const int rows = n_pages << p.log2_page;
  return t < rows && (t & ((1 << p.log2_page) - 1)) < s_len[min(t >> p.log2_page, n_pages - 1)];
}

// Element offset of token t's row of the chunk in the pool (add the kv head's offset).
__device__ __forceinline__ std::int64_t row_offset(const Params& p, const int* s_phys, int t) {
  return static_cast<std::int64_t>(s_phys[t >> p.log2_page]) * p.stride_page +
         (t & ((1 << p.log2_page) - 1)) * p.stride_slot;
}

// q of the CTA's heads times p.q_mult, the lane's 8 dims; heads past heads_here are zero.
template <int kG>
__device__ __forceinline__ void load_q(const Params& p, const Chunk& c, int lane_dim,
                                       float (&qf)[kG][8]) {
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    const float* qrow = p.q + c.b * p.q_s0 + (c.q_head0 + g) * p.q_s1 + lane_dim;
#pragma unroll
    for (int j = 0; j < 8; ++j) qf[g][j] = g < c.heads_here ? qrow[j] * p.q_mult : 0.f;
  }
}

// α-entmax weight p = [t]_+^{1/(α-1)} (§2.1) in f32, with the exact powers for α = 2 and 1.5
// (pow_int 1 or 2; 0: powf with pow_exp). Shared by the entmax decode and prefill kernels.
__device__ __forceinline__ float weight(float t, int pow_int, float pow_exp) {
  if (!(t > 0.f)) return 0.f;
  return pow_int == 1 ? t : pow_int == 2 ? t * t : powf(t, pow_exp);
}

// The threshold equation f(tau) = sum_j [z_j - tau]_+^{1/(alpha-1)} = 1 (§2.1), in f64: adds
// z's terms of f(tau) and of -f'(tau). kPow = 1/(alpha-1) when it is 1 or 2 (exact, branch
// free), 0 for a general power pe. A compile-time power matters: with the power chosen at run
// time inside the loop the compiler kept the pow() path in every term, ~1 µs per Newton step.
template <int kPow>
__device__ __forceinline__ void newton_terms(float zf, double tau, double pe, double& f,
                                             double& df) {
  const double t = static_cast<double>(zf) - tau;
  if constexpr (kPow == 1) {
    f += fmax(t, 0.0);
    df += t > 0 ? 1.0 : 0.0;
  } else if constexpr (kPow == 2) {
    const double u = fmax(t, 0.0);
    f += u * u;
    df += 2.0 * u;
  } else {
    if (!(t > 0)) return;
    const double tp = pow(t, pe - 1.0);
    f += tp * t;
    df += pe * tp;
  }
}

// Calls fn(std::integral_constant<int, kPow>) for the power pow_int (1, 2, or 0: general).
template <class Fn>
__device__ __forceinline__ void with_pow(int pow_int, Fn&& fn) {
  if (pow_int == 1)
    fn(std::integral_constant<int, 1>{});
  else if (pow_int == 2)
    fn(std::integral_constant<int, 2>{});
  else
    fn(std::integral_constant<int, 0>{});
}

// One Newton step on f(tau) = 1 from below (f convex and decreasing: the iterates rise
// monotonically to the root). Returns true when tau has converged (then tau is not moved
// when f is already at or past 1: rounding may land a hair past the root).
__device__ __forceinline__ bool newton_step(double f, double df, double& tau) {
  if (!(f > 1.0)) return true;
  const double step = (f - 1.0) / df;
  tau += step;
  return step <= 1e-12 * fmax(1.0, fabs(tau));
}

// Sums of a and b over the warp, lane 0's in every lane: decisions taken on them (break,
// step) are then the same in all lanes, whatever order the butterfly added in.
template <class T>
__device__ __forceinline__ void warp_sum2(T& a, T& b) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  a = __shfl_sync(0xffffffffu, a, 0);
  b = __shfl_sync(0xffffffffu, b, 0);
}

template <bool kBf16>
__device__ __forceinline__ void to_float8(const uint4& r, float (&f)[8]) {
  const unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBf16) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    } else {
      __half2 h;
      memcpy(&h, &w[i], 4);
      const float2 x = __half22float2(h);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
}

// Scores of kU staged K rows (16 bytes per lane, row groups of kLanesPerRow lanes) against the
// kG q heads: every lane of a row group ends with the full dot products s[u][g].
template <bool kBf16, int kG, int kU, int kLanesPerRow>
__device__ __forceinline__ void score_rows(const uint4* k_rows, int row_stride,
                                           const float (&qf)[kG][8], float (&s)[kU][kG]) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    float kf[8];
    to_float8<kBf16>(k_rows[u * row_stride], kf);
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float d = 0.f;
#pragma unroll
      for (int j = 0; j < 8; ++j) d = fmaf(qf[g][j], kf[j], d);
      s[u][g] = d;
    }
  }
#pragma unroll
  for (int off = kLanesPerRow / 2; off > 0; off /= 2) {
#pragma unroll
    for (int u = 0; u < kU; ++u)
#pragma unroll
      for (int g = 0; g < kG; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);
  }
}

// A row group's running softmax state for its kG q heads (base 2: the scores are base-2
// logits): max m, sum l, and the unnormalised output over the lane's 8 dims. The gather decode
// (decode_tokens.cu) and the page decode (decode.cu) share it, and write_chunk_softmax merges
// what store() leaves in shared memory.
template <int kG>
struct SoftmaxState {
  softmax::Row<softmax::Base2> row[kG];
  float acc[kG][8];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      row[g] = {};
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;
    }
  }

  // Folds in kU staged rows: their scores s (score_rows), the staged ring slot `rows` (16 bytes
  // per lane: row u's K at rows[2u * row_stride], its V at rows[(2u + 1) * row_stride]), ok[u]
  // false for a masked row (no weight; its staged V is zeros). The running output is rescaled
  // only when a head's max grows (rare after the first tiles).
  template <bool kBf16, int kU>
  __device__ __forceinline__ void update(const uint4* rows, int row_stride, const bool (&ok)[kU],
                                         const float (&s)[kU][kG]) {
    float pw[kU][kG];
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mt = row[g].m;
#pragma unroll
      for (int u = 0; u < kU; ++u) mt = ok[u] ? fmaxf(mt, s[u][g]) : mt;
      float corr;
      if (row[g].raise(mt, corr)) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] *= corr;
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        pw[u][g] = ok[u] ? row[g].weight(s[u][g]) : 0.f;
        row[g].l += pw[u][g];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      float vf[8];
      to_float8<kBf16>(rows[(2 * u + 1) * row_stride], vf);
#pragma unroll
      for (int g = 0; g < kG; ++g)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(pw[u][g], vf[j], acc[g][j]);
    }
  }

  // Row group rg's state into the merge area ([n_groups][kG][kD] outputs, [n_groups][kG] m and
  // l) that write_chunk_softmax reads; the caller syncs the CTA before and after.
  template <int kD>
  __device__ __forceinline__ void store(int rg, int lane_dim, float* s_acc, float* s_m,
                                        float* s_l) const {
#pragma unroll
    for (int g = 0; g < kG; ++g) {
#pragma unroll
      for (int j = 0; j < 8; ++j) s_acc[(rg * kG + g) * kD + lane_dim + j] = acc[g][j];
      if (lane_dim == 0) {
        s_m[rg * kG + g] = row[g].m;
        s_l[rg * kG + g] = row[g].l;
      }
    }
  }
};

// 16-byte asynchronous copy global -> shared (L2 only, no L1 allocation: each KV byte is used
// once); src_bytes 0 writes zeros (masked tokens) without reading.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

// The ring: issue(tile) copies a tile's rows into ring slot tile % kRing, compute(tile) uses
// them; kRing - 1 tiles are in flight while one is computed. kWarpShared = false: a thread
// reads only what it copied, no barrier. kWarpShared = true: the lanes of a warp read each
// other's copies (tensor-core fragments), so a __syncwarp follows the wait (visibility) and
// the compute (the slot is refilled next).
template <int kRing = kStages, bool kWarpShared = false, class Issue, class Compute>
__device__ __forceinline__ void stream_tiles(int n_tiles, Issue&& issue, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < kRing - 1; ++s) {
    if (s < n_tiles) issue(s);
    cp_async_commit();
  }
  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + kRing - 1 < n_tiles) issue(tile + kRing - 1);
    cp_async_commit();
    cp_async_wait<kRing - 1>();
    if constexpr (kWarpShared) __syncwarp();
    compute(tile);
    if constexpr (kWarpShared) __syncwarp();
  }
  cp_async_wait<0>();
}

// The end of a softmax chunk: n_groups partial states (running max m in base 2, sum l, and
// unnormalised output acc, [n_groups][kG][kD] in shared memory) merged in a fixed order
// (deterministic), then the chunk's (o, lse) written to the output (one chunk) or to the
// split-K partials. Called by every thread of the CTA after a __syncthreads.
template <int kG, int kD>
__device__ __forceinline__ void write_chunk_softmax(const Params& p, const Chunk& c, int n_groups,
                                                    const float* s_acc, const float* s_m,
                                                    const float* s_l) {
  using Row = softmax::Row<softmax::Base2>;
  for (int idx = threadIdx.x; idx < kG * kD; idx += blockDim.x) {
    const int g = idx / kD, dim = idx % kD;
    if (g >= c.heads_here) continue;
    float mx = -INFINITY;
    for (int r = 0; r < n_groups; ++r) mx = fmaxf(mx, s_m[r * kG + g]);
    float o = 0.f, lse = -INFINITY;
    if (mx != -INFINITY) {
      float lsum = 0.f, osum = 0.f;
      for (int r = 0; r < n_groups; ++r) {
        const float w = Row::merge_weight(s_m[r * kG + g], mx);
        lsum += s_l[r * kG + g] * w;
        osum += s_acc[(r * kG + g) * kD + dim] * w;
      }
      o = osum / lsum;
      // lsum >= 1 here (the max's own weight): unchecked, so a NaN sum stays NaN, as before.
      lse = softmax::Base2::to_natural(mx + softmax::Base2::log(lsum));
    }
    const int hq = c.q_head0 + g;
    if (p.num_chunks == 1) {
      p.out[c.b * p.o_s0 + hq * p.o_s1 + dim] = o;
      if (p.lse && dim == 0) p.lse[c.b * p.num_q_heads + hq] = lse;
    } else {
      const std::int64_t slot =
          (static_cast<std::int64_t>(c.b) * p.num_q_heads + hq) * p.num_chunks + c.chunk;
      p.part_o[slot * kD + dim] = o;
      if (dim == 0) p.part_w[slot] = lse;
    }
  }
}

// The merge of one (sequence b, q head hq)'s n_chunks split-K partials (§2.6), after the chunk
// kernel's grid: lse = logsumexp_c lse_c, o = sum_c e^{lse_c - lse} o_c / sum_c e^{lse_c - lse},
// in chunk order (a max tree over the CTA, then a serial weight sum: the same bits on every
// run). Empty chunks (lse -inf) weigh 0; all empty gives o = 0, lse = -inf. The merge kernels
// of the page decode and the gather decode (decode.cu, decode_tokens.cu); every thread of the
// CTA (kThreads) calls it.
__device__ __forceinline__ void merge_chunks(const Params& p, int d, int b, int hq, int n_chunks,
                                             std::int64_t slot0) {
  __shared__ float s_w[kMaxChunks];
  __shared__ float s_red[kThreads];
  float mx = -INFINITY;
  for (int c = threadIdx.x; c < n_chunks; c += kThreads) mx = fmaxf(mx, p.part_w[slot0 + c]);
  s_red[threadIdx.x] = mx;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) s_red[threadIdx.x] = fmaxf(s_red[threadIdx.x], s_red[threadIdx.x + w]);
    __syncthreads();
  }
  mx = s_red[0];
  for (int c = threadIdx.x; c < n_chunks; c += kThreads)
    s_w[c] = softmax::Row<softmax::BaseE>::merge_weight(p.part_w[slot0 + c], mx);
  __syncthreads();
  float wsum = 0.f;
  for (int c = 0; c < n_chunks; ++c) wsum += s_w[c];
  for (int dim = threadIdx.x; dim < d; dim += kThreads) {
    float o = 0.f;
    if (wsum > 0.f) {
      // The partial is loaded whatever its weight and dropped by a select, not a branch: the
      // loads of an unrolled group are then independent and in flight together (a branch
      // around each load serialised them, ~0.4 µs of latency per chunk). Same FMAs, same
      // order, same bits as skipping zero-weight chunks.
      const float* po = p.part_o + slot0 * d + dim;
#pragma unroll 8
      for (int c = 0; c < n_chunks; ++c) {
        const float x = po[static_cast<std::int64_t>(c) * d];
        o = s_w[c] != 0.f ? fmaf(s_w[c], x, o) : o;
      }
      o /= wsum;
    }
    p.out[b * p.o_s0 + hq * p.o_s1 + dim] = o;
  }
  if (threadIdx.x == 0 && p.lse) {
    p.lse[b * p.num_q_heads + hq] = softmax::Row<softmax::BaseE>::lse_of(mx, wsum);
  }
}

// Host: q heads per CTA for a GQA group (1, 2, 4 or 8; larger groups run in head groups of 8).
inline int kernel_group(int group) {
  const int g = group < kMaxGroup ? group : kMaxGroup;
  return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8;
}

// Host: the compiled kernel variants. make.template operator()<kBf16, kD, kG, kU>() for the
// variant serving (dtype, head_dim d, kernel group g = kernel_group(...)); kU, tokens per row
// group per tile, is chosen here for every decode kernel (fewer for 8 heads: registers).
template <bool kBf16, int kD, class Make>
auto by_group(int g, Make& make) {
  switch (g) {
    case 1:
      return make.template operator()<kBf16, kD, 1, 4>();
    case 2:
      return make.template operator()<kBf16, kD, 2, 4>();
    case 4:
      return make.template operator()<kBf16, kD, 4, 4>();
    default:
      return make.template operator()<kBf16, kD, 8, 2>();
  }
}
template <bool kBf16, class Make>
auto by_dim(int d, int g, Make& make) {
  return d == 64    ? by_group<kBf16, 64>(g, make)
         : d == 128 ? by_group<kBf16, 128>(g, make)
                    : by_group<kBf16, 256>(g, make);
}
template <class Make>
auto by_variant(DType dtype, int d, int g, Make make) {
  return dtype == DType::bf16 ? by_dim<true>(d, g, make) : by_dim<false>(d, g, make);
}
// A dense index in [0, 24) of the variant, for per-variant caches.
inline int variant_key(DType dtype, int d, int g) {
  return (dtype == DType::bf16 ? 0 : 12) +
         (d == 64    ? 0
          : d == 128 ? 4
                     : 8) +
         (g == 1   ? 0
          : g == 2 ? 1
          : g == 4 ? 2
                   : 3);
}

// Host: the split-K chunk (pages) for `units` pages per (sequence, kv head, head group) when
// `base_ctas` such triples run with `ctas_per_sm` resident CTAs per SM.
int plan_chunk_pages(int base_ctas, int units, int ctas_per_sm);

// Host: a chunk kernel and its dynamic shared memory.
using KernelFn = void (*)(Params);
struct KernelInfo {
  KernelFn fn;
  std::size_t smem;
};
// Host: the tensor-core softmax chunk kernel (decode_mma.cu) for (dtype, head_dim d, kernel
// group g = kernel_group(...)); fn is null where it has no variant (head_dim 256).
KernelInfo tensor_softmax_kernel(DType dtype, int d, int g);

struct EntmaxShape {
  DType dtype;
  int head_dim, batch, units_max;
  double alpha;
  float scale;
};
// Host: the entmax decode (decode_entmax.cu), launched by cuda::decode once the arguments are
// checked and `p` holds what both mappings share.
void launch_entmax(Params p, const EntmaxShape& shape, const DecodeLaunch& launch,
                   DecodeWorkspace::Impl& ws);
// Host: the entmax mapping's launch parameters (both entmax paths): q pre-multiplied by
// scale·(alpha-1) so dot products are z; the weight's power 1/(alpha-1), exact when 1 or 2.
inline void set_entmax_mapping(Params& p, const EntmaxShape& s) {
  p.q_mult = static_cast<float>(s.scale * (s.alpha - 1.0));
  const double e = 1.0 / (s.alpha - 1.0);
  p.pow_exp = static_cast<float>(e);
  p.pow_int = e == 1.0 ? 1 : e == 2.0 ? 2 : 0;
}

// Host: the one-kernel cluster path of sparse entmax (decode_cluster.cu). Returns false when
// launch.entmax_kernel is automatic and the call is not one it serves (the caller runs the
// split path); throws when it is forced and cannot serve.
bool launch_entmax_cluster(Params p, const EntmaxShape& shape, const DecodeLaunch& launch);

}  // namespace masskv::cuda::decode_impl
