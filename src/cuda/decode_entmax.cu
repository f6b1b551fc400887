// CUDA alpha-entmax decode, dense and sparse (issue 7; docs/design.md §2.1 threshold, §2.6 exact
// two-step split-K scheme). Three kernels; the first and the last use the chunk skeleton of
// decode_common.cuh (a CTA per chunk of pages of one (sequence, kv head), all q heads of the
// kv head, up to 8, so every page is read once per kv group):
//  1. entmax_score_kernel reads the chunk's K. Each row group keeps as candidates the tokens
//     with z > (its running max of z) - 1 for some head: since tau >= max z - 1 (§2.1), and a
//     running max never exceeds the global one, the candidates hold the global support. Lists
//     (token, z of every head) and their max z go to the workspace; V is not read.
//  2. entmax_tau_kernel, one CTA per (sequence, q head): gathers the candidates above
//     max z - 1 (usually a few dozen) into shared memory, then solves f(tau) = 1 in f64 by
//     Newton's method from tau = max z - 1. f is convex and decreasing, so from below the
//     iterates rise monotonically to the root (no bracket needed); for alpha = 2 a step is the
//     exact active-set update (sum over {z > tau} of z, minus 1, over the count).
//  3. entmax_accum_kernel, per chunk: keeps the candidates with p > 0 for some head, reads V
//     only at those rows and sums p v and p; the chunk of a (sequence, kv head) that finishes
//     last adds the chunks' sums in chunk order and divides (merge_entmax of §2.6).
// Everything is deterministic: candidate lists and compactions keep a fixed order, integer
// atomics only count.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mutex>

#include "decode_common.cuh"
#include "device.cuh"
#include "masskv/error.hpp"

namespace masskv::cuda::decode_impl {
namespace {

using detail::check_cuda;

constexpr int kTauThreads = 256;
constexpr int kTauCap = 8192;      // candidates a tau CTA holds in shared memory (else: global)
constexpr int kOneWarpMax = 1024;  // candidates up to which one warp solves for tau
constexpr int kKept = 512;         // support rows staged per round in the accumulate kernel

constexpr int row_groups(int d) { return kWarps * (32 / (d / 8)); }

// Position of this thread's item among the block's kept items, in thread order; `total` gets
// their number (the same in every thread). Every thread of the block must call it.
template <int kBlockWarps>
__device__ __forceinline__ int block_compact(bool keep, int* s_warp, int& total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const unsigned ballot = __ballot_sync(0xffffffffu, keep);
  __syncthreads();  // s_warp of the previous call has been read
  if (lane == 0) s_warp[warp] = __popc(ballot);
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kBlockWarps; ++w) {
    before += w < warp ? s_warp[w] : 0;
    total += s_warp[w];
  }
  return before + __popc(ballot & ((1u << lane) - 1u));
}

// Walks the entries of lists [0, n_lists) in list order, a block's width at a time: every
// thread calls visit(list, entry, valid) once per round (valid false past the end), so visit
// may itself use block barriers. count(i) gives list i's length. s_scan: kBlock + 1 ints.
template <int kBlock, class Count, class Visit>
__device__ void walk_lists(int n_lists, int* s_scan, int* s_warp, Count&& count, Visit&& visit) {
  for (int l0 = 0; l0 < n_lists; l0 += kBlock) {
    const int nl = min(kBlock, n_lists - l0);
    const int mine = threadIdx.x < nl ? count(l0 + threadIdx.x) : 0;
    // Inclusive scan of the counts: warp shuffles, then the warp totals.
    int x = mine;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
      const int y = __shfl_up_sync(0xffffffffu, x, off);
      if (lane >= off) x += y;
    }
    __syncthreads();  // s_scan and s_warp of the previous batch have been read
    if (lane == 31) s_warp[warp] = x;
    __syncthreads();
    for (int w = 0; w < warp; ++w) x += s_warp[w];
    s_scan[threadIdx.x + 1] = x;
    if (threadIdx.x == 0) s_scan[0] = 0;
    __syncthreads();
    const int total = s_scan[nl];
    for (int base = 0; base < total; base += kBlock) {
      const int f = base + threadIdx.x;
      const bool valid = f < total;
      int list = 0;
      if (valid) {  // largest i with s_scan[i] <= f: a non-empty list
        int lo = 0, hi = nl - 1;
        while (lo < hi) {
          const int mid = (lo + hi + 1) / 2;
          if (s_scan[mid] <= f)
            lo = mid;
          else
            hi = mid - 1;
        }
        list = lo;
      }
      visit(l0 + list, valid ? f - s_scan[list] : 0, valid);
    }
  }
}

// ---- pass 1: scores and candidates -------------------------------------------------------
template <int kD, int kU>
struct ScoreSmem {
  static constexpr std::size_t kList = kMaxChunkPages * (sizeof(int) + sizeof(std::uint16_t));
  static constexpr std::size_t kBytes = kList + std::size_t{kStages} * kU * kThreads * 16;
};

template <bool kBf16, int kD, int kG, int kU>
__global__ void __launch_bounds__(kThreads, kG <= 4 ? 4 : 2) entmax_score_kernel(Params p) {
  constexpr int kLanesPerRow = kD / 8;
  constexpr int kRowGroups = row_groups(kD);
  constexpr int kTileTokens = kRowGroups * kU;
  extern __shared__ uint4 smem_raw[];
  int* s_phys = reinterpret_cast<int*>(smem_raw);
  std::uint16_t* s_len = reinterpret_cast<std::uint16_t*>(s_phys + kMaxChunkPages);
  uint4* s_stage =
      reinterpret_cast<uint4*>(reinterpret_cast<char*>(smem_raw) + ScoreSmem<kD, kU>::kList);

  const Chunk c = chunk_of(p);
  if (c.chunk >= live_chunks(p, c.units)) return;
  stage_page_list(p, c, s_phys, s_len);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp * (32 / kLanesPerRow) + lane / kLanesPerRow;
  const int lane_in_row = lane % kLanesPerRow;  // >= kG lanes: d / 8 >= 8
  float qf[kG][8];                              // scores come out in z units
  load_q<kG>(p, c, lane_in_row * 8, qf);
  __syncthreads();

  const std::uint16_t* kb = p.k + c.kvh * p.stride_head + lane_in_row * 8;
  const int n_tiles = ((c.n_pages << p.log2_page) + kTileTokens - 1) / kTileTokens;
  const std::int64_t list =
      (static_cast<std::int64_t>(c.bkh) * p.num_chunks + c.chunk) * kRowGroups + rg;
  float* cz = p.cand_z + list * p.per_list * kG;
  std::int32_t* ct = p.cand_t + list * p.per_list;
  float m[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) m[g] = -INFINITY;
  int n_cand = 0;

  const auto issue = [&](int tile) {
    uint4* st = s_stage + (tile % kStages) * (kU * kThreads) + threadIdx.x;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int t = rg + tile * kTileTokens + u * kRowGroups;
      const bool ok = token_ok(p, s_len, c.n_pages, t);
      cp_async16(st + u * kThreads, kb + (ok ? row_offset(p, s_phys, t) : 0), ok ? 16 : 0);
    }
  };
  const auto compute = [&](int tile) {
    const uint4* st = s_stage + (tile % kStages) * (kU * kThreads) + threadIdx.x;
    float s[kU][kG];
    score_rows<kBf16, kG, kU, kLanesPerRow>(st, kThreads, qf, s);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int t = rg + tile * kTileTokens + u * kRowGroups;
      if (!token_ok(p, s_len, c.n_pages, t)) continue;  // uniform in the row group
      bool keep = false;
      float mine = 0.f;
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        if (g >= c.heads_here) continue;
        m[g] = fmaxf(m[g], s[u][g]);
        // Rounded down: never drops a token with z > m - 1 exactly.
        keep = keep || s[u][g] > __fsub_rd(m[g], 1.f);
        if (g == lane_in_row) mine = s[u][g];
      }
      if (keep) {
        if (lane_in_row < kG) cz[n_cand * kG + lane_in_row] = mine;
        if (lane_in_row == 0) ct[n_cand] = t;
        ++n_cand;
      }
    }
  };
  stream_tiles(n_tiles, issue, compute);
  allow_dependents();  // the tau kernel may start launching: it waits for this grid anyway

  // The running max of a row group is weak early on (short lists keep most of their tokens):
  // with the chunk's max M, keep only z > M - 1 (rounded down), compacting each list in place.
  __shared__ float s_rmax[kRowGroups][kG];
  float rmax = -INFINITY;  // lane g < kG: the row group's max of head g
#pragma unroll
  for (int g = 0; g < kG; ++g)
    if (g == lane_in_row) rmax = m[g];
  if (lane_in_row < kG) s_rmax[rg][lane_in_row] = rmax;
  __syncthreads();  // also makes the lists' global writes visible to the whole CTA
  float cut[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    float mx = -INFINITY;
    for (int r = 0; r < kRowGroups; ++r) mx = fmaxf(mx, s_rmax[r][g]);
    cut[g] = __fsub_rd(mx, 1.f);
  }
  int warp_n = n_cand;  // loop bound uniform over the warp (its row groups' lists differ)
#pragma unroll
  for (int off = 16; off >= kLanesPerRow; off /= 2)
    warp_n = max(warp_n, __shfl_xor_sync(0xffffffffu, warp_n, off));
  const int row_shift = (lane / kLanesPerRow) * kLanesPerRow;
  const unsigned row_bits = kLanesPerRow == 32 ? 0xffffffffu : (1u << kLanesPerRow) - 1u;
  int n_out = 0;
  for (int e0 = 0; e0 < warp_n; e0 += kLanesPerRow) {
    const int e = e0 + lane_in_row;
    float zz[kG] = {};
    int t = 0;
    bool keep = false;
    if (e < n_cand) {
      t = ct[e];
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        zz[g] = cz[e * kG + g];
        keep = keep || (g < c.heads_here && zz[g] > cut[g]);
      }
    }
    // Every lane has read its entry before any writes (the ballot orders the warp); writes go
    // to positions <= e.
    const unsigned bits = (__ballot_sync(0xffffffffu, keep) >> row_shift) & row_bits;
    if (keep) {
      const int pos = n_out + __popc(bits & ((1u << lane_in_row) - 1u));
      ct[pos] = t;
#pragma unroll
      for (int g = 0; g < kG; ++g) cz[pos * kG + g] = zz[g];
    }
    n_out += __popc(bits);
  }

  if (lane_in_row == 0) p.cand_n[list] = n_out;
  if (lane_in_row < kG) p.cand_max[list * kG + lane_in_row] = rmax;
}

// ---- threshold -------------------------------------------------------------------------------
// Sum over the block of two doubles in a fixed order; the result is in every thread. s_red
// holds [2][warps][2]: alternate halves by `parity` so no second barrier is needed.
__device__ __forceinline__ void block_sum2(double& a, double& b, double* s_red, int parity) {
  constexpr int kW = kTauThreads / 32;
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    a += __shfl_xor_sync(0xffffffffu, a, off);
    b += __shfl_xor_sync(0xffffffffu, b, off);
  }
  double* r = s_red + parity * kW * 2;
  if (threadIdx.x % 32 == 0) {
    r[(threadIdx.x / 32) * 2] = a;
    r[(threadIdx.x / 32) * 2 + 1] = b;
  }
  __syncthreads();
  a = 0;
  b = 0;
#pragma unroll
  for (int w = 0; w < kW; ++w) {
    a += r[w * 2];
    b += r[w * 2 + 1];
  }
}

// One CTA per (sequence, q head): tau on z = (alpha-1) s over every (selected) token, into
// p.tau and p.lse (when given). NaN for a head without tokens (as the CPU).
__global__ void __launch_bounds__(kTauThreads) entmax_tau_kernel(Params p, int rgroups) {
  constexpr int kW = kTauThreads / 32;
  __shared__ float s_z[kTauCap];
  __shared__ int s_scan[kTauThreads + 1];
  __shared__ int s_warp[kW];
  __shared__ double s_red[2 * kW * 2];
  __shared__ float s_max[kW];

  const int b = blockIdx.x / p.num_q_heads, hq = blockIdx.x % p.num_q_heads;
  const int kvh = hq / p.group, j = hq % p.group;
  const int g = j % kMaxGroup;
  const int bkh = (b * p.num_kv_heads + kvh) * p.head_groups + j / kMaxGroup;
  const auto finish = [&](float tau) {
    if (threadIdx.x != 0) return;
    p.tau[b * p.num_q_heads + hq] = tau;
    if (p.lse) p.lse[b * p.num_q_heads + hq] = tau;
  };
  int num_pages, last_len;
  const int units = seq_units(p, b, kvh, num_pages, last_len);
  allow_dependents();
  wait_for_predecessor();  // the score kernel's lists (and the previous step's readers of tau)
  if (units == 0) {
    finish(NAN);
    return;
  }
  const int n_lists = live_chunks(p, units) * rgroups;
  const std::int64_t list0 = static_cast<std::int64_t>(bkh) * p.num_chunks * rgroups;

  float mx = -INFINITY;
  for (int i = threadIdx.x; i < n_lists; i += kTauThreads)
    mx = fmaxf(mx, p.cand_max[(list0 + i) * p.kg + g]);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
  if (threadIdx.x % 32 == 0) s_max[threadIdx.x / 32] = mx;
  __syncthreads();
  for (int w = 0; w < kW; ++w) mx = fmaxf(mx, s_max[w]);
  if (mx == -INFINITY) {  // no valid token (bad pages, flagged)
    finish(NAN);
    return;
  }

  // tau >= max z - 1 (§2.1): only z above it can be in the support, so a list whose max is
  // not above it is skipped whole.
  const double tau0 = static_cast<double>(mx) - 1.0;
  const auto count = [&](int i) {
    return static_cast<double>(p.cand_max[(list0 + i) * p.kg + g]) > tau0 ? p.cand_n[list0 + i] : 0;
  };
  const auto z_at = [&](int i, int e) {
    return p.cand_z[((list0 + i) * p.per_list + e) * p.kg + g];
  };
  int n = 0;
  walk_lists<kTauThreads>(n_lists, s_scan, s_warp, count, [&](int i, int e, bool valid) {
    const float z = valid ? z_at(i, e) : -INFINITY;
    const bool keep = static_cast<double>(z) > tau0;
    int total;
    const int pos = block_compact<kW>(keep, s_warp, total);
    if (keep && n + pos < kTauCap) s_z[n + pos] = z;
    n += total;
  });
  __syncthreads();
  const bool in_smem = n <= kTauCap;
  // Few candidates (the usual case: a few dozen): warp 0 alone runs Newton, reducing with
  // shuffles. The block-wide reduction costs two barriers per step, which made this kernel
  // ~10 µs, most of a sparse entmax step's excess over softmax.
  const bool one_warp = in_smem && n <= kOneWarpMax;
  if (one_warp && threadIdx.x >= 32) return;

  const double pe = p.pow_exp;
  double tau = tau0;
  with_pow(p.pow_int, [&](auto pow_kind) {
    constexpr int kPow = decltype(pow_kind)::value;
    for (int it = 0; it < kMaxNewton; ++it) {
      double f = 0, df = 0;  // f(tau) and -f'(tau)
      const auto add = [&](float zf) { newton_terms<kPow>(zf, tau, pe, f, df); };
      if (one_warp) {
        for (int i = threadIdx.x; i < n; i += 32) add(s_z[i]);
        warp_sum2(f, df);
      } else {
        if (in_smem) {
          for (int i = threadIdx.x; i < n; i += kTauThreads) add(s_z[i]);
        } else {
          walk_lists<kTauThreads>(n_lists, s_scan, s_warp, count, [&](int i, int e, bool valid) {
            if (valid) add(z_at(i, e));
          });
        }
        block_sum2(f, df, s_red, it & 1);
      }
      if (newton_step(f, df, tau)) break;
    }
  });
  finish(static_cast<float>(tau));
}

// ---- pass 2: p v over the support --------------------------------------------------------------
template <int kD, int kG, int kU>
struct AccumSmem {
  static constexpr int kRowGroups = row_groups(kD);
  static constexpr std::size_t kList = kMaxChunkPages * (sizeof(int) + sizeof(std::uint16_t));
  static constexpr std::size_t kKeptBytes = kKept * sizeof(int) + kKept * kG * sizeof(float);
  static constexpr std::size_t kStage = std::size_t{kStages} * kU * kThreads * 16;
  static constexpr std::size_t kMerge = sizeof(float) * kRowGroups * kG * (kD + 1);
  static constexpr std::size_t kBytes = kList + kKeptBytes + (kStage > kMerge ? kStage : kMerge);
};

template <bool kBf16, int kD, int kG, int kU>
__global__ void __launch_bounds__(kThreads, kG <= 4 ? 4 : 2) entmax_accum_kernel(Params p) {
  using Smem = AccumSmem<kD, kG, kU>;
  constexpr int kLanesPerRow = kD / 8;
  constexpr int kRowGroups = Smem::kRowGroups;
  constexpr int kTileTokens = kRowGroups * kU;
  extern __shared__ uint4 smem_raw[];
  __shared__ int s_scan[kThreads + 1];
  __shared__ int s_warp[kWarps];
  __shared__ int s_last;
  char* base = reinterpret_cast<char*>(smem_raw);
  int* s_phys = reinterpret_cast<int*>(base);
  std::uint16_t* s_len = reinterpret_cast<std::uint16_t*>(s_phys + kMaxChunkPages);
  int* s_t = reinterpret_cast<int*>(base + Smem::kList);
  float* s_p = reinterpret_cast<float*>(s_t + kKept);
  uint4* s_stage = reinterpret_cast<uint4*>(base + Smem::kList + Smem::kKeptBytes);

  const Chunk c = chunk_of(p);
  const int n_live = live_chunks(p, c.units);
  if (c.chunk >= n_live) {
    wait_for_predecessor();  // every exit waits: this grid never completes before the tau kernel
    return;
  }
  stage_page_list(p, c, s_phys, s_len);  // inputs only: overlaps the tau kernel
  wait_for_predecessor();                // tau, and (through it) the score kernel's lists
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rg = warp * (32 / kLanesPerRow) + lane / kLanesPerRow;
  const int lane_dim = (lane % kLanesPerRow) * 8;
  float tau[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g)
    tau[g] = g < c.heads_here ? p.tau[c.b * p.num_q_heads + c.q_head0 + g] : NAN;
  float acc[kG][8], psum[kG];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    psum[g] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[g][j] = 0.f;
  }

  // The staged support rows s_t[0, n) (weights s_p) through the cp.async ring: V only.
  const std::uint16_t* vb = p.v + c.kvh * p.stride_head + lane_dim;
  const auto accumulate = [&](int n) {
    __syncthreads();  // s_t / s_p written
    const auto issue = [&](int tile) {
      uint4* st = s_stage + (tile % kStages) * (kU * kThreads) + threadIdx.x;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int e = rg + tile * kTileTokens + u * kRowGroups;
        const bool ok = e < n;
        cp_async16(st + u * kThreads, vb + (ok ? row_offset(p, s_phys, s_t[e]) : 0), ok ? 16 : 0);
      }
    };
    const auto compute = [&](int tile) {
      const uint4* st = s_stage + (tile % kStages) * (kU * kThreads) + threadIdx.x;
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int e = rg + tile * kTileTokens + u * kRowGroups;
        if (e >= n) continue;
        float vf[8];
        to_float8<kBf16>(st[u * kThreads], vf);
#pragma unroll
        for (int g = 0; g < kG; ++g) {
          const float w = s_p[e * kG + g];
          psum[g] += w;
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[g][j] = fmaf(w, vf[j], acc[g][j]);
        }
      }
    };
    stream_tiles((n + kTileTokens - 1) / kTileTokens, issue, compute);
    __syncthreads();  // s_t / s_p and the ring free again
  };

  // Candidates of the chunk (its row groups' lists, in order) with p > 0 for some head.
  const std::int64_t list0 =
      (static_cast<std::int64_t>(c.bkh) * p.num_chunks + c.chunk) * kRowGroups;
  int n_kept = 0;
  __syncthreads();  // page list staged
  walk_lists<kThreads>(
      kRowGroups, s_scan, s_warp,
      [&](int i) {  // a list none of whose z is above tau has no support row
        bool any = false;
#pragma unroll
        for (int g = 0; g < kG; ++g) any = any || p.cand_max[(list0 + i) * kG + g] > tau[g];
        return any ? p.cand_n[list0 + i] : 0;
      },
      [&](int i, int e, bool valid) {
        float w[kG];
        bool keep = false;
        int t = 0;
        if (valid) {
          const std::int64_t slot = (list0 + i) * p.per_list + e;
          t = p.cand_t[slot];
#pragma unroll
          for (int g = 0; g < kG; ++g) {
            w[g] = weight(p.cand_z[slot * kG + g] - tau[g], p.pow_int, p.pow_exp);
            keep = keep || w[g] > 0.f;
          }
        }
        int total;
        const int pos = n_kept + block_compact<kWarps>(keep, s_warp, total);
        if (keep) {
          s_t[pos] = t;
#pragma unroll
          for (int g = 0; g < kG; ++g) s_p[pos * kG + g] = w[g];
        }
        n_kept += total;
        if (n_kept > kKept - kThreads) {
          accumulate(n_kept);
          n_kept = 0;
        }
      });
  if (n_kept > 0) accumulate(n_kept);
  __syncthreads();

  // Merge the row groups (fixed order). The merge area reuses the ring.
  float* s_acc = reinterpret_cast<float*>(s_stage);  // [kRowGroups][kG][kD]
  float* s_ps = s_acc + kRowGroups * kG * kD;        // [kRowGroups][kG]
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int j = 0; j < 8; ++j) s_acc[(rg * kG + g) * kD + lane_dim + j] = acc[g][j];
    if (lane_dim == 0) s_ps[rg * kG + g] = psum[g];
  }
  __syncthreads();
  const std::int64_t slot0 = static_cast<std::int64_t>(c.b) * p.num_q_heads * p.num_chunks;
  for (int idx = threadIdx.x; idx < kG * kD; idx += kThreads) {
    const int g = idx / kD, dim = idx % kD;
    if (g >= c.heads_here) continue;
    float o = 0.f, ps = 0.f;
    for (int r = 0; r < kRowGroups; ++r) {
      o += s_acc[(r * kG + g) * kD + dim];
      ps += s_ps[r * kG + g];
    }
    const int hq = c.q_head0 + g;
    if (n_live == 1) {
      p.out[c.b * p.o_s0 + hq * p.o_s1 + dim] = ps > 0.f ? o / ps : 0.f;
    } else {
      const std::int64_t slot = slot0 + static_cast<std::int64_t>(hq) * p.num_chunks + c.chunk;
      p.part_o[slot * kD + dim] = o;
      if (dim == 0) p.part_w[slot] = ps;
    }
  }
  if (n_live == 1) return;

  // The last chunk of the (sequence, kv head, head group) to finish sums the chunks in chunk
  // order (threadFenceReduction pattern), then resets the counter for the next step.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    s_last = atomicAdd(&p.counter[c.bkh], 1u) == static_cast<unsigned>(n_live - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Each thread owns kOut outputs; a round loads kStep chunks of all of them at once (the
  // loads are independent: one L2 round trip per round), then adds them in chunk order.
  // Thread g < kG sums head g's p the same way.
  constexpr int kOut = (kG * kD + kThreads - 1) / kThreads;
  constexpr int kStep = 64 / kOut;
  __shared__ float s_psum[kG];
  if (threadIdx.x < kG) {
    const std::int64_t s0 =
        slot0 + static_cast<std::int64_t>(c.q_head0 + threadIdx.x) * p.num_chunks;
    float ps = 0.f;
    for (int ch0 = 0; ch0 < n_live; ch0 += 16) {
      float v[16];
#pragma unroll
      for (int u = 0; u < 16; ++u)
        v[u] =
            threadIdx.x < c.heads_here && ch0 + u < n_live ? __ldcg(p.part_w + s0 + ch0 + u) : 0.f;
#pragma unroll
      for (int u = 0; u < 16; ++u) ps += v[u];
    }
    s_psum[threadIdx.x] = ps;
  }
  float o[kOut];
#pragma unroll
  for (int k = 0; k < kOut; ++k) o[k] = 0.f;
  for (int ch0 = 0; ch0 < n_live; ch0 += kStep) {
    float v[kOut][kStep];
#pragma unroll
    for (int k = 0; k < kOut; ++k) {
      const int idx = threadIdx.x + k * kThreads, g = idx / kD, dim = idx % kD;
      const std::int64_t s0 = slot0 + static_cast<std::int64_t>(c.q_head0 + g) * p.num_chunks;
#pragma unroll
      for (int u = 0; u < kStep; ++u) {
        const bool ok = idx < kG * kD && g < c.heads_here && ch0 + u < n_live;
        v[k][u] = ok ? __ldcg(p.part_o + (s0 + ch0 + u) * kD + dim) : 0.f;
      }
    }
#pragma unroll
    for (int k = 0; k < kOut; ++k)
#pragma unroll
      for (int u = 0; u < kStep; ++u) o[k] += v[k][u];
  }
  __syncthreads();  // s_psum
#pragma unroll
  for (int k = 0; k < kOut; ++k) {
    const int idx = threadIdx.x + k * kThreads, g = idx / kD, dim = idx % kD;
    if (idx >= kG * kD || g >= c.heads_here) continue;
    const float ps = s_psum[g];
    p.out[c.b * p.o_s0 + (c.q_head0 + g) * p.o_s1 + dim] = ps > 0.f ? o[k] / ps : 0.f;
  }
  if (threadIdx.x == 0) p.counter[c.bkh] = 0;
}

// ---- host ------------------------------------------------------------------------------------
using KernelFn = void (*)(Params);
struct EntmaxKernels {
  KernelFn score, accum;
  std::size_t score_smem, accum_smem;
  int kg, per_sm;
};

struct MakeEntmaxKernels {
  template <bool kBf16, int kD, int kG, int kU>
  EntmaxKernels operator()() const {
    return {entmax_score_kernel<kBf16, kD, kG, kU>,
            entmax_accum_kernel<kBf16, kD, kG, kU>,
            ScoreSmem<kD, kU>::kBytes,
            AccumSmem<kD, kG, kU>::kBytes,
            kG,
            0};
  }
};

// Kernels for (dtype, d, group) with their shared-memory limits raised once; per_sm: resident
// score CTAs per SM (plans the chunks). Cached: occupancy queries cost host time per step.
EntmaxKernels prepare_entmax(DType dtype, int d, int group) {
  const int g = kernel_group(group);
  const int key = variant_key(dtype, d, g);
  static std::mutex mu;
  static EntmaxKernels cache[24];
  static bool ready[24] = {};
  std::lock_guard<std::mutex> lock(mu);
  if (!ready[key]) {
    EntmaxKernels k = by_variant(dtype, d, g, MakeEntmaxKernels{});
    detail::set_dynamic_smem(k.score, k.score_smem, "the entmax score kernel");
    detail::set_dynamic_smem(k.accum, k.accum_smem, "the entmax accumulate kernel");
    check_cuda(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.per_sm, k.score, kThreads, k.score_smem),
        "occupancy");
    cache[key] = k;
    ready[key] = true;
  }
  return cache[key];
}

}  // namespace

void launch_entmax(Params p, const EntmaxShape& s, const DecodeLaunch& launch,
                   DecodeWorkspace::Impl& ws) {
  if (launch_entmax_cluster(p, s, launch)) return;
  const EntmaxKernels k = prepare_entmax(s.dtype, s.head_dim, p.group);
  const int kh = p.num_kv_heads * p.head_groups;
  const int cp = launch.chunk_pages > 0 ? launch.chunk_pages
                                        : plan_chunk_pages(s.batch * kh, s.units_max, k.per_sm);
  const int chunks = std::max(1, (std::max(s.units_max, 1) + cp - 1) / cp);
  require(chunks <= kMaxChunks, ErrorCode::invalid_argument, "chunk_pages",
          "too small for this many pages (more than ", kMaxChunks, " chunks)");
  const int rgroups = row_groups(s.head_dim);
  p.chunk_pages = cp;
  p.num_chunks = chunks;
  set_entmax_mapping(p, s);
  p.kg = k.kg;
  p.per_list = (cp * (1 << p.log2_page) + rgroups - 1) / rgroups;
  const std::size_t lists = static_cast<std::size_t>(s.batch) * kh * chunks * rgroups;
  p.n_cap = static_cast<std::int64_t>(chunks) * rgroups * p.per_list;
  ws.cand_z.reserve(lists * p.per_list * k.kg, "cudaMalloc(entmax candidates)");
  ws.cand_t.reserve(lists * p.per_list, "cudaMalloc(entmax candidates)");
  ws.cand_n.reserve(lists, "cudaMalloc(entmax candidates)");
  ws.cand_max.reserve(lists * k.kg, "cudaMalloc(entmax candidates)");
  const std::size_t heads = static_cast<std::size_t>(s.batch) * p.num_q_heads;
  ws.tau.reserve(heads, "cudaMalloc(entmax tau)");
  ws.part.reserve(heads * chunks * (s.head_dim + 1), "cudaMalloc(partials)");
  cudaStream_t stream = launch.stream;
  if (ws.counter.reserve(static_cast<std::size_t>(s.batch) * kh, "cudaMalloc(entmax counters)")) {
    check_cuda(cudaMemsetAsync(ws.counter.data(), 0,
                               static_cast<std::size_t>(s.batch) * kh * sizeof(unsigned), stream),
               "cudaMemset(entmax counters)");
  }
  p.cand_z = ws.cand_z.data();
  p.cand_t = ws.cand_t.data();
  p.cand_n = ws.cand_n.data();
  p.cand_max = ws.cand_max.data();
  p.tau = ws.tau.data();
  p.part_o = ws.part.data();
  p.part_w = ws.part.data() + heads * chunks * s.head_dim;
  p.counter = ws.counter.data();

  const dim3 grid(chunks, kh, s.batch);
  k.score<<<grid, kThreads, k.score_smem, stream>>>(p);
  check_cuda(cudaGetLastError(), "entmax score kernel launch");
  // The next two may begin before their predecessor ends (they wait for it on the device).
  PdlLaunch tau(stream, dim3(s.batch * p.num_q_heads), dim3(kTauThreads));
  check_cuda(cudaLaunchKernelEx(&tau.cfg, entmax_tau_kernel, p, rgroups),
             "entmax tau kernel launch");
  PdlLaunch accum(stream, grid, dim3(kThreads), k.accum_smem);
  check_cuda(cudaLaunchKernelEx(&accum.cfg, k.accum, p), "entmax accumulate kernel launch");
}

}  // namespace masskv::cuda::decode_impl
