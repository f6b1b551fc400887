// Softmax decode on the tensor cores (issue 7): the chunk skeleton of decode_common.cuh (a CTA
// owns one chunk of pages of one (sequence, kv head) and up to 8 q heads of it), with
// S = Q Kᵀ and O += P V as mma.sync m16n8k16 (bf16 or f16 inputs, f32 accumulation), the q
// heads of the group in the M dimension (rows 8-15 are zero padding).
//
// Why: the SIMT kernel (decode.cu) spends ~600 instructions per 4 KB of KV per warp (per-lane
// dot products, a 16-lane shuffle reduction per token and head, conversions), which caps it
// near 60% of the H200's bandwidth; here a warp spends ~200 per 8 KB, so the copy engine
// rather than the issue rate bounds the step.
//
// Precision: tensor cores take 16-bit inputs. q (f32) and p (f32) are each split into a high
// and a low 16-bit part (x = hi + lo + O(2^-17 x) in bf16, finer in f16) and both parts are
// multiplied, so S and O carry f32-level error (the reference check's 1e-3 tolerance holds
// with three orders of margin) for twice the (cheap) tensor work.
//
// Data movement: each warp streams its own 16-token tiles (tiles w, w + 4, ... of the chunk)
// through a private 3-slot cp.async ring; rows are stored with the 16-byte chunks XOR-swizzled
// by (row & 7) so the ldmatrix reads (K as is, V transposed) are free of bank conflicts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_common.cuh"

namespace masskv::cuda::decode_impl {
namespace {

constexpr int kTileTok = 16;  // tokens per warp tile: one k-step of P V
constexpr int kRingT = 3;     // slots per warp ring

template <int kD>
struct MmaSmem {
  static constexpr int kRowBytes = kD * 2;
  static constexpr std::size_t kTileBytes = std::size_t{kTileTok} * kRowBytes;  // K or V
  static constexpr std::size_t kList = kMaxChunkPages * (sizeof(int) + sizeof(std::uint16_t));
  static constexpr std::size_t kRing = std::size_t{kWarps} * kRingT * 2 * kTileBytes;
  static constexpr std::size_t kMerge = sizeof(float) * kWarps * kMaxGroup * (kD + 2);
  static constexpr std::size_t kBytes = kList + (kRing > kMerge ? kRing : kMerge);
};

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

template <bool kBf16, int kD, int kG>
__global__ void __launch_bounds__(kThreads, 2) decode_mma_kernel(Params p) {
  using Smem = MmaSmem<kD>;
  constexpr int kCh = kD / 8;   // 16-byte chunks per row
  constexpr int kKs = kD / 16;  // k-steps of Q Kᵀ
  constexpr int kNd = kD / 8;   // n-blocks of P V
  extern __shared__ uint4 smem_raw[];
  int* s_phys = reinterpret_cast<int*>(smem_raw);
  std::uint16_t* s_len = reinterpret_cast<std::uint16_t*>(s_phys + kMaxChunkPages);
  char* s_ring = reinterpret_cast<char*>(smem_raw) + Smem::kList;
  allow_dependents();  // the merge may be scheduled now: it waits for this grid to finish

  const Chunk c = chunk_of(p);
  if (c.unit0 >= c.units && !(c.chunk == 0 && p.num_chunks == 1)) return;  // merge: empties
  const int n_pages = c.n_pages;
  stage_page_list(p, c, s_phys, s_len);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;  // fragment row (q head) and column pair

  // Q fragments (A operand, row g), times q_mult (base-2 logits), split hi + lo.
  std::uint32_t qa[kKs][2][2];  // [k-step][cols 2t | 2t+8][hi, lo]
  {
    const bool real = g < kG && g < c.heads_here;
    const float* qrow = p.q + c.b * p.q_s0 + (c.q_head0 + (real ? g : 0)) * p.q_s1;
#pragma unroll
    for (int ks = 0; ks < kKs; ++ks) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int col = ks * 16 + half * 8 + 2 * t4;
        const float x0 = real ? qrow[col] * p.q_mult : 0.f;
        const float x1 = real ? qrow[col + 1] * p.q_mult : 0.f;
        split2<kBf16>(x0, x1, qa[ks][half][0], qa[ks][half][1]);
      }
    }
  }
  float m = -INFINITY, l = 0.f;  // row g's running max (base 2) and this thread's partial sum
  float acc[kNd][4];
#pragma unroll
  for (int nd = 0; nd < kNd; ++nd)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nd][j] = 0.f;
  __syncthreads();  // the page list

  const std::uint16_t* kb = p.k + c.kvh * p.stride_head;
  const std::uint16_t* vb = p.v + c.kvh * p.stride_head;
  const int rows = n_pages << p.log2_page;
  const int tiles_all = (rows + kTileTok - 1) / kTileTok;
  const int my_tiles = warp < tiles_all ? (tiles_all - warp + kWarps - 1) / kWarps : 0;
  char* ring = s_ring + static_cast<std::size_t>(warp) * kRingT * 2 * Smem::kTileBytes;

  const auto issue = [&](int i) {
    char* sk = ring + (i % kRingT) * 2 * Smem::kTileBytes;
    char* sv = sk + Smem::kTileBytes;
    const int tok0 = (warp + i * kWarps) * kTileTok;
#pragma unroll
    for (int j = lane; j < kTileTok * kCh; j += 32) {
      const int row = j / kCh, ch = j % kCh;
      const int t = tok0 + row;
      const bool ok = token_ok(p, s_len, n_pages, t);
      const std::int64_t off = ok ? row_offset(p, s_phys, t) + ch * 8 : 0;
      const int dst = swz<kD>(row, ch);
      cp_async16(sk + dst, kb + off, ok ? 16 : 0);
      cp_async16(sv + dst, vb + off, ok ? 16 : 0);
    }
  };

  const auto compute = [&](int i) {
    const char* sk = ring + (i % kRingT) * 2 * Smem::kTileBytes;
    const char* sv = sk + Smem::kTileBytes;
    const int tok0 = (warp + i * kWarps) * kTileTok;
    // S = Q Kᵀ for tokens 0-7 (nb 0) and 8-15 (nb 1) of the tile.
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int ks = 0; ks < kKs; ks += 2) {
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
    // Online softmax on row g (base 2); this thread holds tokens nb*8 + 2 t4 + e.
    float v[2][2];
    float mt = m;
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const bool ok = token_ok(p, s_len, n_pages, tok0 + nb * 8 + 2 * t4 + e);
        v[nb][e] = ok ? s[nb][e] : -INFINITY;
        mt = fmaxf(mt, v[nb][e]);
      }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    if (mt > m) {                        // same decision on the 4 threads of the row
      const float corr = exp2f(m - mt);  // m = -inf: 0, nothing accumulated yet
      l *= corr;
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) {
        acc[nd][0] *= corr;
        acc[nd][1] *= corr;
      }
      m = mt;
    }
    float pr[2][2];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        pr[nb][e] = v[nb][e] == -INFINITY ? 0.f : exp2f(v[nb][e] - m);
        l += pr[nb][e];
      }
    // P as the A operand of one k-step (its columns are this tile's 16 tokens).
    std::uint32_t pa[2][2];  // [cols 2t | 2t+8][hi, lo]
    split2<kBf16>(pr[0][0], pr[0][1], pa[0][0], pa[0][1]);
    split2<kBf16>(pr[1][0], pr[1][1], pa[1][0], pa[1][1]);
#pragma unroll
    for (int nd = 0; nd < kNd; nd += 2) {
      std::uint32_t b[4];  // matrix i: tokens (i & 1) * 8 + (lane & 7), chunk nd + (i >> 1)
      const int mi = lane >> 3;
      ldmatrix_x4_trans(b, sv + swz<kD>((mi & 1) * 8 + (lane & 7), nd + (mi >> 1)));
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mma16816<kBf16>(acc[nd], pa[0][h], pa[1][h], b[0], b[1]);
        mma16816<kBf16>(acc[nd + 1], pa[0][h], pa[1][h], b[2], b[3]);
      }
    }
  };
  stream_tiles<kRingT, true>(my_tiles, issue, compute);

  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  // Merge the warps (the merge area reuses the rings).
  __syncthreads();
  float* s_acc = reinterpret_cast<float*>(s_ring);  // [kWarps][kG][kD]
  float* s_m = s_acc + kWarps * kG * kD;            // [kWarps][kG]
  float* s_l = s_m + kWarps * kG;
  if (g < kG) {
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd) {
      s_acc[(warp * kG + g) * kD + nd * 8 + 2 * t4] = acc[nd][0];
      s_acc[(warp * kG + g) * kD + nd * 8 + 2 * t4 + 1] = acc[nd][1];
    }
    if (t4 == 0) {
      s_m[warp * kG + g] = m;
      s_l[warp * kG + g] = l;
    }
  }
  __syncthreads();
  write_chunk_softmax<kG, kD>(p, c, kWarps, s_acc, s_m, s_l);
}

template <bool kBf16, int kD>
KernelInfo by_group_mma(int g) {
  const std::size_t smem = MmaSmem<kD>::kBytes;
  switch (g) {
    case 1:
      return {decode_mma_kernel<kBf16, kD, 1>, smem};
    case 2:
      return {decode_mma_kernel<kBf16, kD, 2>, smem};
    case 4:
      return {decode_mma_kernel<kBf16, kD, 4>, smem};
    default:
      return {decode_mma_kernel<kBf16, kD, 8>, smem};
  }
}

}  // namespace

KernelInfo tensor_softmax_kernel(DType dtype, int d, int g) {
  const bool bf16 = dtype == DType::bf16;
  if (d == 64) return bf16 ? by_group_mma<true, 64>(g) : by_group_mma<false, 64>(g);
  if (d == 128) return bf16 ? by_group_mma<true, 128>(g) : by_group_mma<false, 128>(g);
  return {nullptr, 0};
}

}  // namespace masskv::cuda::decode_impl
