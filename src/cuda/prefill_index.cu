// The mean-pooled block indexer for sparse prefill (docs/design.md §4: the indexer scores query
// blocks × key blocks, then the block selection keeps sinks and the diagonal). Three kernels:
//  1. block_mean_kernel<keys>: the mean of each key block's k rows per kv head (f32);
//  2. block_mean_kernel<queries>: the mean of each query block's q rows over its tokens and the
//     group's q heads — by linearity, mean_h(q̄_h)·k̄ is the mean over the group of the
//     per-head pooled scores, so one vector per (query block, kv head) ranks for the group;
//  3. block_topk_kernel: a CTA owns up to 4 consecutive query blocks of one (sequence, kv head);
//     a thread per candidate key block computes its scores against them (one read of the key
//     means per 4 rows), then per row the kept blocks (sinks, diagonal) get the top key and a
//     radix selection over (key, ~id) picks the best others (ties to the lower id); the chosen ids
//     are written ascending by an ordered compaction (block_select.cuh), -1 padded, with the
//     count.
// Deterministic: fixed summation orders, no atomics but the error flag.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "decode_common.cuh"  // to_float8
#include "device.cuh"
#include "masskv/cuda/prefill.hpp"
#include "masskv/error.hpp"
#include "block_select.cuh"
#include "prefill_common.cuh"

namespace masskv::cuda {
namespace prefill_impl {
namespace {

using decode_impl::to_float8;
using detail::check_cuda;

constexpr int kMeanThreads = 128;
constexpr int kTopkThreads = 256;
constexpr int kTopkWarps = kTopkThreads / 32;
constexpr int kMaxRows = 4;           // query blocks per top-k CTA
constexpr int kMaxKeyBlocks = 16384;  // candidates a top-k CTA ranks in shared memory

struct IndexParams {
  SeqTables t;
  const std::uint16_t* q;
  std::int64_t q_s0, q_s1;
  const std::uint16_t* k;
  int num_kv_heads, group, q_block, k_block, budget, sinks, max_len;
  int nkb_max, nqb_max;  // key / query blocks per sequence the means are sized for
  float* kmean;          // [B][Hkv][nkb_max][d]
  float* qmean;          // [B][Hkv][nqb_max][d]
  const std::int32_t* qb_indptr;
  int sel_rows, max_per_row;
  std::int32_t* ids;
  std::int32_t* count;
  int rows_per_cta, key_stride;  // key_stride: nkb_max rounded up to even
  unsigned* err;
};

__device__ __forceinline__ SeqGeo index_geo(const IndexParams& p, int b) {
  SeqGeo g = seq_geo(p.t, b, p.err, threadIdx.x == 0);
  if (g.ok && g.length > p.max_len) {
    if (threadIdx.x == 0) atomicOr(p.err, kBadIndptr);
    g.ok = false;
  }
  return g;
}

// Mean of a key block (kKeys) or of a query block over its tokens and the group's heads.
// 16-byte pieces: kD/8 lanes per row, 128/(kD/8) rows at a time, summed in a fixed order.
template <bool kBf16, int kD, bool kKeys>
__global__ void __launch_bounds__(kMeanThreads) block_mean_kernel(IndexParams p) {
  constexpr int kPieces = kD / 8, kGroups = kMeanThreads / kPieces;
  __shared__ float s_sum[kGroups][kD];
  const int j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, piece = tid % kPieces, rg = tid / kPieces;
  const SeqGeo g = index_geo(p, b);
  float acc[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  int rows = 0;
  const auto add = [&](const std::uint16_t* src) {
    float f[8];
    to_float8<kBf16>(*reinterpret_cast<const uint4*>(src), f);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] += f[e];
  };
  if (g.ok) {
    if constexpr (kKeys) {
      const int begin = j * p.k_block, end = min(g.length, begin + p.k_block);
      rows = max(0, end - begin);
      for (int pos = begin + rg; pos < end; pos += kGroups) {
        const std::int64_t row = key_row(p.t, g, kvh, pos, p.err);
        if (row >= 0) add(p.k + row + piece * 8);
      }
    } else {
      const int i0 = j * p.q_block, tokens = max(0, min(g.nq - i0, p.q_block));
      rows = tokens * p.group;
      for (int r = rg; r < rows; r += kGroups) {
        const int tok = r / p.group, h = kvh * p.group + r % p.group;
        add(p.q + (g.q_begin + i0 + tok) * p.q_s0 + h * p.q_s1 + piece * 8);
      }
    }
  }
#pragma unroll
  for (int e = 0; e < 8; ++e) s_sum[rg][piece * 8 + e] = acc[e];
  __syncthreads();
  const int n_max = kKeys ? p.nkb_max : p.nqb_max;
  float* out = (kKeys ? p.kmean : p.qmean) +
               ((static_cast<std::int64_t>(b) * p.num_kv_heads + kvh) * n_max + j) * kD;
  for (int c = tid; c < kD; c += kMeanThreads) {
    float sum = 0.f;
    for (int r = 0; r < kGroups; ++r) sum += s_sum[r][c];
    out[c] = rows > 0 ? sum / rows : 0.f;
  }
}

// Sort key of a candidate: kept blocks above every score, then the score's order-preserving
// bits (NaN lowest), then ~id so that equal scores rank the lower id first.
__device__ __forceinline__ unsigned long long cand_key(bool kept, float score, int id) {
  unsigned hi = 0xffffffffu;
  if (!kept) {
    const unsigned u = __float_as_uint(score + 0.0f);
    hi = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    hi = isnan(score) ? 1u : min(max(hi, 1u), 0xfffffffeu);
  }
  return (static_cast<unsigned long long>(hi) << 32) | static_cast<unsigned>(~id);
}

template <int kD>
__global__ void __launch_bounds__(kTopkThreads) block_topk_kernel(IndexParams p) {
  extern __shared__ __align__(16) unsigned long long s_keys[];  // [rows_per_cta][key_stride]
  float* s_q = reinterpret_cast<float*>(s_keys + p.rows_per_cta * p.key_stride);  // [kMaxRows][kD]
  __shared__ int s_warp[kTopkWarps];
  __shared__ int s_hist[256], s_pick[3];
  const int kvh = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const SeqGeo g = index_geo(p, b);
  if (!g.ok) return;
  const int nqb = (g.nq + p.q_block - 1) / p.q_block;
  const int qb0 = blockIdx.x * p.rows_per_cta;
  if (qb0 >= nqb) return;
  const int rows_here = min(p.rows_per_cta, nqb - qb0);
  const int row0 = p.qb_indptr[b];
  if (p.qb_indptr[b + 1] - row0 != nqb || row0 < 0 || row0 + nqb > p.sel_rows) {
    if (tid == 0) atomicOr(p.err, kBadSelection);
    return;
  }
  // Row r's causal candidates [0, n) and first diagonal block (the query block's positions).
  const auto cands = [&](int r) {
    return (g.first_q + min((qb0 + r + 1) * p.q_block, g.nq) - 1) / p.k_block + 1;
  };
  const auto diag0 = [&](int r) { return (g.first_q + (qb0 + r) * p.q_block) / p.k_block; };

  const float* qm =
      p.qmean + ((static_cast<std::int64_t>(b) * p.num_kv_heads + kvh) * p.nqb_max + qb0) * kD;
  for (int i = tid; i < kMaxRows * kD; i += kTopkThreads)
    s_q[i] = i < rows_here * kD ? qm[i] : 0.f;
  __syncthreads();

  // Scores: a thread per candidate key block, all rows at once: its mean read as float4 (many
  // loads in flight per thread), the rows' query means broadcast from shared memory, channels
  // summed in order. A warp per candidate waited for one load round trip per candidate and made
  // this kernel most of the indexer's time (docs/gpu-results.md, tuning notes).
  const float* km =
      p.kmean + (static_cast<std::int64_t>(b) * p.num_kv_heads + kvh) * p.nkb_max * kD;
  const int n_last = cands(rows_here - 1);
  for (int j = tid; j < n_last; j += kTopkThreads) {
    const float4* kr = reinterpret_cast<const float4*>(km + static_cast<std::int64_t>(j) * kD);
    float dot[kMaxRows] = {};
#pragma unroll 8
    for (int e = 0; e < kD / 4; ++e) {
      const float4 k4 = kr[e];
#pragma unroll
      for (int r = 0; r < kMaxRows; ++r) {
        const float4 q4 = reinterpret_cast<const float4*>(s_q + r * kD)[e];
        dot[r] = fmaf(q4.x, k4.x, dot[r]);
        dot[r] = fmaf(q4.y, k4.y, dot[r]);
        dot[r] = fmaf(q4.z, k4.z, dot[r]);
        dot[r] = fmaf(q4.w, k4.w, dot[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kMaxRows; ++r) {
      if (r < rows_here && j < cands(r)) {
        const bool kept = j < p.sinks || j >= diag0(r);
        s_keys[r * p.key_stride + j] = cand_key(kept, dot[r], j);
      }
    }
  }
  __syncthreads();

  for (int r = 0; r < rows_here; ++r) {
    const int n = cands(r), d0 = diag0(r);
    const int sinks = min(p.sinks, n);
    const int kept = sinks + (n - d0) - max(0, sinks - d0);
    const int total = min(n, max(p.budget, kept));
    const std::int64_t slot = static_cast<std::int64_t>(row0 + qb0 + r) * p.num_kv_heads + kvh;
    std::int32_t* out = p.ids + slot * p.max_per_row;
    if (total > p.max_per_row) {  // uniform over the CTA
      if (tid == 0) {
        atomicOr(p.err, kBadCapacity);
        p.count[slot] = 0;
      }
      for (int i = tid; i < p.max_per_row; i += kTopkThreads) out[i] = -1;
      continue;
    }
    if (total == n) {
      for (int i = tid; i < p.max_per_row; i += kTopkThreads) out[i] = i < n ? i : -1;
    } else {
      const unsigned long long* keys = s_keys + r * p.key_stride;
      // Radix selection over (key, ~id) (it replaced a bitonic sort of every candidate).
      const unsigned long long thr =
          block_select::radix_threshold<kTopkThreads>(keys, n, total, s_hist, s_pick);
      // Ascending ids: the selected ones written in id order.
      block_select::ordered_compact<kTopkThreads>(
          n, s_warp, [&](int i) { return keys[i] >= thr; }, [&](int i, int r) { out[r] = i; });
      for (int i = total + tid; i < p.max_per_row; i += kTopkThreads) out[i] = -1;
    }
    if (tid == 0) p.count[slot] = total;
    __syncthreads();
  }
}

template <bool kBf16, int kD>
void launch_means(const IndexParams& p, int B, cudaStream_t st) {
  const dim3 kgrid(p.nkb_max, p.num_kv_heads, B), qgrid(p.nqb_max, p.num_kv_heads, B);
  block_mean_kernel<kBf16, kD, true><<<kgrid, kMeanThreads, 0, st>>>(p);
  check_cuda(cudaGetLastError(), "key block mean launch");
  block_mean_kernel<kBf16, kD, false><<<qgrid, kMeanThreads, 0, st>>>(p);
  check_cuda(cudaGetLastError(), "query block mean launch");
}

}  // namespace
}  // namespace prefill_impl

using namespace prefill_impl;

int prefill_index_capacity(std::int64_t max_len, int q_block, int k_block, int budget_blocks,
                           int sink_blocks) {
  require(max_len >= 0 && q_block > 0 && k_block > 0 && budget_blocks >= 0 && sink_blocks >= 0,
          ErrorCode::invalid_argument, "max_len", "negative or zero sizes");
  const std::int64_t blocks = (max_len + k_block - 1) / k_block;
  const std::int64_t kept = std::int64_t{sink_blocks} + (q_block + k_block - 1) / k_block + 1;
  return static_cast<int>(std::min(blocks, std::max<std::int64_t>(budget_blocks, kept)));
}

void prefill_index(const PrefillIndexArgs& a, const PrefillLaunch& launch) {
  const kv::PagedKVView& c = a.cache;
  const int B = validate_common(a.q, a.q_indptr, c, launch);
  const int d = c.head_dim, Hkv = c.num_kv_heads;
  require(a.q_block >= 1, ErrorCode::invalid_argument, "q_block", "must be >= 1");
  require(a.k_block >= 1, ErrorCode::invalid_argument, "k_block", "must be >= 1");
  require(a.budget_blocks >= 1, ErrorCode::invalid_argument, "budget_blocks", "must be >= 1");
  require(a.sink_blocks >= 0, ErrorCode::invalid_argument, "sink_blocks", "must be >= 0");
  require(
      a.max_kv_len >= 1 && a.max_kv_len >= launch.max_q_per_seq &&
          (static_cast<std::int64_t>(a.max_kv_len) + a.k_block - 1) / a.k_block <= kMaxKeyBlocks,
      ErrorCode::invalid_argument, "max_kv_len", "must be >= max_q_per_seq and at most ",
      kMaxKeyBlocks, " key blocks");
  require(a.q_block_indptr.size() == static_cast<std::size_t>(B) + 1, ErrorCode::shape_mismatch,
          "q_block_indptr", "needs batch + 1 entries");
  require(a.max_per_row >= 1, ErrorCode::invalid_argument, "max_per_row", "must be >= 1");
  const std::size_t rows = a.count.size() / Hkv;
  require(a.count.size() % Hkv == 0 && rows <= INT32_MAX, ErrorCode::shape_mismatch, "count",
          "must be [rows][kv heads]");
  require(a.ids.size() == rows * Hkv * a.max_per_row, ErrorCode::shape_mismatch, "ids",
          "must be [rows][kv heads][max_per_row]");
  if (B == 0 || a.q.n0 == 0) return;

  IndexParams p{};
  p.t = seq_tables(c, a.q_indptr, a.q.n0, launch.max_q_per_seq);
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.k = static_cast<const std::uint16_t*>(c.k);
  p.num_kv_heads = Hkv;
  p.group = a.q.n1 / Hkv;
  p.q_block = a.q_block;
  p.k_block = a.k_block;
  p.budget = a.budget_blocks;
  p.sinks = a.sink_blocks;
  p.max_len = a.max_kv_len;
  p.nkb_max =
      static_cast<int>((static_cast<std::int64_t>(a.max_kv_len) + a.k_block - 1) / a.k_block);
  p.nqb_max = (launch.max_q_per_seq + a.q_block - 1) / a.q_block;
  p.qb_indptr = a.q_block_indptr.data();
  p.sel_rows = static_cast<int>(rows);
  p.max_per_row = a.max_per_row;
  p.ids = a.ids.data();
  p.count = a.count.data();
  // Even, so the query means after the keys start 16-byte aligned (float4 reads).
  p.key_stride = (p.nkb_max + 1) & ~1;
  p.rows_per_cta = p.key_stride <= 2048 ? kMaxRows : 1;  // 4 rows: up to 64 KiB of keys
  PrefillWorkspace::Impl& ws = launch.workspace->impl();
  ws.kmean.reserve(static_cast<std::size_t>(B) * Hkv * p.nkb_max * d, "cudaMalloc(key means)");
  ws.qmean.reserve(static_cast<std::size_t>(B) * Hkv * p.nqb_max * d, "cudaMalloc(query means)");
  p.kmean = ws.kmean.data();
  p.qmean = ws.qmean.data();
  p.err = ws.err.get();

  cudaStream_t st = launch.stream;
  const bool bf = c.dtype == DType::bf16;
  if (d == 64) {
    bf ? launch_means<true, 64>(p, B, st) : launch_means<false, 64>(p, B, st);
  } else {
    bf ? launch_means<true, 128>(p, B, st) : launch_means<false, 128>(p, B, st);
  }
  const std::size_t smem = sizeof(unsigned long long) * p.rows_per_cta * p.key_stride +
                           sizeof(float) * kMaxRows * d;
  const auto fn = d == 64 ? block_topk_kernel<64> : block_topk_kernel<128>;
  detail::set_dynamic_smem(fn, smem, "the prefill indexer's top-k");
  const dim3 grid((p.nqb_max + p.rows_per_cta - 1) / p.rows_per_cta, Hkv, B);
  fn<<<grid, kTopkThreads, smem, st>>>(p);
  check_cuda(cudaGetLastError(), "block top-k launch");
  if (launch.check_errors) launch.workspace->check(st);
}

}  // namespace masskv::cuda
