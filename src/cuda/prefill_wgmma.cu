// The sm_90a prefill kernels (prefill_tile.cuh; the host side is prefill.cu): prefill_wgmma_kernel
// (warpgroup MMA, d = 128, 1, 2 or 4 q heads per CTA) and prefill_ws_kernel (warp-specialised,
// FlashAttention-3's structure, 4 q heads per CTA). Same tile walk, online softmax and epilogue
// as prefill.cu's mma.sync kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "pipeline.cuh"
#include "prefill_tile.cuh"
#include "wgmma.cuh"

namespace masskv::cuda::prefill_impl {
namespace {

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

template <bool kBf16, int kHeads>
KernelInfo wgmma_info() {
  return {prefill_wgmma_kernel<kBf16, kHeads>, sizeof(std::uint16_t) * (kHeads + 4) * kTile * 128,
          kHeads * 128};
}

}  // namespace

KernelInfo wgmma_kernel(bool bf16, int heads) {
  return bf16 ? (heads == 4   ? wgmma_info<true, 4>()
                 : heads == 2 ? wgmma_info<true, 2>()
                              : wgmma_info<true, 1>())
              : (heads == 4   ? wgmma_info<false, 4>()
                 : heads == 2 ? wgmma_info<false, 2>()
                              : wgmma_info<false, 1>());
}

KernelInfo ws_kernel(bool bf16) {
  return {bf16 ? prefill_ws_kernel<true> : prefill_ws_kernel<false>, ws_smem(), kWsThreads};
}

}  // namespace masskv::cuda::prefill_impl
