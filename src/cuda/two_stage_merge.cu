// The two-stage merges (two_stage.cu runs them): per (sequence, kv head) the q heads' ranked
// lists merged the way selectors.cpp's fill does — the round robin (each head in turn takes its
// best item not yet taken) — or, with one list (log_prob, or a q head per kv head), its best
// items; then stage 1's candidate pages, or stage 2's output list (kept tokens, the chosen
// candidates, ascending).
#include "cta_select.cuh"
#include "device.cuh"
#include "two_stage_common.cuh"

namespace masskv::cuda::two_stage_impl {
namespace {

// ---- 3/6. round robin of the q heads' lists, then the ascending list ----------------------

__device__ __forceinline__ bool bit_of(const unsigned* bm, int x) { return (bm[x >> 5] >> (x & 31)) & 1u; }

// Position of the k-th (0-based) set bit of a (k < popc(a)).
__device__ __forceinline__ int nth_bit(unsigned a, int k) {
  int pos = 0;
#pragma unroll
  for (int s = 16; s > 0; s >>= 1) {
    const unsigned lo = a & ((1u << s) - 1u);
    const int c = __popc(lo);
    if (k >= c) {
      k -= c;
      a >>= s;
      pos += s;
    } else {
      a = lo;
    }
  }
  return pos;
}

// Warp 0: takes `need` items from the g lists (lists[i][0 .. n[i])) the way selectors.cpp's
// fill does (turns in head order, round after round; at its turn a head takes its first item
// not yet taken; a head without items left is passed over; stop at `need` or when no head
// has items), marking them in the bitmap bm. Lane l holds entry ptr[i] + l of every head's
// list (win); av[i]: the window's entries not taken (uniform). A batch gives the next turns
// to the lanes in turn order (lane l: turn h0 + l, head (h0 + l) % g, the entry after the
// ones its head's earlier lanes take) and commits the turns before the first lane whose pick another earlier
// lane also picked (that head would skip it: the turn is redone in the next batch) or whose
// head has no such entry in its window: up to 32 turns at once, the CPU's order exactly.
__device__ void round_robin(const std::int32_t* const* lists, const int* n_in, int g, int need,
                            unsigned* bm) {
  const int lane = threadIdx.x % 32;
  int n[kMaxG], ptr[kMaxG], win[kMaxG];
  unsigned av[kMaxG];
#pragma unroll
  for (int i = 0; i < kMaxG; ++i) {
    n[i] = i < g ? n_in[i] : 0;
    ptr[i] = 0;
    win[i] = lane < n[i] ? lists[i][lane] : -1;
    av[i] = __ballot_sync(0xffffffffu, win[i] >= 0);
  }
  const int per = (32 + g - 1) / g;  // turns of one head in a full batch (at most)
  int taken = 0, h0 = 0, idle = 0;
  while (taken < need && idle < g) {
    // Windows start at the first entry not taken and hold >= per entries where the list has.
#pragma unroll
    for (int i = 0; i < kMaxG; ++i) {
      if (i < g && __popc(av[i]) < per && ptr[i] + 32 < n[i]) {
        int first = av[i] != 0 ? __ffs(av[i]) - 1 : 32;
        while (first > 0 && ptr[i] + 32 < n[i]) {
          ptr[i] += first;
          const int at = ptr[i] + lane;
          win[i] = at < n[i] ? lists[i][at] : -1;
          av[i] = __ballot_sync(0xffffffffu, win[i] >= 0 && !bit_of(bm, win[i]));
          first = av[i] != 0 ? 0 : 32;
        }
      }
    }
    // Lane l: turn h0 + l of the batch; k = the earlier turns of its head in the batch (a
    // head before h0 first comes in the batch's second round).
    const int t = h0 + lane;
    const int head = t % g, k = t / g - (head < h0 ? 1 : 0);
    unsigned mine = 0;
#pragma unroll
    for (int i = 0; i < kMaxG; ++i) mine = i == head ? av[i] : mine;
    const bool has = k < __popc(mine);
    const int pos = has ? nth_bit(mine, k) : 0;
    int pick = -1;
#pragma unroll
    for (int i = 0; i < kMaxG; ++i) {
      if (i < g) {
        const int v = __shfl_sync(0xffffffffu, win[i], pos);
        pick = i == head && has ? v : pick;
      }
    }
    const bool short_ = lane >= need - taken || pick < 0;
    const unsigned same = __match_any_sync(0xffffffffu, pick);
    const bool dup = (same & ((1u << lane) - 1u)) != 0u;
    const unsigned stop = __ballot_sync(0xffffffffu, short_ || dup);
    const int L = stop != 0u ? __ffs(stop) - 1 : 32;
    if (L == 0) {  // head h0 has no entry left (its window was topped up): passed over
      h0 = (h0 + 1) % g;
      ++idle;
      continue;
    }
    idle = 0;
    if (lane < L) atomicOr(&bm[pick >> 5], 1u << (pick & 31));
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kMaxG; ++i)
      if (i < g) av[i] = __ballot_sync(0xffffffffu, win[i] >= 0 && !bit_of(bm, win[i]));
    taken += L;
    h0 = (h0 + L) % g;
  }
  __syncwarp();
}

// Calls emit(rank, item) for every set bit of bm[0 .. words) in ascending order, all threads
// of the CTA (kThreads); returns the number of set bits.
template <class Emit>
__device__ int emit_ascending(const unsigned* bm, int words, int* s_warp, Emit&& emit) {
  const int per = (words + blockDim.x - 1) / blockDim.x;
  const int w0 = threadIdx.x * per, w1 = min(words, w0 + per);
  int mine = 0;
  for (int w = w0; w < w1; ++w) mine += __popc(bm[w]);
  int total = 0;
  int at = block_exclusive_scan(mine, s_warp, &total);
  for (int w = w0; w < w1; ++w) {
    unsigned x = bm[w];
    while (x) {
      const int bit = __ffs(x) - 1;
      x &= x - 1;
      emit(at++, w * 32 + bit);
    }
  }
  return total;
}

template <int kStage>
__global__ void __launch_bounds__(kThreads) merge_kernel(Params p) {
  extern __shared__ unsigned s_bm[];
  __shared__ int s_warp[32];
  __shared__ const std::int32_t* s_lists[kMaxG];
  __shared__ int s_n[kMaxG];
  const int b = blockIdx.x / p.Hkv, h = blockIdx.x % p.Hkv;
  // log_prob: one list per group (its first head's row holds the pooled ranking).
  const int g = kStage == 2 && p.log_prob ? 1 : p.g;
  const std::int64_t pair = static_cast<std::int64_t>(b) * p.Hkv + h;
  const Plan s = plan_of(p, b, false);
  const int items = kStage == 1 ? p.max_pages : p.kmax;
  const int words = (items + 31) / 32;
  for (int w = threadIdx.x; w < words; w += blockDim.x) s_bm[w] = 0u;
  if (threadIdx.x < g) {
    const std::int64_t seg = static_cast<std::int64_t>(b) * p.Hq + h * p.g + threadIdx.x;
    s_lists[threadIdx.x] = kStage == 1 ? p.list1 + seg * p.cand_max : p.list2 + seg * p.depth2;
    s_n[threadIdx.x] = s.bad ? 0 : (kStage == 1 ? p.len1[seg] : p.len2[seg]);
  }
  __syncthreads();
  const int need = s.bad ? 0 : (kStage == 1 ? s.m1 : s.need);
  if (g == 1) {  // one list (log_prob, or a q head per kv head): its best `need`, no turns
    const int n = min(need, s_n[0]);
    for (int r = threadIdx.x; r < n; r += blockDim.x) {
      const int x = s_lists[0][r];  // a list holds distinct items
      atomicOr(&s_bm[x >> 5], 1u << (x & 31));
    }
  } else if (threadIdx.x < 32) {
    round_robin(s_lists, s_n, g, need, s_bm);
  }
  __syncthreads();
  if constexpr (kStage == 1) {
    std::int32_t* out = p.cand + pair * p.cand_max;
    const int total = emit_ascending(s_bm, words, s_warp, [&](int r, int page) {
      if (r < p.cand_max) out[r] = page;
    });
    if (threadIdx.x == 0) p.n_cand[pair] = min(total, p.cand_max);
  } else {
    // Kept tokens [0, fe), the chosen candidates (between them in token order), [lb, L).
    std::int32_t* out = p.out_ids + pair * p.max_per_head;
    const std::int32_t* cand = p.cand + pair * p.cand_max;
    int chosen = 0;
    for (int w = threadIdx.x; w < words; w += blockDim.x) chosen += __popc(s_bm[w]);
    int total_chosen = 0;
    block_exclusive_scan(chosen, s_warp, &total_chosen);
    const std::int64_t fe = s.bad ? 0 : min(s.tok_first_end, s.L);
    const std::int64_t lb = s.bad ? 0 : max(s.tok_last_begin, fe);
    const std::int64_t total = s.bad ? 0 : fe + total_chosen + (s.L - lb);
    const bool fits = total <= p.max_per_head;
    if (!fits && threadIdx.x == 0) atomicOr(p.err, kBadCapacity);
    const int written = fits ? static_cast<int>(total) : 0;
    if (fits) {
      for (std::int64_t x = threadIdx.x; x < fe; x += blockDim.x) out[x] = static_cast<int>(x);
      const int P = p.P;
      emit_ascending(s_bm, words, s_warp, [&](int r, int pos) {
        out[fe + r] = cand[pos / P] * P + pos % P;
      });
      const std::int64_t base = fe + total_chosen;
      for (std::int64_t x = lb + threadIdx.x; x < s.L; x += blockDim.x)
        out[base + (x - lb)] = static_cast<int>(x);
    }
    for (int x = written + threadIdx.x; x < p.max_per_head; x += blockDim.x) out[x] = -1;
    if (threadIdx.x == 0) p.out_count[pair] = written;
  }
}

}  // namespace

void launch_merge(int stage, const Params& p, int pairs, std::size_t smem, cudaStream_t st) {
  // The bitmaps (one bit per page, or per candidate token) past 48 KB: the limit raised once
  // to the largest asked.
  static std::size_t raised1 = 0, raised2 = 0;
  std::size_t& raised = stage == 1 ? raised1 : raised2;
  if (smem > 48 * 1024 && smem > raised) {
    if (stage == 1) {
      detail::set_dynamic_smem(merge_kernel<1>, smem,
                               "the two-stage page merge kernel (max_pages_per_seq)");
    } else {
      detail::set_dynamic_smem(merge_kernel<2>, smem, "the two-stage token merge kernel");
    }
    raised = smem;
  }
  if (stage == 1) {
    merge_kernel<1><<<static_cast<unsigned>(pairs), kThreads, smem, st>>>(p);
  } else {
    merge_kernel<2><<<static_cast<unsigned>(pairs), kThreads, smem, st>>>(p);
  }
  detail::check_cuda(cudaGetLastError(), stage == 1 ? "two-stage page merge kernel"
                                                    : "two-stage token merge kernel");
}

}  // namespace masskv::cuda::two_stage_impl
