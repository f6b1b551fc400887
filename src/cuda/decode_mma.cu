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
// Precision and fragments: mma_frag.cuh (q and p split into hi + lo 16-bit parts).
//
// Data movement: each warp streams its own 16-token tiles (tiles w, w + 4, ... of the chunk)
// through a private 3-slot cp.async ring; rows are stored with the 16-byte chunks XOR-swizzled
// by (row & 7) so the ldmatrix reads (K as is, V transposed) are free of bank conflicts.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "decode_common.cuh"
#include "mma_frag.cuh"

namespace masskv::cuda::decode_impl {
namespace {

constexpr int kRingT = 3;  // slots per warp ring

template <int kD>
struct MmaSmem {
  static constexpr std::size_t kTileBytes = tile_bytes<kD>();  // K or V
  static constexpr std::size_t kList = kMaxChunkPages * (sizeof(int) + sizeof(std::uint16_t));
  static constexpr std::size_t kRing = std::size_t{kWarps} * kRingT * 2 * kTileBytes;
  static constexpr std::size_t kMerge = sizeof(float) * kWarps * kMaxGroup * (kD + 2);
  static constexpr std::size_t kBytes = kList + (kRing > kMerge ? kRing : kMerge);
};

template <bool kBf16, int kD, int kG>
__global__ void __launch_bounds__(kThreads, 2) decode_mma_kernel(Params p) {
  using Smem = MmaSmem<kD>;
  constexpr int kKs = kD / 16;  // k-steps of Q Kᵀ
  constexpr int kNd = kD / 8;   // n-blocks of P V
  extern __shared__ uint4 smem_raw[];
  int* s_phys = reinterpret_cast<int*>(smem_raw);
  std::uint16_t* s_len = reinterpret_cast<std::uint16_t*>(s_phys + kMaxChunkPages);
  char* s_ring = reinterpret_cast<char*>(smem_raw) + Smem::kList;
  stamp(p.stamps, stamps::decode_chunks, 0);
  wait_for_predecessor();  // launched early after a selection (PdlLaunch): nothing read before
  // The merge may be scheduled now (it waits for this grid before reading partials): after the
  // wait, so the merge's early reads of the selection counts find the selection done.
  allow_dependents();
  prefetch_chunk_inputs<kD>(p);
  stamp(p.stamps, stamps::decode_chunks, 1);

  const Chunk c = chunk_of(p);
  if (c.unit0 >= c.units && !(c.chunk == 0 && p.num_chunks == 1)) return;  // merge: empties
  const int n_pages = c.n_pages;
  stage_page_list(p, c, s_phys, s_len);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;  // fragment row (q head) and column pair

  // Q fragments (A operand, row g), times q_mult (base-2 logits), split hi + lo.
  std::uint32_t qa[kKs][2][2];
  load_q_frags<kBf16, kD, kG>(p, c, lane, qa);
  softmax::Row<softmax::Base2> row;  // row g's running max and this thread's partial sum
  float acc[kNd][4];
#pragma unroll
  for (int nd = 0; nd < kNd; ++nd)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nd][j] = 0.f;
  __syncthreads();  // the page list
  stamp(p.stamps, stamps::decode_chunks, 2);

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
    copy_tiles<kD, 2>({sk, sv}, {kb, vb}, p, s_phys, s_len, n_pages, tok0, lane, AllRows{});
  };

  const auto compute = [&](int i) {
    const char* sk = ring + (i % kRingT) * 2 * Smem::kTileBytes;
    const char* sv = sk + Smem::kTileBytes;
    const int tok0 = (warp + i * kWarps) * kTileTok;
    float s[2][4];  // S = Q Kᵀ: tokens 0-7 (nb 0) and 8-15 (nb 1) of the tile
    tile_scores<kBf16, kD>(qa, sk, lane, s);
    // Online softmax on row g (base 2); this thread holds tokens nb*8 + 2 t4 + e.
    float v[2][2];
    float mt = row.m;
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
    float corr;
    if (row.raise(mt, corr)) {  // same decision on the 4 threads of the row
#pragma unroll
      for (int nd = 0; nd < kNd; ++nd) {
        acc[nd][0] *= corr;
        acc[nd][1] *= corr;
      }
    }
    float pr[2][2];
#pragma unroll
    for (int nb = 0; nb < 2; ++nb)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        pr[nb][e] = v[nb][e] == -INFINITY ? 0.f : row.weight(v[nb][e]);
        row.l += pr[nb][e];
      }
    tile_pv<kBf16, kD>(pr, sv, lane, acc);  // P is the A operand of one k-step
  };
  stream_tiles<kRingT, true>(my_tiles, issue, compute);
  stamp(p.stamps, stamps::decode_chunks, 3);

  row.l += __shfl_xor_sync(0xffffffffu, row.l, 1);
  row.l += __shfl_xor_sync(0xffffffffu, row.l, 2);
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
      s_m[warp * kG + g] = row.m;
      s_l[warp * kG + g] = row.l;
    }
  }
  __syncthreads();
  write_chunk_softmax<kG, kD>(p, c, kWarps, s_acc, s_m, s_l);
  stamp(p.stamps, stamps::decode_chunks, stamps::kExit);
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
