// The library's device scorer (select_score.cuh's contract): the §2.3 page bound of
// docs/design.md, a page's key its bound max over the group's q heads of
// scale * (q+·M + q-·m + f·||q||_1·W + FLT_MIN), the CPU selector's bounds_bf16 formula
// (page_bound.cpp), evaluated in the same order as its AVX2 kernel (8 lanes of FMA chains over
// c = l, l+8, ..., the same horizontal sum), so on an AVX2 host the bounds have the same bits.
// It also reads the 8-bit store (select::BoundStore8: codes dequantised as fma(code, step, lo),
// then the same chains; quest_select8's bits). With moments (Gaussian-τ, group_tau.cu) the keys
// are entmax-aware ranks max_h float((α−1)·U_h − τ̂_h).
//
// Layout. The query is staged split into q+ = max(q, 0) and q- = min(q, 0). A tile is 16 pages'
// bf16 (or 8-bit) min and max rows, copied with 16-byte cp.async (coalesced: 16 lanes per
// 256-byte row at d = 128); lane L scores row L: page L / 2, its min row (L even: the q-
// chains) or its max row (L odd: the q+ chains); the two lanes of a page then add their chains
// (shuffle) and both finish the bound. Pipeline stages per warp: 2 (one tile in flight while
// one is scored); 3 at d = 64, where a tile is half as many bytes. kU8: the 8-bit store (one
// byte per channel, a tile half the bytes). kHot: a warp scores many tiles (the row loop fully
// unrolled).
#pragma once

#include <cuda_runtime.h>

#include <cfloat>
#include <cstddef>
#include <cstdint>

#include "select_score.cuh"

namespace masskv::cuda::select_impl {

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

template <int kD, bool kU8>
constexpr int kRowData = kU8 ? kD : 2 * kD;  // bytes of one staged min or max row
template <int kD, bool kU8>
constexpr int kScoreStages = kRowData<kD, kU8> <= 128 ? 3 : 2;
constexpr int kHeadBatch = 4;  // q heads per pass over a row (8 accumulators each)

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

template <int kD, bool kU8, bool kHot = false>
struct PageBound {
  static constexpr int kRowBytes = kRowData<kD, kU8> + 16;  // 16 bytes of padding: lane L reads row L
  // 8-bit: the tile's (lo, step) per page after its rows.
  static constexpr int kGridOffset = 2 * kWarpPages * kRowBytes;
  static constexpr int kStageBytes = kGridOffset + (kU8 ? kWarpPages * 8 : 0);
  static constexpr int kStages = kScoreStages<kD, kU8>;
  static constexpr int kWarpBytes = kStages * kStageBytes;
  static constexpr int kElem = kU8 ? 1 : 2;               // bytes per channel
  static constexpr int kPieces = kRowData<kD, kU8> / 16;  // 16-byte pieces per row
  static constexpr int kRowsPerCopy = 32 / kPieces;       // rows one warp-wide copy covers
  static constexpr int kCopies = 2 * kWarpPages / kRowsPerCopy;
  static constexpr unsigned kAll = 0xffffffffu;

  // q+ [group][kD], 4 floats of padding (q- in other banks than q+), q- [group][kD], f||q||_1.
  static std::size_t query_bytes(int group) {
    return sizeof(float) * (2 * static_cast<std::size_t>(group) * kD + 4 + group);
  }
  __device__ __forceinline__ static float* qpos(unsigned char* qs) { return reinterpret_cast<float*>(qs); }
  __device__ __forceinline__ static const float* qpos(const unsigned char* qs) {
    return reinterpret_cast<const float*>(qs);
  }

  // q copied as is into q+ (split in split_query).
  __device__ __forceinline__ static void begin_query(const SelParams& p, unsigned char* qs, int b, int h) {
    float* s_qpos = qpos(qs);
    const int g = p.group, q_head0 = h * g;
    for (int idx = threadIdx.x; idx < g * kD; idx += blockDim.x) {
      const int i = idx / kD, c = idx % kD;
      cp_async4(s_qpos + idx, p.q + b * p.q_s0 + (q_head0 + i) * p.q_s1 + c);
    }
  }

  __device__ __forceinline__ static void split_query(const SelParams& p, unsigned char* qs) {
    const int g = p.group;
    float* s_qpos = qpos(qs);
    float* s_qneg = s_qpos + g * kD + 4;
    for (int idx = threadIdx.x; idx < g * kD; idx += blockDim.x) {  // this thread's copies
      const float x = s_qpos[idx];
      s_qpos[idx] = x > 0.f ? x : 0.f;
      // A NaN channel: q+ 0, q- NaN (so its ||q||_1 below is NaN, as the sum of |q| would be).
      s_qneg[idx] = x < 0.f ? x : x > 0.f ? 0.f : (x == x ? 0.f : x);
    }
    __syncthreads();
  }

  __device__ __forceinline__ static void finish_query(const SelParams& p, unsigned char* qs) {
    const int g = p.group;
    const float* s_qneg = qpos(qs) + g * kD + 4;
    float* s_fq = qpos(qs) + 2 * g * kD + 4;
    const float* s_qpos = qpos(qs);
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
    __syncthreads();
  }

  // Copy `it` moves rows [it * kRowsPerCopy, +kRowsPerCopy) of the stage (row r = 2 * page +
  // (0: min, 1: max)), kPieces consecutive lanes per row.
  __device__ __forceinline__ static void issue_tile(const SelParams& p, unsigned char* stage,
                                                    int h, int lane, int phys) {
    const std::int64_t page_stride = static_cast<std::int64_t>(p.num_kv_heads) * kD * kElem;
    const unsigned char* mn =
        reinterpret_cast<const unsigned char*>(p.mn) + static_cast<std::int64_t>(h) * kD * kElem;
    const unsigned char* mx =
        reinterpret_cast<const unsigned char*>(p.mx) + static_cast<std::int64_t>(h) * kD * kElem;
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
        cp_async8(stage + kGridOffset + lane * 8, src, phys >= 0 ? 8 : 0);
      }
    }
  }

  __device__ __forceinline__ static float page_rank(const SelParams& p, const unsigned char* stage,
                                    const unsigned char* qs, int lane, int, int b, int h,
                                    bool ok) {
    const int g = p.group;
    const float* s_qpos = qpos(qs);
    const float* s_qneg = s_qpos + g * kD + 4;
    const float* s_fq = s_qneg + g * kD;
    const float* qa = (lane & 1) ? s_qpos : s_qneg;
    const int q_head0 = h * g;
    const double* tau_row =
        p.tau != nullptr ? p.tau + static_cast<std::int64_t>(b) * p.num_kv_heads * g + q_head0
                         : nullptr;
    const uint4* row = reinterpret_cast<const uint4*>(stage + lane * kRowBytes);
    float glo = 0.f, gstep = 0.f;  // the 8-bit grid of this lane's page
    if constexpr (kU8) {
      const float2 gs = *reinterpret_cast<const float2*>(stage + kGridOffset + (lane / 2) * 8);
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
    return best;
  }
};

// The page bound's scans for head_dim d and the store (u8: 8-bit pages), groups bf16
// (select_score.cu instantiates them).
ScanKernels page_bound_scan(int d, bool u8);

}  // namespace masskv::cuda::select_impl
