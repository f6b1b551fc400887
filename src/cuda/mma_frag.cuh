// Tensor-core fragments of the decode kernels (decode_mma.cu: softmax split-K chunks;
// decode_cluster.cu: one cluster per (sequence, kv head)): mma.sync m16n8k16 with the q heads
// of a kv group in rows 0-7 of M (rows 8-15 are zero padding), 16-token K/V tiles in shared
// memory with XOR-swizzled 16-byte chunks so the ldmatrix reads are free of bank conflicts.
//
// Precision: tensor cores take 16-bit inputs. q (f32) and p (f32) are each split into a high
// and a low 16-bit part (x = hi + lo + O(2^-17 x) in bf16, finer in f16) and both parts are
// multiplied, so S and O carry f32-level error for twice the (cheap) tensor work.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "decode_common.cuh"

namespace masskv::cuda::decode_impl {

constexpr int kTileTok = 16;  // tokens per tile: one k-step of P V

// Two 16-bit values (lo half: x0) from f32, rounded to nearest even, and their residuals'
// rounding: hi + lo = x to 2^-17 relative (bf16) / 2^-22 (f16).
template <bool kBf16>
__device__ __forceinline__ void split2(float x0, float x1, std::uint32_t& hi, std::uint32_t& lo) {
  if constexpr (kBf16) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    memcpy(&hi, &h, 4);
    memcpy(&lo, &l, 4);
  } else {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    const __half2 l = __floats2half2_rn(x0 - hf.x, x1 - hf.y);
    memcpy(&hi, &h, 4);
    memcpy(&lo, &l, 4);
  }
}

// D += A B for one m16n8k16 tile; a1 and a3 (rows 8-15) are always zero here.
template <bool kBf16>
__device__ __forceinline__ void mma16816(float (&d)[4], std::uint32_t a0, std::uint32_t a2,
                                         std::uint32_t b0, std::uint32_t b1) {
  const std::uint32_t zero = 0;
  if constexpr (kBf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(zero), "r"(a2), "r"(zero), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(zero), "r"(a2), "r"(zero), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* smem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Byte offset of 16-byte chunk `ch` of row `row` in a swizzled tile.
template <int kD>
__device__ __forceinline__ int swz(int row, int ch) {
  return row * (kD * 2) + ((ch ^ (row & 7)) << 4);
}

// Bytes of one 16-token K or V tile.
template <int kD>
constexpr std::size_t tile_bytes() {
  return std::size_t{kTileTok} * kD * 2;
}

// q fragments of the CTA's heads (A operand, row g = lane / 4), times p.q_mult, split hi + lo:
// [k-step][cols 2t | 2t+8][hi, lo]. Rows past kG or heads_here are zero.
template <bool kBf16, int kD, int kG>
__device__ __forceinline__ void load_q_frags(const Params& p, const Chunk& c, int lane,
                                             std::uint32_t (&qa)[kD / 16][2][2]) {
  const int g = lane >> 2, t4 = lane & 3;
  const bool real = g < kG && g < c.heads_here;
  const float* qrow = p.q + c.b * p.q_s0 + (c.q_head0 + (real ? g : 0)) * p.q_s1;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ++ks) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int col = ks * 16 + half * 8 + 2 * t4;
      const float x0 = real ? qrow[col] * p.q_mult : 0.f;
      const float x1 = real ? qrow[col + 1] * p.q_mult : 0.f;
      split2<kBf16>(x0, x1, qa[ks][half][0], qa[ks][half][1]);
    }
  }
}

// Copies rows tok0 .. tok0+15 of the chunk (pages s_phys / valid lengths s_len of n_pages
// pages) from each base (K and/or V of the kv head) into the matching swizzled tile; rows that
// are not valid tokens, or where row_ok(t) is false, are zero-filled without a read.
// Issue-bound (the softmax decode reaches the copy engine's rate only when the per-chunk work is
// small): K and V share one address computation per 16-byte chunk (separate ones cost 1.6x on
// dense decode), and with pages of 16 tokens or more the tile lies in one page (tiles start at
// multiples of 16), so its page is looked up once instead of per chunk.
template <int kD, int kN, class RowOk>
__device__ __forceinline__ void copy_tiles(char* const (&dst)[kN],
                                           const std::uint16_t* const (&base)[kN],
                                           const Params& p, const int* s_phys,
                                           const std::uint16_t* s_len, int n_pages, int tok0,
                                           int lane, RowOk&& row_ok) {
  constexpr int kCh = kD / 8;  // 16-byte chunks per row
  // in_tile(row): a valid token; offset(row): its element offset in the pool (kv head aside).
  const auto copy = [&](auto&& in_tile, auto&& offset) {
#pragma unroll
    for (int j = lane; j < kTileTok * kCh; j += 32) {
      const int row = j / kCh, ch = j % kCh;
      const bool ok = in_tile(row) && row_ok(tok0 + row);
      const std::int64_t off = ok ? offset(row) + ch * 8 : 0;
      const int d = swz<kD>(row, ch);
#pragma unroll
      for (int i = 0; i < kN; ++i) cp_async16(dst[i] + d, base[i] + off, ok ? 16 : 0);
    }
  };
  if (p.log2_page >= 4) {
    const int mask = (1 << p.log2_page) - 1;
    const int pg = tok0 >> p.log2_page;
    const bool in = pg < n_pages;
    const int n_ok = in ? min(kTileTok, static_cast<int>(s_len[pg]) - (tok0 & mask)) : 0;
    const std::int64_t off0 = in ? static_cast<std::int64_t>(s_phys[pg]) * p.stride_page +
                                       (tok0 & mask) * p.stride_slot
                                 : 0;
    copy([&](int row) { return row < n_ok; },
         [&](int row) { return off0 + row * p.stride_slot; });
  } else {
    copy([&](int row) { return token_ok(p, s_len, n_pages, tok0 + row); },
         [&](int row) { return row_offset(p, s_phys, tok0 + row); });
  }
}

// Row predicate of copy_tiles that keeps every valid token.
struct AllRows {
  __device__ bool operator()(int) const { return true; }
};

// S = Q Kᵀ of a tile: s[nb] holds tokens nb*8 .. nb*8+7; this thread's entries are row
// g = lane / 4, tokens nb*8 + 2 (lane % 4) + {0, 1} in s[nb][0..1] (s[nb][2..3]: padding rows).
template <bool kBf16, int kD>
__device__ __forceinline__ void tile_scores(const std::uint32_t (&qa)[kD / 16][2][2],
                                            const char* sk, int lane, float (&s)[2][4]) {
#pragma unroll
  for (int nb = 0; nb < 2; ++nb)
#pragma unroll
    for (int j = 0; j < 4; ++j) s[nb][j] = 0.f;
#pragma unroll
  for (int ks = 0; ks < kD / 16; ks += 2) {
#pragma unroll
    for (int nb = 0; nb < 2; ++nb) {
      std::uint32_t b[4];  // matrix i: tokens nb*8 + (lane & 7), chunk 2 ks + i
      ldmatrix_x4(b, sk + swz<kD>(nb * 8 + (lane & 7), 2 * ks + (lane >> 3)));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mma16816<kBf16>(s[nb], qa[ks][0][h], qa[ks][1][h], b[0], b[1]);
        mma16816<kBf16>(s[nb], qa[ks + 1][0][h], qa[ks + 1][1][h], b[2], b[3]);
      }
    }
  }
}

// O += P V of a tile: pr[nb][e] is this thread's weight of row g, token nb*8 + 2 (lane % 4) + e;
// acc[nd] holds dims nd*8 + 2 (lane % 4) + {0, 1} of row g in acc[nd][0..1].
template <bool kBf16, int kD>
__device__ __forceinline__ void tile_pv(const float (&pr)[2][2], const char* sv, int lane,
                                        float (&acc)[kD / 8][4]) {
  std::uint32_t pa[2][2];  // [cols 2t | 2t+8][hi, lo]
  split2<kBf16>(pr[0][0], pr[0][1], pa[0][0], pa[0][1]);
  split2<kBf16>(pr[1][0], pr[1][1], pa[1][0], pa[1][1]);
#pragma unroll
  for (int nd = 0; nd < kD / 8; nd += 2) {
    std::uint32_t b[4];  // matrix i: tokens (i & 1) * 8 + (lane & 7), chunk nd + (i >> 1)
    const int mi = lane >> 3;
    ldmatrix_x4_trans(b, sv + swz<kD>((mi & 1) * 8 + (lane & 7), nd + (mi >> 1)));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mma16816<kBf16>(acc[nd], pa[0][h], pa[1][h], b[0], b[1]);
      mma16816<kBf16>(acc[nd + 1], pa[0][h], pa[1][h], b[2], b[3]);
    }
  }
}

}  // namespace masskv::cuda::decode_impl
