// Sparse alpha-entmax decode in one kernel: a thread-block cluster per (sequence, kv head, head
// group) (issue 7; docs/design.md §2.1 threshold, §2.6 exact global tau).
//
// Why: the split-K entmax decode (decode_entmax.cu) is three kernels (scores and candidates,
// tau, support accumulation) that hand candidate lists, tau and partial sums over through
// global memory. At B = 1 with a 4K-token selection each step of that chain is a few µs of
// launch and round-trip latency, and the whole was ~2× the softmax decode on the same
// selection. A selection is small enough to live on chip: the cluster's CTAs split it, keep
// their z in shared memory, and exchange the few numbers tau needs through distributed shared
// memory (DSMEM), so the step needs one launch and no global round trip after the loads.
//
// Per CTA (rank r of the cluster, pages [r·S, (r+1)·S) of the selection, S = ceil(count /
// cluster) <= P = chunk_pages, the planned share),
// 8 warps, warp h taking q head h in steps 2 and 3:
//  1. z = (alpha-1)·scale·q·k of its tokens for the kv group's q heads on the tensor cores
//     (mma_frag.cuh), K only, into shared memory;
//  2. one exchange: each rank's max z per head and its candidates z > (its max) - 1 (a superset
//     of its part of the support, since tau >= the cluster's max - 1), their values too when
//     at most kCap, to every rank;
//  3. tau per head by that head's warp on the gathered values, the same on every rank bit for
//     bit: Newton in f32, then f64 from below (warp_tau); a head where some rank had more than
//     kCap candidates runs a distributed f64 Newton instead (each rank's (f, -f') exchanged
//     per step, added in rank order);
//  4. V at the support rows only (other rows zero-filled without a read), O += P V on the
//     tensor cores, sum of p;
//  5. reduce-scatter of O and sum p over the ranks (each rank finishes kG·d/cluster outputs),
//     in rank order.
// Deterministic: every sum has a fixed order; no atomics.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <mutex>

#include "decode_common.cuh"
#include "device.cuh"
#include "masskv/error.hpp"
#include "mma_frag.cuh"

namespace masskv::cuda::decode_impl {
namespace {

namespace cg = cooperative_groups;
using detail::check_cuda;

constexpr int kRankTok = 1024;  // tokens a CTA holds (z and page list in shared memory)
constexpr int kRingC = 3;  // slots per warp ring (one K or V tile each); 4 measured no faster
constexpr int kCWarps = 8;  // one CTA per SM: more warps hide the latency of each warp's chain
constexpr int kCThreads = kCWarps * 32;
constexpr int kTilesPerWarp = kRankTok / kTileTok / kCWarps;
static_assert(kCWarps >= kMaxGroup, "one head per warp");
#if !MASSKV_PRE_SM90  // what only the cluster kernel uses
constexpr int kCap = 64;  // candidates per rank and head sent to every rank (two per lane)

// Cluster barriers. arrive.relaxed at entry + wait before the first DSMEM write: a CTA's
// shared memory may only be written once that CTA has started. sync: release + acquire, so
// the DSMEM writes before it are visible to every CTA after it.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
}
#endif

// tau of one head from one warp's values (kN per lane; -inf pads), Newton from tau0 (below
// the root). First in f32: a step costs a fraction of an f64 one (one shuffle per level, a
// fast divide) and gets within ~1e-6 of the root; the result is moved down by a margin well
// above the f32 error (never below tau0), so the f64 steps that follow still rise to the root
// from below, in two or three steps instead of ~7 from tau0. A general power (kPow 0) keeps
// its loops rolled: pow() inlined kN times would bloat the kernel.
template <int kPow, int kN>
__device__ __forceinline__ double warp_tau(const float (&z)[kN], double tau0, double pe) {
  constexpr int kUnroll = kPow == 0 ? 1 : kN;
  float t = static_cast<float>(tau0);
  const float pef = static_cast<float>(pe);
  for (int it = 0; it < 40; ++it) {
    float f = 0.f, df = 0.f;
#pragma unroll kUnroll
    for (int i = 0; i < kN; ++i) {
      const float u = fmaxf(z[i] - t, 0.f);
      if constexpr (kPow == 1) {
        f += u;
        df += u > 0.f ? 1.f : 0.f;
      } else if constexpr (kPow == 2) {
        f = fmaf(u, u, f);
        df += 2.f * u;
      } else if (u > 0.f) {
        const float up = powf(u, pef - 1.f);
        f = fmaf(up, u, f);
        df = fmaf(pef, up, df);
      }
    }
    warp_sum2(f, df);
    if (!(f > 1.f) || !(df > 0.f)) break;
    const float step = __fdividef(f - 1.f, df);
    t += step;
    if (!(step > 1e-6f * fmaxf(1.f, fabsf(t)))) break;
  }
  double tau = fmax(tau0, static_cast<double>(t) - 2e-5 * fmax(1.0, fabs(static_cast<double>(t))));
  for (int it = 0; it < kMaxNewton; ++it) {
    double f = 0, df = 0, f2 = 0, df2 = 0;  // two chains of additions
#pragma unroll kUnroll
    for (int i = 0; i + 1 < kN; i += 2) {
      newton_terms<kPow>(z[i], tau, pe, f, df);
      newton_terms<kPow>(z[i + 1], tau, pe, f2, df2);
    }
    f += f2;
    df += df2;
    warp_sum2(f, df);
    if (newton_step(f, df, tau)) break;
  }
  return tau;
}

template <int kD, int kG>
struct ClusterSmem {
  static constexpr std::size_t kPhys = kRankTok * sizeof(int);
  static constexpr std::size_t kLen = kRankTok * sizeof(std::uint16_t);
  static constexpr std::size_t kZ = std::size_t{kG} * kRankTok * sizeof(float);
  static constexpr std::size_t kCand = std::size_t{kG} * kRankTok * sizeof(std::uint16_t);
  static constexpr std::size_t kSup = kRankTok;  // one byte per token
  static constexpr std::size_t kTiles = std::size_t{kCWarps} * kTilesPerWarp * sizeof(int);
  static constexpr std::size_t kRing = std::size_t{kCWarps} * kRingC * tile_bytes<kD>();
  static constexpr std::size_t kMerge = sizeof(float) * kCWarps * kG * (kD + 9);
  static constexpr std::size_t kBytes =
      kPhys + kLen + kZ + kCand + kSup + kTiles + (kRing > kMerge ? kRing : kMerge);
};

template <bool kBf16, int kD, int kG, int kCs>
__global__ void __launch_bounds__(kCThreads, 1) entmax_cluster_kernel(Params p) {
#if MASSKV_PRE_SM90
  __trap();  // never launched before sm_90 (hopper_paths)
#else
  using Smem = ClusterSmem<kD, kG>;
  constexpr int kNd = kD / 8;
  constexpr int kSlice = kG * kD / kCs;  // outputs each rank finishes
  extern __shared__ uint4 smem_raw[];
  char* base = reinterpret_cast<char*>(smem_raw);
  int* s_phys = reinterpret_cast<int*>(base);
  auto* s_len = reinterpret_cast<std::uint16_t*>(base + Smem::kPhys);
  float* s_z = reinterpret_cast<float*>(base + Smem::kPhys + Smem::kLen);  // [kG][kRankTok]
  auto* s_ci = reinterpret_cast<std::uint16_t*>(base + Smem::kPhys + Smem::kLen + Smem::kZ);
  auto* s_sup = reinterpret_cast<std::uint8_t*>(reinterpret_cast<char*>(s_ci) + Smem::kCand);
  int* s_tiles = reinterpret_cast<int*>(s_sup + Smem::kSup);  // [kCWarps][kTilesPerWarp]
  char* s_ring = reinterpret_cast<char*>(s_tiles) + Smem::kTiles;
  __shared__ float s_xmax[kCs][kG];     // every rank's max z per head
  __shared__ double2 s_nw[2][kCs][kG];  // every rank's (f, -f') per head, by iteration parity
  __shared__ float s_pin[kCs][kG];      // every rank's sum of p per head
  __shared__ float s_oin[kCs][kSlice];  // every rank's sum of p v over this rank's slice
  __shared__ float s_tf[kG];            // tau per head (f32, as the weights use it)
  __shared__ int s_xcnt[kCs][kG];       // every rank's candidate count per head
  __shared__ float s_gz[kG][kCs][kCap];  // every rank's candidates per head (count <= kCap)

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  cluster_arrive_relaxed();
  Chunk c = chunk_of(p);  // chunk = rank: the host set chunk_pages = P, num_chunks = kCs
  // The ranks split the list's own count, not its capacity P·kCs (a list shorter than its
  // capacity — the adaptive rule's — would leave the high ranks idle); at most P pages a rank.
  const int share = (c.units + kCs - 1) / kCs;
  c.unit0 = rank * share;
  c.n_pages = max(0, min(share, c.units - c.unit0));
  stage_page_list(p, c, s_phys, s_len);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane >> 2, t4 = lane & 3;  // fragment row (q head) and column pair
  std::uint32_t qa[kD / 16][2][2];
  load_q_frags<kBf16, kD, kG>(p, c, lane, qa);
  __syncthreads();  // the page list

  const int n_pages = c.n_pages;
  const int rows = n_pages << p.log2_page;  // <= kRankTok (host)
  const int tiles_all = (rows + kTileTok - 1) / kTileTok;
  const int rows_pad = tiles_all * kTileTok;
  const int my_tiles = warp < tiles_all ? (tiles_all - warp + kCWarps - 1) / kCWarps : 0;
  char* ring = s_ring + static_cast<std::size_t>(warp) * kRingC * tile_bytes<kD>();
  const auto slot = [&](int i) { return ring + (i % kRingC) * tile_bytes<kD>(); };
  const auto tok0_of = [&](int i) { return (warp + i * kCWarps) * kTileTok; };
  const std::uint16_t* kb = p.k + c.kvh * p.stride_head;
  const std::uint16_t* vb = p.v + c.kvh * p.stride_head;

  // 1. z of every token and head (-inf: no token, or a padding head).
  const auto valid = [&](int t) { return token_ok(p, s_len, n_pages, t); };
  stream_tiles<kRingC, true>(
      my_tiles,
      [&](int i) {
        copy_tiles<kD, 1>({slot(i)}, {kb}, p, s_phys, s_len, n_pages, tok0_of(i), lane, AllRows{});
      },
      [&](int i) {
        float s[2][4];
        tile_scores<kBf16, kD>(qa, slot(i), lane, s);
        if (g >= kG) return;
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int t = tok0_of(i) + nb * 8 + 2 * t4 + e;
            s_z[g * kRankTok + t] = g < c.heads_here && valid(t) ? s[nb][e] : -INFINITY;
          }
      });
  __syncthreads();

  // 2. Warp h < kG takes head h: this rank's max z and its candidates z > max - 1 (a superset
  // of its part of the support: tau >= the cluster's max - 1 >= this max - 1), sent to every
  // rank in one exchange; the values too when they fit (kCap per rank and head).
  const int h = warp;
  const bool has_head = h < kG;
  cluster_wait();  // every CTA of the cluster has started
  if (has_head) {
    float mx = -INFINITY;
    for (int t = lane; t < rows_pad; t += 32) mx = fmaxf(mx, s_z[h * kRankTok + t]);
#pragma unroll
    for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    int n = 0;
    if (mx != -INFINITY) {
      const double cut = static_cast<double>(mx) - 1.0;
      for (int t0 = 0; t0 < rows_pad; t0 += 32) {
        const int t = t0 + lane;
        const bool keep = t < rows_pad && static_cast<double>(s_z[h * kRankTok + t]) > cut;
        const unsigned bits = __ballot_sync(0xffffffffu, keep);
        if (keep) s_ci[h * kRankTok + n + __popc(bits & ((1u << lane) - 1u))] = t;
        n += __popc(bits);
      }
    }
    __syncwarp();
    if (lane < kCs) {
      *cluster.map_shared_rank(&s_xmax[rank][h], lane) = mx;
      *cluster.map_shared_rank(&s_xcnt[rank][h], lane) = n;
    }
    for (int e = lane; e < n && n <= kCap; e += 32) {
      const float z = s_z[h * kRankTok + s_ci[h * kRankTok + e]];
      for (int r = 0; r < kCs; ++r) *cluster.map_shared_rank(&s_gz[h][rank][e], r) = z;
    }
  }
  cluster_sync();

  // 3. Newton on f(tau) = 1 from tau0 = max z - 1. A head whose candidates all arrived: its
  // warp alone, on the same values in the same order on every rank (so every rank holds the
  // same tau), no further exchange. A head where some rank had more than kCap candidates:
  // every rank sums its own and the sums are exchanged at each step (one cluster barrier per
  // step for all such heads).
  const double pe = p.pow_exp;
  double tau[kG];  // distributed heads (the same in every thread)
  bool done[kG];   // distributed Newton finished, or not needed
  bool all_done = true;
  bool my_empty = true, my_over = false;
#pragma unroll
  for (int hh = 0; hh < kG; ++hh) {
    float mx = -INFINITY;
    bool over = false;
    for (int r = 0; r < kCs; ++r) {
      mx = fmaxf(mx, s_xmax[r][hh]);
      over = over || s_xcnt[r][hh] > kCap;
    }
    tau[hh] = static_cast<double>(mx) - 1.0;
    done[hh] = !over || mx == -INFINITY;
    all_done = all_done && done[hh];
    if (hh == h) {
      my_empty = mx == -INFINITY;
      my_over = over;
    }
  }
  if (has_head && lane == 0 && my_empty) s_tf[h] = NAN;  // no token
  if (has_head && !my_empty && !my_over) {
    constexpr int kN = kCs * (kCap / 32);
    float zc[kN];  // the lane's values from every rank
#pragma unroll
    for (int r = 0; r < kCs; ++r)
#pragma unroll
      for (int j = 0; j < kCap / 32; ++j)
        zc[r * (kCap / 32) + j] =
            lane + 32 * j < s_xcnt[r][h] ? s_gz[h][r][lane + 32 * j] : -INFINITY;
    double t = 0;
#pragma unroll
    for (int hh = 0; hh < kG; ++hh)
      if (hh == h) t = tau[hh];
    with_pow(p.pow_int, [&](auto pow_kind) { t = warp_tau<decltype(pow_kind)::value>(zc, t, pe); });
    if (lane == 0) s_tf[h] = static_cast<float>(t);
  }
  for (int it = 0; it < kMaxNewton && !all_done; ++it) {
    const int par = it & 1;
    bool my_done = true;
    double my_tau = 0;
#pragma unroll
    for (int hh = 0; hh < kG; ++hh)
      if (hh == h) {
        my_done = done[hh];
        my_tau = tau[hh];
      }
    if (has_head && !my_done) {
      double f = 0, df = 0;
      const int n = s_xcnt[rank][h];
      with_pow(p.pow_int, [&](auto pow_kind) {
        constexpr int kPow = decltype(pow_kind)::value;
#pragma unroll 1
        for (int e = lane; e < n; e += 32)
          newton_terms<kPow>(s_z[h * kRankTok + s_ci[h * kRankTok + e]], my_tau, pe, f, df);
      });
      warp_sum2(f, df);
      if (lane < kCs) *cluster.map_shared_rank(&s_nw[par][rank][h], lane) = make_double2(f, df);
    }
    cluster_sync();
    all_done = true;
#pragma unroll
    for (int hh = 0; hh < kG; ++hh) {
      if (done[hh]) continue;
      double f = 0, df = 0;
      for (int r = 0; r < kCs; ++r) {
        const double2 x = s_nw[par][r][hh];
        f += x.x;
        df += x.y;
      }
      done[hh] = newton_step(f, df, tau[hh]);
      all_done = all_done && done[hh];
    }
  }
  if (has_head && lane == 0 && !my_empty && my_over) {
#pragma unroll
    for (int hh = 0; hh < kG; ++hh)
      if (hh == h) s_tf[h] = static_cast<float>(tau[hh]);
  }
  __syncthreads();  // s_tf

  // 4. Support rows (p > 0 for some head), the warp's tiles holding any, then P V over them
  // (V read at the support rows only; the other rows of a tile are zero-filled, p = 0 there).
  for (int t = threadIdx.x; t < rows_pad; t += kCThreads) {
    bool sup = false;
#pragma unroll
    for (int h = 0; h < kG; ++h) sup = sup || s_z[h * kRankTok + t] - s_tf[h] > 0.f;
    s_sup[t] = sup ? 1 : 0;
  }
  __syncthreads();
  int n_sup = 0;
  {
    const int i = lane;  // my_tiles <= kTilesPerWarp <= 32
    bool any = false;
    if (i < my_tiles)
      for (int r = 0; r < kTileTok; ++r) any = any || s_sup[tok0_of(i) + r] != 0;
    const unsigned bits = __ballot_sync(0xffffffffu, any);
    if (any) s_tiles[warp * kTilesPerWarp + __popc(bits & ((1u << lane) - 1u))] = i;
    n_sup = __popc(bits);
    __syncwarp();
  }
  float acc[kNd][4];
#pragma unroll
  for (int nd = 0; nd < kNd; ++nd)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[nd][j] = 0.f;
  float ps = 0.f;  // row g's sum of p over this thread's tokens
  const float tg = g < kG ? s_tf[g] : NAN;
  const auto sup_tok0 = [&](int j) { return tok0_of(s_tiles[warp * kTilesPerWarp + j]); };
  stream_tiles<kRingC, true>(
      n_sup,
      [&](int j) {
        copy_tiles<kD, 1>({slot(j)}, {vb}, p, s_phys, s_len, n_pages, sup_tok0(j), lane,
                          [&](int t) { return s_sup[t] != 0; });
      },
      [&](int j) {
        float pr[2][2];
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int t = sup_tok0(j) + nb * 8 + 2 * t4 + e;
            pr[nb][e] = g < kG ? weight(s_z[g * kRankTok + t] - tg, p.pow_int, p.pow_exp) : 0.f;
            ps += pr[nb][e];
          }
        tile_pv<kBf16, kD>(pr, slot(j), lane, acc);
      });
  ps += __shfl_xor_sync(0xffffffffu, ps, 1);
  ps += __shfl_xor_sync(0xffffffffu, ps, 2);

  // 5. The warps' sums (in warp order), then the ranks' (in rank order) by reduce-scatter.
  __syncthreads();                                  // the rings are free
  // Rows padded by 8 floats: the float2 stores of a half warp hit 32 distinct banks.
  constexpr int kRow = kD + 8;
  float* s_acc = reinterpret_cast<float*>(s_ring);  // [kCWarps][kG][kRow]
  float* s_ps = s_acc + kCWarps * kG * kRow;        // [kCWarps][kG]
  if (g < kG) {
#pragma unroll
    for (int nd = 0; nd < kNd; ++nd)
      *reinterpret_cast<float2*>(&s_acc[(warp * kG + g) * kRow + nd * 8 + 2 * t4]) =
          make_float2(acc[nd][0], acc[nd][1]);
    if (t4 == 0) s_ps[warp * kG + g] = ps;
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < kG * kD; idx += kCThreads) {
    float o = 0.f;
    for (int w = 0; w < kCWarps; ++w) o += s_acc[(w * kG + idx / kD) * kRow + idx % kD];
    *cluster.map_shared_rank(&s_oin[rank][idx % kSlice], idx / kSlice) = o;
  }
  if (threadIdx.x < kG) {
    float tot = 0.f;
    for (int w = 0; w < kCWarps; ++w) tot += s_ps[w * kG + threadIdx.x];
    for (int r = 0; r < kCs; ++r) *cluster.map_shared_rank(&s_pin[rank][threadIdx.x], r) = tot;
  }
  cluster_sync();  // after it no CTA touches another's shared memory: all may exit
  for (int e = threadIdx.x; e < kSlice; e += kCThreads) {
    const int idx = rank * kSlice + e, h = idx / kD, dim = idx % kD;
    if (h >= c.heads_here) continue;
    float o = 0.f, tot = 0.f;
    for (int r = 0; r < kCs; ++r) {
      o += s_oin[r][e];
      tot += s_pin[r][h];
    }
    p.out[c.b * p.o_s0 + (c.q_head0 + h) * p.o_s1 + dim] = tot > 0.f ? o / tot : 0.f;
  }
  if (rank == 0 && p.lse && static_cast<int>(threadIdx.x) < c.heads_here)
    p.lse[c.b * p.num_q_heads + c.q_head0 + threadIdx.x] = s_tf[threadIdx.x];
#endif
}

// ---- host ------------------------------------------------------------------------------------
struct ClusterKernel {
  KernelFn fn = nullptr;
  std::size_t smem = 0;
  int max_clusters = 0;  // clusters of this size the device co-schedules (0: not launchable)
};

template <bool kBf16, int kD, int kCs>
ClusterKernel by_group_cluster(int g) {
  switch (g) {
    case 1:
      return {entmax_cluster_kernel<kBf16, kD, 1, kCs>, ClusterSmem<kD, 1>::kBytes};
    case 2:
      return {entmax_cluster_kernel<kBf16, kD, 2, kCs>, ClusterSmem<kD, 2>::kBytes};
    case 4:
      return {entmax_cluster_kernel<kBf16, kD, 4, kCs>, ClusterSmem<kD, 4>::kBytes};
    default:
      return {entmax_cluster_kernel<kBf16, kD, 8, kCs>, ClusterSmem<kD, 8>::kBytes};
  }
}
template <bool kBf16, int kCs>
ClusterKernel by_dim_cluster(int d, int g) {
  return d == 64 ? by_group_cluster<kBf16, 64, kCs>(g) : by_group_cluster<kBf16, 128, kCs>(g);
}

// The variant for (dtype, d, kernel group g, cluster size cs), attributes set once, with the
// number of its clusters the device can hold at once. Cached: the queries cost host time.
ClusterKernel prepare_cluster(DType dtype, int d, int g, int cs) {
  const int key = variant_key(dtype, d, g) + (cs == 16 ? 24 : 0);
  static std::mutex mu;
  static ClusterKernel cache[48];
  static bool ready[48] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[key]) {
    const bool bf16 = dtype == DType::bf16;
    ClusterKernel k = cs == 16 ? (bf16 ? by_dim_cluster<true, 16>(d, g)
                                       : by_dim_cluster<false, 16>(d, g))
                               : (bf16 ? by_dim_cluster<true, 8>(d, g)
                                       : by_dim_cluster<false, 8>(d, g));
    detail::set_dynamic_smem(k.fn, k.smem, "the entmax cluster kernel");
    if (cs > 8)
      check_cuda(cudaFuncSetAttribute(k.fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                 "cudaFuncSetAttribute(non-portable cluster size)");
    cudaLaunchAttribute attr{};
    const cudaLaunchConfig_t cfg =
        detail::cluster_config(dim3(cs), dim3(kCThreads), k.smem, nullptr, attr, cs);
    if (cudaOccupancyMaxActiveClusters(&k.max_clusters, k.fn, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // not launchable here: reported as 0 clusters
      k.max_clusters = 0;
    }
    cache[key] = k;
    ready[key] = true;
  }
  return cache[key];
}

}  // namespace

bool launch_entmax_cluster(Params p, const EntmaxShape& s, const DecodeLaunch& launch) {
  using EK = DecodeLaunch::EntmaxKernel;
  const bool forced = launch.entmax_kernel == EK::cluster;
  if (launch.entmax_kernel == EK::split) return false;
  require(launch.cluster_size == 0 || launch.cluster_size == 8 || launch.cluster_size == 16,
          ErrorCode::invalid_argument, "cluster_size", "must be 0 (automatic), 8 or 16");
  const auto unsupported = [&](const char* why) {
    require(!forced, ErrorCode::unsupported, "entmax_kernel", "the cluster kernel ", why);
    return false;
  };
  if (!detail::hopper_paths()) return unsupported("needs thread-block clusters (sm_90)");
  if (!p.sparse) return unsupported("serves sparse decode (a selection) only");
  if (s.head_dim != 64 && s.head_dim != 128) return unsupported("serves head_dim 64 and 128");
  const int kh = p.num_kv_heads * p.head_groups;
  const std::int64_t clusters = static_cast<std::int64_t>(s.batch) * kh;  // one per list
  const int g = kernel_group(p.group);
  const auto per_rank = [&](int size) { return (std::max(s.units_max, 1) + size - 1) / size; };
  const auto fits_tokens = [&](int size) {
    return (static_cast<std::int64_t>(per_rank(size)) << p.log2_page) <= kRankTok;
  };
  // Cluster size: 16 (twice the SMs on a selection) while its clusters fit in one wave, else 8;
  // 16 also when the selection is too long for clusters of 8.
  int cs = launch.cluster_size;
  if (cs == 0) {
    const ClusterKernel k16 = prepare_cluster(s.dtype, s.head_dim, g, 16);
    const bool wave16 = k16.max_clusters > 0 && clusters <= k16.max_clusters;
    cs = wave16 || (!fits_tokens(8) && k16.max_clusters > 0) ? 16 : 8;
  }
  const ClusterKernel k = prepare_cluster(s.dtype, s.head_dim, g, cs);
  if (k.max_clusters == 0) return unsupported("cannot be scheduled on this device");
  // One CTA per SM: past one wave of clusters (as many as the device co-schedules, 15 of 8 on
  // the H200) the split path's many small CTAs are faster (measured 2.1x slower at B = 16,
  // 8 kv heads: bench/results/2026-12-04-h200-cluster.md).
  if (!forced && clusters > k.max_clusters) return false;
  if (!fits_tokens(cs))
    return unsupported("holds at most 1024 tokens per CTA (cluster_size * 1024 per head)");

  p.chunk_pages = per_rank(cs);
  p.num_chunks = cs;
  set_entmax_mapping(p, s);
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg =
      detail::cluster_config(dim3(cs, kh, s.batch), dim3(kCThreads), k.smem, launch.stream,
                             attr, cs);
  check_cuda(cudaLaunchKernelEx(&cfg, k.fn, p), "entmax cluster kernel launch");
  return true;
}

}  // namespace masskv::cuda::decode_impl
