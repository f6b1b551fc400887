// GroupRule::log_prob for token_codes on the GPU (two_stage.cu runs it between the score kernel
// and the token ranking): a kv group's q heads pooled into one ranking, each token's key the max
// over the heads of (score − the head's LSE over every token of the sequence), as the CPU rule
// (select/group.cpp fill_ranked). Then one ranking per group replaces the heads' rankings and
// their round robin (two thirds of the round-robin step's time, bench/results/
// 2026-12-06-h100-token-codes.md). The score kernel leaves each head's best key in lmax
// (atomicMax: any order gives the max); then two passes over the heads' score keys:
//   1. lse_sum_kernel: each head's sum of select::lse_term(score − max), an integer (atomicAdd
//      in any order gives the CPU's sum);
//   2. pool_kernel: the LSEs (select::lse_finish, the CPU's bits), then every token's pooled key
//      into the group's first head's row (0 for the kept tokens: they are not ranked), and a
//      histogram of the pooled log-probabilities (bins of 1/32 nat).
// Then the group's best `need` tokens as a set (the merge marks them; no order is needed with
// one list): bin_select_kernel finds the bin holding the need-th best, bin_compact_kernel
// writes every token of the bins above it into the list and gathers that bin's tokens,
// bin_rank_kernel sorts those (key descending, index ascending: the CPU's ties) and takes the
// rest. Exact: the bins only decide which tokens need comparing.
#include "cta_select.cuh"
#include "device.cuh"
#include "select/log_prob.hpp"
#include "two_stage_common.cuh"

namespace masskv::cuda::two_stage_impl {
namespace {

constexpr int kPer = 4;  // keys per thread (the sum and compaction)
constexpr int kBlock = kThreads * kPer;
constexpr int kPoolPer = 8;  // the pool kernel: a histogram per CTA, flushed once
constexpr int kPoolBlock = kThreads * kPoolPer;

// The histogram bin of a pooled log-probability v (<= 0): bin 0 holds the best.
__device__ __forceinline__ int pooled_bin(double v) {
  const double x = -v * kBinsPerNat;
  return x < static_cast<double>(kBins) ? max(0, static_cast<int>(x)) : kBins - 1;
}

// Every thread's value reduced over the CTA (kThreads) with op; the result in thread 0.
template <class Op>
__device__ unsigned long long block_reduce(unsigned long long v, Op op) {
  __shared__ unsigned long long s_part[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) s_part[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < kThreads / 32 ? s_part[lane] : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  }
  return v;
}

struct Sum {
  __device__ unsigned long long operator()(unsigned long long a, unsigned long long b) const {
    return a + b;
  }
};

__global__ void __launch_bounds__(kThreads) lse_sum_kernel(Params p) {
  const int seg = blockIdx.y, b = seg / p.Hq, h = (seg % p.Hq) / p.g;
  const Plan s = plan_of(p, b, false);
  const int hi = stage2_items(p, s, b, h);
  const int base = static_cast<int>(blockIdx.x) * kBlock;
  const unsigned long long mk = p.lmax[seg];
  if (base >= hi || mk == 0ull) return;  // the whole CTA
  const double m = key_value64(mk);
  const unsigned long long* keys = p.keys2 + static_cast<std::int64_t>(seg) * p.kmax;
  unsigned long long sum = 0ull;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
    const unsigned long long k = i < hi ? keys[i] : 0ull;
    if (k != 0ull) sum += select::lse_term(__dsub_rn(key_value64(k), m));
  }
  sum = block_reduce(sum, Sum{});
  if (threadIdx.x == 0 && sum != 0ull) atomicAdd(&p.lsum[seg], sum);
}

__global__ void __launch_bounds__(kThreads) pool_kernel(Params p) {
  __shared__ double s_lse[kMaxG];
  __shared__ int s_hist[kBins];
  const int pair = blockIdx.y, b = pair / p.Hkv, h = pair % p.Hkv, g = p.g;
  const Plan s = plan_of(p, b, false);
  const int hi = stage2_items(p, s, b, h);
  const int base = static_cast<int>(blockIdx.x) * kPoolBlock;
  if (base >= hi) return;  // the whole CTA
  const std::int64_t seg0 = static_cast<std::int64_t>(b) * p.Hq + h * g;
  if (threadIdx.x < g) {
    const unsigned long long mk = p.lmax[seg0 + threadIdx.x];
    s_lse[threadIdx.x] = mk == 0ull ? 0.0 : select::lse_finish(key_value64(mk), p.lsum[seg0 + threadIdx.x]);
  }
  for (int i = threadIdx.x; i < kBins; i += kThreads) s_hist[i] = 0;
  __syncthreads();
  const std::int32_t* cand = p.cand + static_cast<std::int64_t>(pair) * p.cand_max;
#pragma unroll 4
  for (int j = 0; j < kPoolPer; ++j) {
    const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
    if (i >= hi) continue;
    const std::int64_t token = static_cast<std::int64_t>(cand[i / p.P]) * p.P + i % p.P;
    const bool kept = token < s.tok_first_end || token >= s.tok_last_begin;
    double best = 0.0;
    bool any = false;
    for (int qi = 0; qi < g; ++qi) {
      const unsigned long long k = p.keys2[(seg0 + qi) * p.kmax + i];
      if (k == 0ull) continue;
      const double v = __dsub_rn(key_value64(k), s_lse[qi]);
      best = any && best >= v ? best : v;
      any = true;
    }
    // In place: this thread alone reads or writes item i of the group's rows.
    const bool ranked = any && !kept;
    p.keys2[seg0 * p.kmax + i] = ranked ? ordered_key64(best) : 0ull;
    if (ranked) atomicAdd(&s_hist[pooled_bin(best)], 1);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < kBins; i += kThreads)
    if (s_hist[i] != 0) atomicAdd(&p.hist[seg0 * kBins + i], s_hist[i]);
}

// Per group (its first head's segment): the bin B holding the need-th best pooled key, the
// count A of the bins above it; bins = {B, A, counter}; thresh 1 where the binned rank serves
// (B's tokens fit Params::compact_cap), 0 where rank_kernel ranks the whole row.
__global__ void __launch_bounds__(kRankThreads) bin_select_kernel(Params p) {
  __shared__ int s_warp[32];
  __shared__ int s_cut[2];
  const int seg = blockIdx.x;
  if ((seg % p.Hq) % p.g != 0) return;  // not a group's first head
  const Plan s = plan_of(p, seg / p.Hq, false);
  const int depth = min(s.need, p.depth2);
  const int* hist = p.hist + static_cast<std::int64_t>(seg) * kBins;
  constexpr int kPerThread = kBins / kRankThreads;
  int c[kPerThread], mine = 0;
#pragma unroll
  for (int e = 0; e < kPerThread; ++e) mine += c[e] = hist[kPerThread * threadIdx.x + e];
  int total = 0;
  int before = block_exclusive_scan(mine, s_warp, &total);
  if (threadIdx.x == 0) s_cut[0] = -1;
  __syncthreads();
  if (depth > 0 && total >= depth) {
#pragma unroll
    for (int e = 0; e < kPerThread; ++e) {
      if (before < depth && depth <= before + c[e]) {
        s_cut[0] = kPerThread * threadIdx.x + e;
        s_cut[1] = before;
      }
      before += c[e];
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int B = s_cut[0];
    const bool ok = B >= 0 && hist[B] <= p.compact_cap;
    p.thresh[seg] = ok ? 1ull : 0ull;
    p.bins[3 * seg] = B;
    p.bins[3 * seg + 1] = ok ? s_cut[1] : 0;
    p.bins[3 * seg + 2] = 0;
    p.ccount[seg] = 0;
  }
}

// The tokens of the bins above B into the list (their order does not matter), B's into ckeys.
__global__ void __launch_bounds__(kThreads) bin_compact_kernel(Params p) {
  const int seg = blockIdx.y;
  if ((seg % p.Hq) % p.g != 0 || p.thresh[seg] == 0ull) return;
  const int b = seg / p.Hq, h = (seg % p.Hq) / p.g;
  const Plan s = plan_of(p, b, false);
  const int hi = stage2_items(p, s, b, h);
  const int base = static_cast<int>(blockIdx.x) * kBlock;
  if (base >= hi) return;
  const int B = p.bins[3 * seg];
  const unsigned long long* keys = p.keys2 + static_cast<std::int64_t>(seg) * p.kmax;
  std::int32_t* list = p.list2 + static_cast<std::int64_t>(seg) * p.depth2;
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = base + j * kThreads + static_cast<int>(threadIdx.x);
    const unsigned long long k = i < hi ? keys[i] : 0ull;
    const int bin = k != 0ull ? pooled_bin(key_value64(k)) : kBins;
    // Warp-aggregated: one atomic per warp and destination.
    const unsigned above = __ballot_sync(0xffffffffu, bin < B);
    const unsigned at_b = __ballot_sync(0xffffffffu, bin == B);
    int first_above = 0, first_b = 0;
    if (lane == 0 && above) first_above = atomicAdd(&p.bins[3 * seg + 2], __popc(above));
    if (lane == 0 && at_b) first_b = atomicAdd(&p.ccount[seg], __popc(at_b));
    first_above = __shfl_sync(0xffffffffu, first_above, 0);
    first_b = __shfl_sync(0xffffffffu, first_b, 0);
    const unsigned below_me = (1u << lane) - 1u;
    if (bin < B) list[first_above + __popc(above & below_me)] = i;
    if (bin == B) {
      const int at = first_b + __popc(at_b & below_me);  // < compact_cap: B's count
      p.ckeys[static_cast<std::int64_t>(seg) * kCompactCap + at] = k;
      p.cidx[static_cast<std::int64_t>(seg) * kCompactCap + at] = i;
    }
  }
}

// B's tokens sorted best first (key descending, index ascending), the first depth − A after
// the A tokens above B.
__global__ void __launch_bounds__(kRankThreads) bin_rank_kernel(Params p) {
  extern __shared__ unsigned long long s_ck[];  // [pow2 >= count]; then s_ci
  const int seg = blockIdx.x;
  if ((seg % p.Hq) % p.g != 0 || p.thresh[seg] == 0ull) return;
  const Plan s = plan_of(p, seg / p.Hq, false);
  const int depth = min(s.need, p.depth2);
  const int n = p.ccount[seg], A = p.bins[3 * seg + 1];
  int np = 1;
  while (np < n) np *= 2;
  std::int32_t* s_ci = reinterpret_cast<std::int32_t*>(s_ck + p.compact_cap);
  const unsigned long long* ck = p.ckeys + static_cast<std::int64_t>(seg) * kCompactCap;
  const std::int32_t* ci = p.cidx + static_cast<std::int64_t>(seg) * kCompactCap;
  for (int i = threadIdx.x; i < np; i += blockDim.x) {
    s_ck[i] = i < n ? ck[i] : 0ull;
    s_ci[i] = i < n ? ci[i] : 0x7fffffff;
  }
  __syncthreads();
  bitonic_best_first<true>(s_ck, s_ci, np);
  std::int32_t* list = p.list2 + static_cast<std::int64_t>(seg) * p.depth2;
  for (int r = threadIdx.x; r < depth - A; r += blockDim.x) list[A + r] = s_ci[r];
  if (threadIdx.x == 0) p.len2[seg] = depth;
}

}  // namespace

void clear_log_prob(const Params& p, int segs, cudaStream_t st) {
  detail::check_cuda(cudaMemsetAsync(p.lmax, 0, sizeof(unsigned long long) * segs, st),
                     "cudaMemsetAsync(log-prob max)");
  detail::check_cuda(cudaMemsetAsync(p.lsum, 0, sizeof(unsigned long long) * segs, st),
                     "cudaMemsetAsync(log-prob sum)");
  detail::check_cuda(cudaMemsetAsync(p.hist, 0, sizeof(int) * kBins * segs, st),
                     "cudaMemsetAsync(log-prob histogram)");
}

void launch_log_prob_pool(const Params& caller, int segs, int pairs, cudaStream_t st) {
  static const int compact_cap = compact_cap_of(detail::dynamic_smem_room(bin_rank_kernel));
  Params p = caller;
  p.compact_cap = compact_cap;
  const unsigned chunks = static_cast<unsigned>((p.kmax + kBlock - 1) / kBlock);
  lse_sum_kernel<<<dim3(chunks, static_cast<unsigned>(segs)), kThreads, 0, st>>>(p);
  detail::check_cuda(cudaGetLastError(), "log-prob sum kernel");
  const unsigned pool_chunks = static_cast<unsigned>((p.kmax + kPoolBlock - 1) / kPoolBlock);
  pool_kernel<<<dim3(pool_chunks, static_cast<unsigned>(pairs)), kThreads, 0, st>>>(p);
  detail::check_cuda(cudaGetLastError(), "log-prob pool kernel");
  static const bool ready = [] {
    detail::set_dynamic_smem(bin_rank_kernel, static_cast<std::size_t>(compact_cap) * 12,
                             "the log-prob bin rank kernel");
    return true;
  }();
  (void)ready;
  bin_select_kernel<<<static_cast<unsigned>(segs), kRankThreads, 0, st>>>(p);
  detail::check_cuda(cudaGetLastError(), "log-prob bin select kernel");
  bin_compact_kernel<<<dim3(chunks, static_cast<unsigned>(segs)), kThreads, 0, st>>>(p);
  detail::check_cuda(cudaGetLastError(), "log-prob bin compact kernel");
  bin_rank_kernel<<<static_cast<unsigned>(segs), kRankThreads,
                    static_cast<std::size_t>(compact_cap) * 12, st>>>(p);
  detail::check_cuda(cudaGetLastError(), "log-prob bin rank kernel");
}

}  // namespace masskv::cuda::two_stage_impl
