// CUDA causal prefill attention, softmax, dense or block-sparse (issue 10; docs/design.md §3
// Selection at prefill granularity, §4). A CTA owns a 64-token query tile of one
// sequence and kHeads q heads of one kv group (4 warps per head, 16 query rows per warp), and
// walks the key tiles (64 keys) it may attend — every causal tile (dense) or the causal tiles
// of its query block's listed key blocks (sparse) — so each key tile is read once for the
// kHeads heads. Per tile: K and V land in shared memory through cp.async, double-buffered
// (the next tile is in flight while this one is computed); S = Q·Kᵀ and O += P·V run on the
// tensor cores (mma.sync m16n8k16, bf16/f16 in, f32 accumulate; ldmatrix from padded rows, no
// bank conflicts); the online softmax (base 2, docs/design.md §2.6's (o, lse) state) lives in
// registers. Only tiles crossing the diagonal or the sequence end are masked element-wise.
// Two kernels of that structure: prefill_kernel (mma.sync m16n8k16; d = 64, and d = 128 on
// request) and prefill_wgmma_kernel (sm_90a warpgroup MMA, d = 128; wgmma.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include "decode_common.cuh"  // cp.async helpers
#include "device.cuh"
#include "masskv/cuda/prefill.hpp"
#include "masskv/error.hpp"
#include "prefill_common.cuh"
#include "pipeline.cuh"
#include "wgmma.cuh"

namespace masskv::cuda {
namespace prefill_impl {
namespace {

using decode_impl::cp_async16;
using decode_impl::cp_async_commit;
using decode_impl::cp_async_wait;
using decode_impl::weight;
using detail::check_cuda;

constexpr int kTile = 64;  // query tokens per CTA and keys per key tile
constexpr float kLn2 = 0.6931471805599453f;
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
// row's max grew (warp-uniform), with corr, the factor o must then be scaled by; m_use is the
// max to subtract from the base-2 logits s·scale_log2. rescale_o applies corr.
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
    const float m_new = fmaxf(m[r], mx[r] * scale_log2);
    m_use[r] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: p = 0, no NaN
    grew |= m_new > m[r];
    corr[r] = exp2_approx(m[r] - m_use[r]);
    l[r] *= corr[r];
    m[r] = m_new;
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
        p.lse[qrow * p.num_q_heads + hq] = l[r] > 0.f ? (m[r] + log2f(l[r])) * kLn2 : -INFINITY;
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

// kPass: softmax, or one of entmax's passes (kHeads 1): the rows' max z (into p.tau, as
// τ0 = max z - 1), a Newton step on τ (p.tau updated in place), or the output.
// Register budget: 4 heads (16 warps) run one CTA per SM at 128 registers a thread; 2 heads
// (8 warps) one CTA with up to 255 (no spills; 8 warps per SM); 1 head (4 warps) two CTAs.
template <bool kBf16, int kD, int kHeads, int kPass = kSoftmax>
__global__ void __launch_bounds__(kHeads * 128, kHeads == 1 ? 2 : 1) prefill_kernel(Params p) {
  constexpr bool kReadV = kPass == kSoftmax || kPass == kEntmaxOut;
  constexpr int kThreads = kHeads * 128;
  constexpr int kRow = row_elems<kD>();
  constexpr int kPieces = kD / 8;  // 16-byte pieces per row
  constexpr int kRowsPerPass = kThreads / kPieces;
  extern __shared__ uint4 smem_raw[];
  std::uint16_t* sQ = reinterpret_cast<std::uint16_t*>(smem_raw);  // [kHeads * 64][kRow]
  std::uint16_t* sK = sQ + kHeads * kTile * kRow;                  // [2][64][kRow]
  std::uint16_t* sV = sK + 2 * kTile * kRow;                       // [2][64][kRow]

  const Cta cta = cta_of(p, kHeads);
  if (!cta.live) return;
  const SeqGeo& g = cta.g;
  const TileList& tl = cta.tl;
  const int kvh = cta.kvh, q_head0 = cta.q_head0, qtile = cta.qtile;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int piece = tid % kPieces;
  // Q tile: row hs * 64 + token, zeros past the sequence's queries.
  for (int r = tid / kPieces; r < kHeads * kTile; r += kRowsPerPass) {
    const int hs = r / kTile, i = qtile * kTile + r % kTile;
    const bool ok = i < g.nq;
    const std::uint16_t* src =
        p.q + (ok ? (g.q_begin + i) * p.q_s0 + (q_head0 + hs) * p.q_s1 + piece * 8 : 0);
    cp_async16(sQ + r * kRow + piece * 8, src, ok ? 16 : 0);
  }
  cp_async_commit();

  const auto issue = [&](int tile, int stage) {
#pragma unroll
    for (int j = 0; j < kTile / kRowsPerPass; ++j) {
      const int r = tid / kPieces + j * kRowsPerPass;
      const int pos = tile * kTile + r;
      const std::int64_t row = pos < g.length ? key_row(p.t, g, kvh, pos, p.err) : -1;
      const std::int64_t off = row < 0 ? 0 : row + piece * 8;
      const int bytes = row < 0 ? 0 : 16;
      cp_async16(sK + (stage * kTile + r) * kRow + piece * 8, p.k + off, bytes);
      if constexpr (kReadV) cp_async16(sV + (stage * kTile + r) * kRow + piece * 8, p.v + off, bytes);
    }
  };

  // The warp's 16 query rows: head slot hs, tokens t0 .. t0 + 15 of the tile.
  const int hs = warp / 4, t0 = (warp % 4) * 16;
  const int gq = lane / 4, tq = lane % 4;            // mma fragment row group and column pair
  const int qpos0 = g.first_q + qtile * kTile + t0;  // position of the warp's row 0
  const bool warp_live = qtile * kTile + t0 < g.nq;
  const std::uint16_t* qbase = sQ + (hs * kTile + t0) * kRow;

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // Entmax: the rows' τ (Newton and output passes), f(τ) and -f'(τ) (Newton).
  const int hq = q_head0 + hs;
  const auto row_of = [&](int r) { return qtile * kTile + t0 + gq + 8 * r; };
  float tau[2] = {NAN, NAN}, f[2] = {0.f, 0.f}, df[2] = {0.f, 0.f};
  if constexpr (kPass == kEntmaxNewton || kPass == kEntmaxOut) {
#pragma unroll
    for (int r = 0; r < 2; ++r)
      if (row_of(r) < g.nq)
        tau[r] = p.tau[(static_cast<std::int64_t>(g.q_begin) + row_of(r)) * p.num_q_heads + hq];
  }

  const auto compute = [&](int tile, int stage) {
    const int kpos0 = tile * kTile;
    if (!warp_live || kpos0 > qpos0 + 15) return;  // every key after every row's query
    const std::uint16_t* kb = sK + stage * kTile * kRow;
    const std::uint16_t* vb = sV + stage * kTile * kRow;
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = 0.f;
        // S = Q Kᵀ: A from the Q rows, B from K rows (key = column of S).
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      unsigned a[4];
      ldsm_x4(a, qbase + (lane % 16) * kRow + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        unsigned bk[4];
        ldsm_x4(bk, kb + (np * 16 + lane % 8 + (lane / 16) * 8) * kRow + kk * 16 +
                        ((lane / 8) % 2) * 8);
        mma16816<kBf16>(s[2 * np], a, bk[0], bk[1]);
        mma16816<kBf16>(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    if constexpr (kPass == kSoftmax) {
      float m_use[2];
      softmax_tile<kD>(s, o, m, l, m_use, kpos0, qpos0, g.length, gq, tq, p.scale_log2);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          s[n][c] = exp2_approx(fmaf(s[n][c], p.scale_log2, -m_use[c >> 1]));
          l[c >> 1] += s[n][c];
        }
    } else if constexpr (kPass == kEntmaxMax) {
      mask_tile(s, kpos0, qpos0, g.length, gq, tq);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) m[c >> 1] = fmaxf(m[c >> 1], s[n][c]);
    } else {
      mask_tile(s, kpos0, qpos0, g.length, gq, tq);
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float t = fmaf(s[n][c], p.ent_za, -tau[c >> 1]);  // -inf - τ: no weight
          if constexpr (kPass == kEntmaxNewton) {
            if (t > 0.f) {
              f[c >> 1] += weight(t, p.ent_pow_int, p.ent_pow_exp);
              df[c >> 1] += p.ent_pow_int == 1   ? 1.f
                            : p.ent_pow_int == 2 ? 2.f * t
                                                 : p.ent_pow_exp * powf(t, p.ent_pow_exp - 1.f);
            }
          } else {
            s[n][c] = weight(t, p.ent_pow_int, p.ent_pow_exp);
            l[c >> 1] += s[n][c];
          }
        }
    }
    if constexpr (kReadV) {
      // O += P V: P's accumulator layout is the A layout of the next mma (keys 16kk ..
      // 16kk+15 are S's n-tiles 2kk and 2kk+1); V rows through ldmatrix.trans.
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned a[4] = {pack2<kBf16>(s[2 * kk][0], s[2 * kk][1]),
                               pack2<kBf16>(s[2 * kk][2], s[2 * kk][3]),
                               pack2<kBf16>(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack2<kBf16>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < kD / 16; ++dp) {
          unsigned bv[4];
          ldsm_x4_trans(bv, vb + (kk * 16 + lane % 8 + ((lane / 8) % 2) * 8) * kRow + dp * 16 +
                                (lane / 16) * 8);
          mma16816<kBf16>(o[2 * dp], a, bv[0], bv[1]);
          mma16816<kBf16>(o[2 * dp + 1], a, bv[2], bv[3]);
        }
      }
    }
  };

  // Double-buffered walk: tile `cur` is computed while tile `nxt` is in flight.
  int cur = tl.next(0), stage = 0;
  if (cur < tl.items) issue(tl.tile(cur), 0);
  cp_async_commit();
  while (cur < tl.items) {
    const int nxt = tl.next(cur + 1);
    if (nxt < tl.items) issue(tl.tile(nxt), stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    compute(tl.tile(cur), stage);
    __syncthreads();
    cur = nxt;
    stage ^= 1;
  }
  cp_async_wait<0>();

  if constexpr (kPass == kSoftmax) {
    store_rows<kBf16, kD>(p, g, qtile * kTile + t0, hq, gq, tq, o, m, l);
  } else if constexpr (kPass == kEntmaxOut) {
    store_rows<kBf16, kD, true>(p, g, qtile * kTile + t0, hq, gq, tq, o, tau, l);
  } else {
    entmax_rows_done<kPass>(p, g, row_of(0), hq, tq, m, f, df, tau);
  }
}

// Copies the CTA's Q tiles (kHeads q heads from q_head0, 64 tokens each, zeros past the
// sequence's queries) into shared memory in the core-matrix layout, with cp.async (committed,
// not waited for). Piece idx of a tile: row idx % 8 + 8 (idx / 128), 16-byte piece
// (idx / 8) % 16, so the 32 lanes of a warp fill 4 whole core matrices (512 contiguous bytes:
// no bank conflict); the K/V copies use the same order.
// (Unused in an sm_80 pass, where the wgmma kernels are empty.)
[[maybe_unused]] __device__ __forceinline__ int piece_row(int idx) {
  return (idx % 8) + 8 * (idx / 128);
}
[[maybe_unused]] __device__ __forceinline__ int piece_col(int idx) { return (idx / 8) % 16; }
template <int kHeads, int kThreads>
__device__ __forceinline__ void load_q_tiles(const Params& p, const Cta& cta, std::uint16_t* sQ) {
  constexpr int kPiecesPerTile = kTile * 16;
  for (int idx = threadIdx.x; idx < kHeads * kPiecesPerTile; idx += kThreads) {
    const int hs = idx / kPiecesPerTile, r = piece_row(idx % kPiecesPerTile),
              c = piece_col(idx % kPiecesPerTile);
    const int i = cta.qtile * kTile + r;
    const bool ok = i < cta.g.nq;
    const std::uint16_t* src =
        p.q + (ok ? (cta.g.q_begin + i) * p.q_s0 + (cta.q_head0 + hs) * p.q_s1 + c * 8 : 0);
    cp_async16(sQ + hs * kTile * 128 + wgmma::tile_offset(r, c), src, ok ? 16 : 0);
  }
  cp_async_commit();
}

// Copies key tile `tile`'s K and V rows (d = 128) into the stage at element `stage0` of sK and
// sV, in the core-matrix layout, its 16-byte pieces split over kThreads threads (this one: t),
// in load_q_tiles' order. Rows past the sequence, or on a page id outside the pool (flagged),
// are zero-filled without a read. Not committed.
template <int kThreads>
__device__ __forceinline__ void copy_kv_tile(const Params& p, const SeqGeo& g, int kvh, int tile,
                                             int t, std::uint16_t* sK, std::uint16_t* sV,
                                             int stage0) {
  constexpr int kPieces = kTile * 16 / kThreads;  // pieces of K (and of V) a thread
#pragma unroll
  for (int j = 0; j < kPieces; ++j) {
    const int idx = t + j * kThreads;
    const int r = piece_row(idx), c = piece_col(idx);
    const int pos = tile * kTile + r;
    const std::int64_t row = pos < g.length ? key_row(p.t, g, kvh, pos, p.err) : -1;
    const std::int64_t off = row < 0 ? 0 : row + c * 8;
    const int bytes = row < 0 ? 0 : 16;
    const int at = stage0 + wgmma::tile_offset(r, c);
    cp_async16(sK + at, p.k + off, bytes);
    cp_async16(sV + at, p.v + off, bytes);
  }
}

// The wgmma (sm_90a) version of prefill_kernel for d = 128: a CTA owns the 64-token query
// tile and kHeads q heads of one kv group, one warpgroup (4 warps, 128 threads) per head; each
// warpgroup's S = Q·Kᵀ and O += P·V are warpgroup MMAs reading Q, K and V from shared memory in
// the core-matrix layout of wgmma.cuh (P from registers). Same tile walk, same cp.async double
// buffer, same online softmax and epilogue as prefill_kernel; a warpgroup always computes all
// 64 rows (wgmma is warpgroup-wide), masked rows simply weigh nothing.
// Registers: 4 heads (512 threads) and 2 heads (two CTAs per SM) run at 128 (16 and 32 bytes of
// spills), 1 head at 184 (two CTAs per SM by shared memory).
template <bool kBf16, int kHeads>
__global__ void __launch_bounds__(kHeads * 128, kHeads == 2 ? 2 : 1)
    prefill_wgmma_kernel(Params p) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  constexpr int kD = 128;
  constexpr int kStages = 2;  // 3 measured no faster (docs/gpu-results.md, tuning notes)
  constexpr int kThreads = kHeads * 128;
  constexpr int kTileElems = kTile * kD;
  extern __shared__ uint4 smem_raw[];
  std::uint16_t* sQ = reinterpret_cast<std::uint16_t*>(smem_raw);  // [kHeads][64 × 128]
  std::uint16_t* sK = sQ + kHeads * kTileElems;                    // [kStages][64 × 128]
  std::uint16_t* sV = sK + kStages * kTileElems;                   // [kStages][64 × 128]

  const Cta cta = cta_of(p, kHeads);
  if (!cta.live) return;
  const SeqGeo& g = cta.g;
  const TileList& tl = cta.tl;
  const int kvh = cta.kvh, q_head0 = cta.q_head0, qtile = cta.qtile;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  load_q_tiles<kHeads, kThreads>(p, cta, sQ);

  const auto issue = [&](int tile, int stage) {
    copy_kv_tile<kThreads>(p, g, kvh, tile, tid, sK, sV, stage * kTileElems);
  };

  const int hs = warp / 4, t0 = (warp % 4) * 16;
  const int gq = lane / 4, tq = lane % 4;
  const int qpos0 = g.first_q + qtile * kTile + t0;

  float o[kD / 8][4];
#pragma unroll
  for (int n = 0; n < kD / 8; ++n)
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  const std::uint64_t dq = wgmma::desc_k_major(sQ + hs * kTileElems);

  // before_s: the next tile's loads, issued just before S (ptxas gave this form fewer spills
  // than the loads written before the call; docs/gpu-results.md, tuning notes).
  const auto compute = [&](int tile, int stage, auto&& before_s) {
    const int kpos0 = tile * kTile;
    float s[8][4];
    before_s();
    wgmma::qk<kBf16>(s, dq, wgmma::desc_k_major(sK + stage * kTileElems));
    float m_use[2];
    softmax_tile<kD>(s, o, m, l, m_use, kpos0, qpos0, g.length, gq, tq, p.scale_log2);
    // P·V in two halves of 32 keys (P's registers for one half at a time: the 4-head kernel's
    // 128 registers spilled with the whole tile's P).
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      unsigned pa[2][4];
#pragma unroll
      for (int k2 = 0; k2 < 2; ++k2)
        p_fragment<kBf16>(s, 2 * half + k2, p.scale_log2, m_use, l, pa[k2]);
      const std::uint64_t dv =
          wgmma::desc_mn_major(sV + stage * kTileElems + half * 4 * wgmma::kRowGroupElems);
      // The first half's MMAs run while the second half's exps are computed.
      if (half == 0) {
        wgmma::pv<kBf16, false>(o, pa, dv);
      } else {
        wgmma::pv<kBf16, true>(o, pa, dv);
      }
    }
  };

  // kStages-deep ring: kStages - 1 tiles in flight while one is computed. The slot refilled
  // after the barrier is the one computed in the previous round (every thread is past it).
  int cur = tl.next(0), ahead = cur;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (ahead < tl.items) {
      issue(tl.tile(ahead), st);
      ahead = tl.next(ahead + 1);
    }
    cp_async_commit();
  }
  for (int stage = 0; cur < tl.items; stage = stage + 1 == kStages ? 0 : stage + 1) {
    cp_async_wait<kStages - 2>();
    wgmma::fence_proxy_async();
    __syncthreads();
    compute(tl.tile(cur), stage, [&] {
      if (ahead < tl.items) {
        issue(tl.tile(ahead), stage == 0 ? kStages - 1 : stage - 1);
        ahead = tl.next(ahead + 1);
      }
      cp_async_commit();
    });
    cur = tl.next(cur + 1);
  }
  cp_async_wait<0>();
  store_rows<kBf16, kD>(p, g, qtile * kTile + t0, q_head0 + hs, gq, tq, o, m, l);
#endif
}

// The warp-specialised wgmma kernel (d = 128, sm_90a): FlashAttention-3's structure over the
// paged cache. A CTA owns the 64-token query tile and 4 q heads of one kv group (each key tile
// read once for 4 heads: measured, 2 heads a tile made the copies the limit), with three
// warpgroups:
// - the producer (warpgroup 0, most of its registers given to the others) copies each key
//   tile's K and V rows with cp.async into a kWsStages-deep ring; it waits for its own copies
//   kWsLag tiles behind, fences them for wgmma (the async proxy) and arrives on the stage's
//   "full" mbarrier, and refills a stage once the consumers arrived on its "empty" one;
// - two consumers, 2 q heads each. A consumer's work is a chain of half-steps (tile j, head h):
//   issue S = Q_h·K_jᵀ together with the previous half-step's O += P·V, wait for both, then the
//   softmax of S (P kept in registers for the next half-step). The consumers take turns
//   issuing (two named barriers, "ping-pong"), so one's softmax runs under the other's MMAs.
// No block-wide barrier after the start: each role waits only on what it consumes.
// Ring depth and copy lag: the consumers should see a tile as soon as its copies land, with
// room to run ahead (the sweep: docs/gpu-results.md, tuning notes).
constexpr int kWsStages = 4, kWsLag = 1;
// A stage is released only after the next tile's full barrier, which the producer arrives on
// kWsLag tiles later, before it waits for that stage: a deeper lag would deadlock.
static_assert(kWsLag <= kWsStages - 2, "the copy lag must leave the producer a free stage");
constexpr int kWsThreads = 3 * 128;
constexpr std::size_t ws_smem() {
  return sizeof(std::uint16_t) * (4 + 2 * kWsStages) * kTile * 128 +
         2 * kWsStages * sizeof(std::uint64_t);
}

template <bool kBf16>
__global__ void __launch_bounds__(kWsThreads, 1) prefill_ws_kernel(Params p) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  constexpr int kD = 128;
  constexpr int kTileElems = kTile * kD;
  extern __shared__ uint4 smem_raw[];
  std::uint16_t* sQ = reinterpret_cast<std::uint16_t*>(smem_raw);  // [4][64 × 128]
  std::uint16_t* sK = sQ + 4 * kTileElems;                          // [kWsStages][64 × 128]
  std::uint16_t* sV = sK + kWsStages * kTileElems;                  // [kWsStages][64 × 128]
  std::uint64_t* full = reinterpret_cast<std::uint64_t*>(sV + kWsStages * kTileElems);
  std::uint64_t* empty = full + kWsStages;

  const Cta cta = cta_of(p, 4);
  if (!cta.live) return;
  const SeqGeo& g = cta.g;
  const TileList& tl = cta.tl;
  const int tid = threadIdx.x;
  // The warpgroup index through a shuffle: ptxas then knows it is warp-uniform, and does not
  // serialise the wgmma of a role split it would otherwise take for divergent.
  const int wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  if (tid == 0) {
    for (int st = 0; st < kWsStages; ++st) {
      pipeline::mbar_init(&full[st], 128);   // every producer thread, after its own copies
      pipeline::mbar_init(&empty[st], 256);  // every consumer thread, after the tile's P·V
    }
  }
  load_q_tiles<4, kWsThreads>(p, cta, sQ);
  cp_async_wait<0>();
  wgmma::fence_proxy_async();
  __syncthreads();

  if (wg == 0) {
    // 56 + 2 × 224 (per thread, × 128 threads) fits the 64K registers of the SM; at 40 the
    // producer's address arithmetic spilled.
    pipeline::regs_decrease<56>();
    int n = 0;
    for (int item = tl.next(0); item < tl.items; item = tl.next(item + 1), ++n) {
      const int st = n % kWsStages;
      if (n >= kWsStages) pipeline::mbar_wait(&empty[st], (n / kWsStages - 1) & 1);
      copy_kv_tile<128>(p, g, cta.kvh, tl.tile(item), tid, sK, sV, st * kTileElems);
      cp_async_commit();
      if (n >= kWsLag) {
        cp_async_wait<kWsLag>();
        wgmma::fence_proxy_async();
        pipeline::mbar_arrive(&full[(n - kWsLag) % kWsStages]);
      }
    }
    cp_async_wait<0>();
    wgmma::fence_proxy_async();
    for (int k = n > kWsLag ? n - kWsLag : 0; k < n; ++k)
      pipeline::mbar_arrive(&full[k % kWsStages]);
    return;
  }

  pipeline::regs_increase<224>();
  const int cw = wg - 1;  // consumer 0 or 1: head slots 2cw, 2cw + 1
  const int warp = (tid / 32) % 4, lane = tid % 32;
  const int t0 = warp * 16, gq = lane / 4, tq = lane % 4;
  const int qrow0 = cta.qtile * kTile + t0;  // the warp's first row among the new tokens
  const int qpos0 = g.first_q + qrow0;
  const std::uint64_t dq[2] = {wgmma::desc_k_major(sQ + (2 * cw) * kTileElems),
                               wgmma::desc_k_major(sQ + (2 * cw + 1) * kTileElems)};

  float o[2][kD / 8][4];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int n = 0; n < kD / 8; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) o[h][n][c] = 0.f;
  float m[2][2] = {{-INFINITY, -INFINITY}, {-INFINITY, -INFINITY}};
  float l[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
  unsigned pa[4][4];

  // Turns: consumer c issues after bar_sync(1 + c) and hands the turn over with
  // bar_arrive(2 - c); consumer 1 hands consumer 0 the first turn.
  constexpr int kPair = 256;
  if (cw == 1) pipeline::bar_arrive(1, kPair);
  // Half-step (tile at stage st, head kH): S of this head issued with the previous half-step's
  // P·V (head 1 - kH, V of stage pv_st) when kPv; both waited for; then the softmax into pa.
  // Template flags keep every wgmma issue and wait unconditional (ptxas serialises wgmma
  // around accumulators it cannot prove idle) and o[kH] in registers.
  const auto half = [&](int item, int st, int pv_st, auto head, auto pv_flag) {
    constexpr int kH = decltype(head)::value;
    constexpr bool kPv = decltype(pv_flag)::value;
    float s[8][4];
    pipeline::bar_sync(1 + cw, kPair);
    wgmma::qk<kBf16, false>(s, dq[kH], wgmma::desc_k_major(sK + st * kTileElems));
    if constexpr (kPv)
      wgmma::pv_issue<kBf16>(o[1 - kH], pa, wgmma::desc_mn_major(sV + pv_st * kTileElems));
    pipeline::bar_arrive(2 - cw, kPair);
    wgmma::wait_s<0>(s);
    if constexpr (kPv) wgmma::wait_o<0>(o[1 - kH]);
    // Head 0's half-step completes the previous tile's second P·V: its stage is free.
    if constexpr (kPv && kH == 0) pipeline::mbar_arrive(&empty[pv_st]);
    float m_use[2], corr[2];
    if (tile_max(s, m[kH], l[kH], m_use, corr, tl.tile(item) * kTile, qpos0, g.length, gq, tq,
                 p.scale_log2))
      rescale_o<kD>(o[kH], corr);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) p_fragment<kBf16>(s, kk, p.scale_log2, m_use, l[kH], pa[kk]);
  };
  using Zero = std::integral_constant<int, 0>;
  using One = std::integral_constant<int, 1>;
  int prev_st = 0, n = 0;
  int item = tl.next(0);
  if (item < tl.items) {
    pipeline::mbar_wait(&full[0], 0);
    half(item, 0, 0, Zero{}, std::false_type{});
    half(item, 0, 0, One{}, std::true_type{});
    for (item = tl.next(item + 1), n = 1; item < tl.items; item = tl.next(item + 1), ++n) {
      const int st = n % kWsStages;
      pipeline::mbar_wait(&full[st], (n / kWsStages) & 1);
      half(item, st, prev_st, Zero{}, std::true_type{});
      half(item, st, st, One{}, std::true_type{});
      prev_st = st;
    }
    wgmma::pv_issue<kBf16>(o[1], pa, wgmma::desc_mn_major(sV + prev_st * kTileElems));
    wgmma::wait_o<0>(o[1]);
  }
  if (cw == 0) pipeline::bar_sync(1, kPair);  // consumer 1's opening hand-over
#pragma unroll
  for (int h = 0; h < 2; ++h)
    store_rows<kBf16, kD>(p, g, qrow0, cta.q_head0 + 2 * cw + h, gq, tq, o[h], m[h], l[h]);
#endif
}

using KernelFn = void (*)(Params);
struct KernelInfo {
  KernelFn fn;
  std::size_t smem;
  int threads;
};

template <bool kBf16, int kD, int kHeads, int kPass = kSoftmax>
KernelInfo info() {
  return {prefill_kernel<kBf16, kD, kHeads, kPass>, smem_bytes<kD, kHeads>(), kHeads * 128};
}
// An entmax pass (one q head per CTA).
template <int kPass>
KernelInfo entmax_info(bool bf, int d) {
  return bf ? (d == 64 ? info<true, 64, 1, kPass>() : info<true, 128, 1, kPass>())
            : (d == 64 ? info<false, 64, 1, kPass>() : info<false, 128, 1, kPass>());
}
template <bool kBf16, int kD>
KernelInfo info_by_heads(int heads) {
  return heads == 4   ? info<kBf16, kD, 4>()
         : heads == 2 ? info<kBf16, kD, 2>()
                      : info<kBf16, kD, 1>();
}

template <bool kBf16, int kHeads>
KernelInfo wgmma_info() {
  return {prefill_wgmma_kernel<kBf16, kHeads>, sizeof(std::uint16_t) * (kHeads + 4) * kTile * 128,
          kHeads * 128};
}

// Which kernel runs a launch (see kernel_kind).
enum class Kind { mma, wgmma, ws };

// The kernel for (dtype, d, q heads per CTA, kind) or for an entmax pass (pass != kSoftmax:
// the mma.sync kernel, one head per CTA), its shared-memory limit raised once.
KernelInfo prepare(DType dtype, int d, int heads, Kind kind, int pass = kSoftmax) {
  const bool bf = dtype == DType::bf16;
  KernelInfo k;
  int key;
  if (pass != kSoftmax) {
    k = pass == kEntmaxMax      ? entmax_info<kEntmaxMax>(bf, d)
        : pass == kEntmaxNewton ? entmax_info<kEntmaxNewton>(bf, d)
                                : entmax_info<kEntmaxOut>(bf, d);
    key = 20 + (pass - 1) * 4 + (bf ? 0 : 2) + (d == 64 ? 0 : 1);
  } else if (kind == Kind::ws) {
    k = {bf ? prefill_ws_kernel<true> : prefill_ws_kernel<false>, ws_smem(), kWsThreads};
    key = 18 + (bf ? 0 : 1);
  } else if (kind == Kind::wgmma) {
    k = bf ? (heads == 4   ? wgmma_info<true, 4>()
              : heads == 2 ? wgmma_info<true, 2>()
                           : wgmma_info<true, 1>())
           : (heads == 4   ? wgmma_info<false, 4>()
              : heads == 2 ? wgmma_info<false, 2>()
                           : wgmma_info<false, 1>());
    key = 12 + (bf ? 0 : 3) + (heads == 4 ? 2 : heads == 2 ? 1 : 0);
  } else {
    k = bf ? (d == 64 ? info_by_heads<true, 64>(heads) : info_by_heads<true, 128>(heads))
           : (d == 64 ? info_by_heads<false, 64>(heads) : info_by_heads<false, 128>(heads));
    key = (bf ? 0 : 6) + (d == 64 ? 0 : 3) + (heads == 4 ? 2 : heads == 2 ? 1 : 0);
  }
  static std::mutex mu;
  static bool ready[32] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[key]) {
    detail::set_dynamic_smem(k.fn, k.smem, "the prefill kernel");
    ready[key] = true;
  }
  return k;
}

bool is_pow2(int x) { return x > 0 && (x & (x - 1)) == 0; }

// q heads per CTA of the mma.sync and wgmma kernels: 4 when the group allows (each key tile read
// once per 4 heads), else 2 or 1; at most cap (PrefillLaunch::max_heads_per_cta: 1, 2 or 4).
int heads_per_cta(int group, int cap) {
  for (int h = cap; h > 1; h /= 2)
    if (group % h == 0) return h;
  return 1;
}
// d = 128 runs the warp-specialised kernel (4 q heads per CTA) when 4 divides the group, else
// the wgmma kernel with heads_per_cta's q heads per CTA (one warpgroup each: 4 when the group
// allows, else 2 or 1); d = 64 the mma.sync kernel. PrefillLaunch::kernel may select the older
// kernels for d = 128 (wgmma or mma), for comparing them on a device. Before sm_90
// (hopper_paths): the mma.sync kernel for every d. More q heads per CTA is faster, and every
// wgmma form beats mma.sync except 1 head (docs/gpu-results.md, tuning notes).
Kind kernel_kind(int d, int group, PrefillLaunch::Kernel forced) {
  using enum PrefillLaunch::Kernel;
  if (d != 128 || forced == mma) return Kind::mma;
  require(forced != wgmma || detail::hopper_paths(), ErrorCode::unsupported, "kernel",
          "the wgmma kernels need sm_90a");
  if (!detail::hopper_paths()) return Kind::mma;
  if (forced == wgmma || group % 4 != 0) return Kind::wgmma;
  return Kind::ws;
}
bool aligned16(const void* ptr) { return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0; }

}  // namespace

SeqTables seq_tables(const kv::PagedKVView& c, std::span<const std::int32_t> q_indptr, int total_q,
                     int max_q) {
  SeqTables t{};
  t.indptr = c.table.indptr.data();
  t.indices = c.table.indices.data();
  t.last_len = c.table.last_page_len.data();
  t.q_indptr = q_indptr.data();
  t.pool_pages = c.num_pages;
  int lg = 0;
  while ((1 << lg) < c.page_size) ++lg;
  t.log2_page = lg;
  t.max_q = max_q;
  t.total_q = total_q;
  t.stride_page = c.stride_page;
  t.stride_head = c.stride_head;
  t.stride_slot = c.stride_slot;
  return t;
}

int validate_common(const View3<const std::uint16_t>& q, std::span<const std::int32_t> q_indptr,
                    const kv::PagedKVView& c, const PrefillLaunch& launch) {
  require(launch.workspace != nullptr, ErrorCode::invalid_argument, "workspace", "is required");
  require(c.dtype == DType::bf16 || c.dtype == DType::f16, ErrorCode::unsupported, "dtype",
          "the CUDA prefill reads f16 or bf16 Q, K and V");
  const int d = c.head_dim;
  require(d == 64 || d == 128, ErrorCode::unsupported, "head_dim",
          "the CUDA prefill serves head_dim 64 and 128; got ", d);
  require(c.num_kv_heads > 0, ErrorCode::invalid_argument, "num_kv_heads", "must be > 0");
  require(is_pow2(c.page_size) && c.page_size <= 256, ErrorCode::invalid_argument, "page_size",
          "must be a power of two in [1, 256]");
  require(c.num_pages > 0 && c.k && c.v && aligned16(c.k) && aligned16(c.v),
          ErrorCode::invalid_argument, "cache", "empty pool, or K/V null or not 16-byte aligned");
  require(c.stride_page % 8 == 0 && c.stride_head % 8 == 0 && c.stride_slot % 8 == 0 &&
              c.stride_slot >= d,
          ErrorCode::invalid_argument, "stride",
          "strides must be multiples of 8 elements (16-byte rows), stride_slot >= head_dim");
  const std::size_t B1 = c.table.indptr.size();
  require(B1 >= 1 && c.table.last_page_len.size() == B1 - 1, ErrorCode::shape_mismatch,
          "last_page_len", "needs batch entries (batch = indptr entries - 1)");
  require(q_indptr.size() == B1, ErrorCode::shape_mismatch, "q_indptr",
          "needs batch + 1 entries (as the cache's indptr)");
  require(q.data != nullptr && q.n2 == d && q.n0 >= 0 && q.n1 > 0 && q.n1 % c.num_kv_heads == 0,
          ErrorCode::shape_mismatch, "q",
          "must be [total_q][q heads][head_dim], q heads a multiple of the kv heads");
  require(aligned16(q.data) && q.s0 % 8 == 0 && q.s1 % 8 == 0 && q.s1 >= d,
          ErrorCode::invalid_argument, "q",
          "rows must be 16-byte aligned (strides multiples of 8 elements, s1 >= head_dim)");
  require(launch.max_q_per_seq > 0, ErrorCode::invalid_argument, "max_q_per_seq",
          "the host's bound on new tokens per sequence is required");
  require(B1 - 1 <= 65535 && q.n1 <= 65535 * 4, ErrorCode::invalid_argument, "q",
          "at most 65535 sequences");
  return static_cast<int>(B1 - 1);
}

}  // namespace prefill_impl

using namespace prefill_impl;

PrefillWorkspace::PrefillWorkspace() : impl_(std::make_unique<Impl>()) {}
PrefillWorkspace::~PrefillWorkspace() = default;

void PrefillWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "prefill step");
  if (flag == 0) return;
  if (flag & kBadPhysical)
    fail(ErrorCode::out_of_range, "indices", "a page id outside [0, num_pages) was met on the GPU");
  if (flag & kBadLastLen)
    fail(ErrorCode::out_of_range, "last_page_len", "a value outside [1, page_size] on the GPU");
  if (flag & kBadIndptr) fail(ErrorCode::out_of_range, "indptr", "decreasing (met on the GPU)");
  if (flag & kBadQIndptr)
    fail(ErrorCode::out_of_range, "q_indptr",
         "decreasing, past the queries, or a sequence with more new tokens than its length or "
         "PrefillLaunch::max_q_per_seq");
  if (flag & kBadCapacity)
    fail(ErrorCode::shape_mismatch, "max_per_row",
         "a selected list is longer than max_per_row (size it with prefill_index_capacity)");
  fail(ErrorCode::out_of_range, "block_selection",
       "a count outside [0, max_per_row], a key-block id outside the sequence or not strictly "
       "ascending, or q_block_indptr not matching the query blocks");
}

void prefill(const PrefillArgs& a, const PrefillLaunch& launch) {
  const kv::PagedKVView& c = a.cache;
  const int B = validate_common(a.q, a.q_indptr, c, launch);
  const int d = c.head_dim, Hq = a.q.n1, Hkv = c.num_kv_heads, total_q = a.q.n0;
  const PrefillOut& out = a.out;
  require(out.data != nullptr && (out.dtype == DType::f32 || out.dtype == c.dtype),
          ErrorCode::unsupported, "out", "f32 or the input dtype");
  const bool out_f32 = out.dtype == DType::f32;
  require(out.s1 >= d && out.s0 >= out.s1 * (Hq - 1) + d && out.s0 % 2 == 0 && out.s1 % 2 == 0 &&
              reinterpret_cast<std::uintptr_t>(out.data) % (out_f32 ? 8 : 4) == 0,
          ErrorCode::invalid_argument, "out",
          "[total_q][q heads][head_dim] with even strides and 2-element aligned rows");
  require(a.lse.empty() || a.lse.size() == static_cast<std::size_t>(total_q) * Hq,
          ErrorCode::shape_mismatch, "lse", "needs 0 or total_q * q heads entries");
  require(a.scale >= 0 && std::isfinite(a.scale), ErrorCode::invalid_argument, "scale",
          "must be finite and >= 0 (0: 1/sqrt(d))");
  if (a.mapping.is_entmax()) a.mapping.validate();  // throws naming "alpha"
  require(launch.max_heads_per_cta == 1 || launch.max_heads_per_cta == 2 ||
              launch.max_heads_per_cta == 4,
          ErrorCode::invalid_argument, "max_heads_per_cta", "must be 1, 2 or 4, got ",
          launch.max_heads_per_cta);

  Params p{};
  const PrefillBlockSelection* sel = a.selection;
  if (sel) {
    require(
        (sel->q_block == 64 || sel->q_block == 128) && (sel->k_block == 64 || sel->k_block == 128),
        ErrorCode::unsupported, "block_selection", "q_block and k_block must be 64 or 128");
    require(sel->num_heads == 1 || sel->num_heads == Hkv, ErrorCode::shape_mismatch,
            "block_selection", "num_heads must be 1 or the kv heads");
    require(sel->max_per_row >= 0 && sel->q_block_indptr.size() == static_cast<std::size_t>(B) + 1,
            ErrorCode::shape_mismatch, "block_selection",
            "max_per_row >= 0 and q_block_indptr of batch + 1 entries");
    const std::size_t rows = sel->count.size() / sel->num_heads;
    require(sel->count.size() % sel->num_heads == 0 &&
                sel->ids.size() == rows * sel->num_heads * sel->max_per_row && rows <= INT32_MAX,
            ErrorCode::shape_mismatch, "block_selection",
            "ids must be [rows][num_heads][max_per_row] and count [rows][num_heads]");
    p.sparse = 1;
    p.q_block = sel->q_block;
    p.k_block = sel->k_block;
    p.sel_heads = sel->num_heads;
    p.sel_max = sel->max_per_row;
    p.sel_rows = static_cast<int>(rows);
    p.qb_indptr = sel->q_block_indptr.data();
    p.sel_ids = sel->ids.data();
    p.sel_count = sel->count.data();
  }
  if (B == 0 || total_q == 0) return;

  const bool entmax = a.mapping.is_entmax();
  const int group = Hq / Hkv;
  const Kind kind = entmax ? Kind::mma : kernel_kind(d, group, launch.kernel);
  const int heads =
      entmax ? 1 : kind == Kind::ws ? 4 : heads_per_cta(group, launch.max_heads_per_cta);
  p.t = seq_tables(c, a.q_indptr, total_q, launch.max_q_per_seq);
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.k = static_cast<const std::uint16_t*>(c.k);
  p.v = static_cast<const std::uint16_t*>(c.v);
  p.out = out.data;
  p.out_f32 = out_f32 ? 1 : 0;
  p.o_s0 = out.s0;
  p.o_s1 = out.s1;
  p.lse = a.lse.empty() ? nullptr : a.lse.data();
  p.num_kv_heads = Hkv;
  p.num_q_heads = Hq;
  p.group = group;
  p.head_groups = group / heads;
  const float scale = a.scale > 0 ? a.scale : 1.0f / std::sqrt(static_cast<float>(d));
  p.scale_log2 = scale * kLog2e;
  PrefillWorkspace::Impl& ws = launch.workspace->impl();
  p.err = ws.err.get();

  const dim3 grid((launch.max_q_per_seq + kTile - 1) / kTile, Hkv * p.head_groups, B);
  require(grid.y <= 65535, ErrorCode::invalid_argument, "q", "too many q head groups");
  const auto run = [&](int pass) {
    const KernelInfo k = prepare(c.dtype, d, heads, kind, pass);
    k.fn<<<grid, k.threads, k.smem, launch.stream>>>(p);
    check_cuda(cudaGetLastError(), "prefill kernel launch");
  };
  if (entmax) {
    const double alpha = a.mapping.alpha, e = 1.0 / (alpha - 1.0);
    p.ent_za = static_cast<float>((alpha - 1.0) * scale);
    p.ent_pow_exp = static_cast<float>(e);
    p.ent_pow_int = e == 1.0 ? 1 : e == 2.0 ? 2 : 0;
    ws.tau.reserve(static_cast<std::size_t>(total_q) * Hq, "cudaMalloc(prefill tau)");
    p.tau = ws.tau.data();
    p.newton = ws.newton.get();
    run(kEntmaxMax);
    // Newton from below converges in a handful of steps (quadratically near the root); the
    // cap only guards against a flag that never clears.
    constexpr int kMaxNewton = 100;
    bool converged = false;
    for (int it = 0; it < kMaxNewton && !converged; ++it) {
      run(kEntmaxNewton);
      converged = ws.newton.take(launch.stream, "prefill entmax step") == 0;
    }
    require(converged, ErrorCode::non_finite, "q",
            "the entmax threshold did not converge in 100 Newton steps (scores out of range?)");
    run(kEntmaxOut);
  } else {
    run(kSoftmax);
  }
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

}  // namespace masskv::cuda
