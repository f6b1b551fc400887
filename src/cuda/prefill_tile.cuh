// What the CUDA prefill attention kernels share (prefill.cu: the mma.sync kernel and the host
// side; prefill_wgmma.cu: the sm_90a warpgroup-MMA kernels): the launch parameters, the tile
// geometry, the tensor-core and online-softmax pieces of a 64-token query tile, the key-tile
// walk (TileList), a CTA's place in the grid (Cta), and each kernel's launch info.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "decode_common.cuh"  // cp.async helpers
#include "device.cuh"
#include "pipeline.cuh"
#include "prefill_common.cuh"

namespace masskv::cuda::prefill_impl {

constexpr int kTile = 64;  // query tokens per CTA and keys per key tile
constexpr float kLog2e = 1.4426950408889634f;

struct Params {
  SeqTables t;
  const std::uint16_t* q;
  std::int64_t q_s0, q_s1;
  const std::uint16_t* k;
  const std::uint16_t* v;
  void* out;
  int out_f32;  // 1: f32 output, 0: the input dtype
  std::int64_t o_s0, o_s1;
  float* lse;
  int num_kv_heads, num_q_heads, group, head_groups;
  float scale_log2;  // softmax scale * log2(e): base-2 logits
  // Block selection (sparse = 1).
  int sparse, q_block, k_block, sel_heads, sel_max, sel_rows;
  const std::int32_t* qb_indptr;
  const std::int32_t* sel_ids;
  const std::int32_t* sel_count;
  unsigned* err;
  // Entmax passes: z = ent_za · s (ent_za = (α-1)·scale); p = [z - τ]_+^{1/(α-1)} with
  // ent_pow_int 1 (α = 2), 2 (α = 1.5) or 0 (powf with ent_pow_exp); τ per (query, q head) in
  // tau between passes; a Newton pass sets *newton while some step was not yet negligible.
  float ent_za, ent_pow_exp;
  int ent_pow_int;
  float* tau;
  unsigned* newton;
};

// A kernel and what its launch needs (prepare() raises its shared-memory limit once).
using KernelFn = void (*)(Params);
struct KernelInfo {
  KernelFn fn;
  std::size_t smem;
  int threads;
};

// The sm_90a kernels (prefill_wgmma.cu): the wgmma kernel with `heads` (1, 2, 4) q heads per CTA,
// and the warp-specialised one (4 q heads per CTA); d = 128.
KernelInfo wgmma_kernel(bool bf16, int heads);
KernelInfo ws_kernel(bool bf16);

namespace {

using decode_impl::cp_async16;
using decode_impl::cp_async_commit;
using decode_impl::cp_async_wait;
using decode_impl::weight;
using detail::check_cuda;

// What a prefill_kernel launch computes: softmax attention, or one pass of entmax's.
enum Pass : int { kSoftmax = 0, kEntmaxMax = 1, kEntmaxNewton = 2, kEntmaxOut = 3 };

// Shared-memory rows are padded by 16 bytes: the 8 rows an ldmatrix phase reads then start
// 4 banks apart, so the 16-byte pieces of a column of 8 rows hit 32 distinct banks.
template <int kD>
constexpr int row_elems() {
  return kD + 8;
}
template <int kD, int kHeads>
constexpr std::size_t smem_bytes() {
  return sizeof(std::uint16_t) * row_elems<kD>() * (kHeads * kTile + 4 * kTile);
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(pipeline::shared_addr(p))
               : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(pipeline::shared_addr(p))
               : "memory");
}
// c += a · b, m16n8k16, A row-major (4 registers), B column-major (2), f32 accumulators.
template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  if constexpr (kBf16) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}
// 2^x on the SFU, flushing subnormal results to 0 (they weigh nothing next to the row max's 1).
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
// Two f32 as one register of the input type (low half = first), rounded to nearest.
template <bool kBf16>
__device__ __forceinline__ unsigned pack2(float lo, float hi) {
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const unsigned*>(&h);
  }
}

// Sets to -inf the scores of keys after their row's query or past the sequence (only tiles
// crossing the diagonal or the end have any).
__device__ __forceinline__ void mask_tile(float (&s)[8][4], int kpos0, int qpos0, int length,
                                          int gq, int tq) {
  if (kpos0 + kTile - 1 <= qpos0 && kpos0 + kTile <= length) return;
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int kp = kpos0 + n * 8 + 2 * tq + (c & 1);
      const int qp = qpos0 + gq + 8 * (c >> 1);
      if (kp > qp || kp >= length) s[n][c] = -INFINITY;
    }
}

// One 64-key tile of the online softmax (base 2, docs/design.md §2.6's (o, lse) state) for a warp's
// 16 rows in the m16n8 accumulator layout (s[n][c]: keys 8n + 2·tq + (c & 1), row gq + 8·(c >> 1)),
// in two steps so a kernel can put work between them:
// tile_max masks keys after a row's query or past the sequence (-inf), takes the row max over
// raw scores (scale > 0 keeps the order), folds the old max into l, and returns whether some
// row's max grew (warp-uniform), with corr, the factor o must then be scaled by (1 for a row
// whose max did not grow; softmax::Row); m_use is the max to subtract from the base-2 logits
// s·scale_log2. rescale_o applies corr.
__device__ __forceinline__ bool tile_max(float (&s)[8][4], float (&m)[2], float (&l)[2],
                                         float (&m_use)[2], float (&corr)[2], int kpos0,
                                         int qpos0, int length, int gq, int tq,
                                         float scale_log2) {
  mask_tile(s, kpos0, qpos0, length, gq, tq);
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) mx[c >> 1] = fmaxf(mx[c >> 1], s[n][c]);
  bool grew = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    softmax::Row<softmax::Base2Approx> row{m[r], l[r]};
    grew |= row.raise(fmaxf(m[r], mx[r] * scale_log2), corr[r]);
    m[r] = row.m;
    l[r] = row.l;
    m_use[r] = row.m == -INFINITY ? 0.f : row.m;  // a row with no key yet: p = 0, no NaN
  }
  // Rescaling the running output is needed only when some row's max grew (rare after the
  // first tiles of a row); the test is warp-uniform, so the caller's branch does not diverge.
  return __any_sync(0xffffffffu, grew);
}
template <int kD>
__device__ __forceinline__ void rescale_o(float (&o)[kD / 8][4], const float (&corr)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int n = 0; n < kD / 8; ++n) {
      o[n][2 * r] *= corr[r];
      o[n][2 * r + 1] *= corr[r];
    }
}
template <int kD>
__device__ __forceinline__ void softmax_tile(float (&s)[8][4], float (&o)[kD / 8][4],
                                             float (&m)[2], float (&l)[2], float (&m_use)[2],
                                             int kpos0, int qpos0, int length, int gq, int tq,
                                             float scale_log2) {
  float corr[2];
  if (tile_max(s, m, l, m_use, corr, kpos0, qpos0, length, gq, tq, scale_log2))
    rescale_o<kD>(o, corr);
}

// The P fragment of keys 16kk .. 16kk + 15 (the m16n8k16 A layout: S's n-blocks 2kk and
// 2kk + 1) from the S accumulators: p = 2^(s·scale_log2 − m_use), rounded to the input type;
// the rows' sums of p are added to l.
template <bool kBf16>
__device__ __forceinline__ void p_fragment(const float (&s)[8][4], int kk, float scale_log2,
                                           const float (&m_use)[2], float (&l)[2],
                                           unsigned (&a)[4]) {
  float e[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      e[h][c] = exp2_approx(fmaf(s[2 * kk + h][c], scale_log2, -m_use[c >> 1]));
      l[c >> 1] += e[h][c];
    }
  a[0] = pack2<kBf16>(e[0][0], e[0][1]);
  a[1] = pack2<kBf16>(e[0][2], e[0][3]);
  a[2] = pack2<kBf16>(e[1][0], e[1][1]);
  a[3] = pack2<kBf16>(e[1][2], e[1][3]);
}

// Epilogue of a warp's 16 rows (row0 .. row0 + 15 of the sequence's new tokens, q head hq):
// the quad's partial sums, o / l in the output dtype, lse = (m + log2 l) ln 2.
// kTau (entmax): m holds the rows' τ, written as is (NaN for a row without keys).
template <bool kBf16, int kD, bool kTau = false>
__device__ __forceinline__ void store_rows(const Params& p, const SeqGeo& g, int row0, int hq,
                                           int gq, int tq, const float (&o)[kD / 8][4],
                                           const float (&m)[2], float (&l)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    const int i = row0 + gq + 8 * r;
    if (i >= g.nq) continue;
    const float inv = l[r] > 0.f ? 1.f / l[r] : 0.f;
    const std::int64_t qrow = g.q_begin + i;
    const std::int64_t at = qrow * p.o_s0 + hq * p.o_s1 + 2 * tq;
    if (p.out_f32) {
      float* dst = static_cast<float*>(p.out) + at;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<float2*>(dst + n * 8) =
            make_float2(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    } else {
      std::uint16_t* dst = static_cast<std::uint16_t*>(p.out) + at;
#pragma unroll
      for (int n = 0; n < kD / 8; ++n)
        *reinterpret_cast<unsigned*>(dst + n * 8) =
            pack2<kBf16>(o[n][2 * r] * inv, o[n][2 * r + 1] * inv);
    }
    if (p.lse && tq == 0) {
      if constexpr (kTau)
        p.lse[qrow * p.num_q_heads + hq] = l[r] > 0.f ? m[r] : NAN;
      else
        p.lse[qrow * p.num_q_heads + hq] = softmax::Row<softmax::Base2Approx>::lse_of(m[r], l[r]);
    }
  }
}

// The key tiles a CTA attends, in ascending order: dense, tiles 0 .. n - 1; sparse, the
// listed blocks (k_block / 64 tiles each) minus tiles past the tile's last query or the
// sequence (skipped before any load) and bad ids (flagged when the list is validated).
struct TileList {
  const std::int32_t* ids = nullptr;  // sparse: the row's list
  int items = 0, sub_log2 = 0, num_kblocks = 0;  // k_block / 64 = 1 << sub_log2 tiles a block
  int kmax = -1;  // last key position any query of the tile may attend

  // Shifts, not divisions: the SASS of a runtime division was ~20 instructions per call, on
  // the path between a tile's barrier and its first MMA.
  __device__ int tile(int item) const {
    return ids ? (ids[item >> sub_log2] << sub_log2) + (item & ((1 << sub_log2) - 1)) : item;
  }
  __device__ bool usable(int item) const {
    if (!ids) return true;
    const int id = ids[item >> sub_log2];
    return id >= 0 && id < num_kblocks && tile(item) * kTile <= kmax;
  }
  __device__ int next(int item) const {
    while (item < items && !usable(item)) ++item;
    return item;
  }
};

// The CTA's list: checks count, ids (range, strictly ascending) and q_block_indptr, raising
// the flag once per bad entry found; a bad row attends nothing.
__device__ TileList tile_list(const Params& p, const SeqGeo& g, int b, int kvh, int qtile) {
  TileList tl;
  const int q0 = qtile * kTile;
  tl.kmax = g.first_q + min(q0 + kTile, g.nq) - 1;
  if (!p.sparse) {
    tl.items = tl.kmax / kTile + 1;
    return tl;
  }
  const bool lead = threadIdx.x == 0;
  const int row0 = p.qb_indptr[b], rows = p.qb_indptr[b + 1] - row0;
  const int row = row0 + q0 / p.q_block;
  if (rows != (g.nq + p.q_block - 1) / p.q_block || row0 < 0 || row >= p.sel_rows) {
    if (lead) atomicOr(p.err, kBadSelection);
    return tl;
  }
  const std::int64_t slot =
      static_cast<std::int64_t>(row) * p.sel_heads + (p.sel_heads == 1 ? 0 : kvh);
  const int count = p.sel_count[slot];
  if (count < 0 || count > p.sel_max) {
    if (lead) atomicOr(p.err, kBadSelection);
    return tl;
  }
  tl.ids = p.sel_ids + slot * p.sel_max;
  tl.sub_log2 = p.k_block == 2 * kTile ? 1 : 0;
  tl.num_kblocks = (g.length + p.k_block - 1) / p.k_block;
  tl.items = count << tl.sub_log2;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const int id = tl.ids[i];
    if (id < 0 || id >= tl.num_kblocks || (i > 0 && id <= tl.ids[i - 1]))
      atomicOr(p.err, kBadSelection);
  }
  return tl;
}

// What a CTA of either kernel works on: sequence blockIdx.z, kv head and its q heads from
// blockIdx.y, the query tile from blockIdx.x, heavier (later) tiles first since causal work
// grows with the tile index. live = false: nothing to do (bad tables, flagged; or no queries).
struct Cta {
  int b, kvh, q_head0, qtile;
  SeqGeo g;
  TileList tl;  // its key tiles (read and checked only when live)
  bool live;
};
__device__ __forceinline__ Cta cta_of(const Params& p, int heads) {
  Cta c;
  c.b = blockIdx.z;
  c.kvh = blockIdx.y / p.head_groups;
  c.q_head0 = c.kvh * p.group + (blockIdx.y % p.head_groups) * heads;
  c.g = seq_geo(p.t, c.b, p.err, threadIdx.x == 0);
  c.qtile = static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x);
  c.live = c.g.ok && c.qtile * kTile < c.g.nq;
  if (c.live) c.tl = tile_list(p, c.g, c.b, c.kvh, c.qtile);
  return c;
}

// The end of an entmax max or Newton pass for a warp's rows (row0 and row0 + 8, quads of 4
// threads each holding part of a row): the max pass writes τ0 = max z - 1 (NaN: no key); the
// Newton pass sums f(τ) - 1 and -f'(τ) over the quad and steps τ when f > 1 (from below the
// iterates rise to the root of the convex, decreasing f), raising *newton while a step is
// above 1e-5·max(1, |τ|) (f32 sums: finer steps are rounding).
template <int kPass>
__device__ __forceinline__ void entmax_rows_done(const Params& p, const SeqGeo& g, int row0,
                                                 int hq, int tq, float (&m)[2], float (&f)[2],
                                                 float (&df)[2], const float (&tau)[2]) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int o = 1; o <= 2; o *= 2) {
      m[r] = fmaxf(m[r], __shfl_xor_sync(0xffffffffu, m[r], o));
      f[r] += __shfl_xor_sync(0xffffffffu, f[r], o);
      df[r] += __shfl_xor_sync(0xffffffffu, df[r], o);
    }
    const int row = row0 + 8 * r;
    if (tq != 0 || row >= g.nq) continue;
    float* t = p.tau + (static_cast<std::int64_t>(g.q_begin) + row) * p.num_q_heads + hq;
    if constexpr (kPass == kEntmaxMax) {
      *t = m[r] == -INFINITY ? NAN : fmaf(m[r], p.ent_za, -1.f);
    } else if (tau[r] == tau[r] && f[r] > 1.f && df[r] > 0.f) {
      const float step = (f[r] - 1.f) / df[r];
      *t = tau[r] + step;
      if (step > 1e-5f * fmaxf(1.f, fabsf(tau[r]))) atomicOr(p.newton, 1u);
    }
  }
}

}  // namespace
}  // namespace masskv::cuda::prefill_impl
