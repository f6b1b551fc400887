// Hierarchical top-p (select::hier_top_p) on the GPU: after hier_select's group stage,
// top_p_weights_kernel and hier_top_p_kernel replace the page pass (masses estimated from the
// pages' summaries, the heaviest taken until their mass reaches p, at most the budget).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "block_select.cuh"
#include "group_tau.cuh"
#include "select_common.cuh"

namespace masskv::cuda::select_impl {
namespace {

// Item `it` of (sequence, kv head): kept pages first (sinks [0, s0), window [window, n)), then
// the chosen groups' pages of [sinks, window) in id order (none when nothing is to be taken).
struct TopPItems {
  int s0, window, kept, m, sinks;
  const std::int32_t* gids;
  __device__ int page(int it) const {
    if (it < kept) return it < s0 ? it : window + (it - s0);
    const int ci = it - kept;
    if (ci >= m) return -1;
    const int j = gids[ci / kWarpPages] * kWarpPages + ci % kWarpPages;
    return j >= sinks && j < window ? j : -1;
  }
};
__device__ TopPItems top_p_items(const SelParams& p, const TopkSplit& sp, const std::int32_t* gids,
                                 const std::int32_t* gcount, int gstride, std::int64_t slot) {
  TopPItems r;
  r.sinks = sp.sinks;
  r.window = sp.window;
  r.s0 = min(sp.sinks, sp.window);
  r.kept = r.s0 + (sp.n - sp.window);
  r.m = sp.total > sp.kept ? min(gcount[slot], gstride) * kWarpPages : 0;
  r.gids = gids + slot * gstride;
  return r;
}

// grid (ceil(items / 32), kv heads, batch): an octet of lanes per item computes, for every q
// head of the group, log n + m + v/2 of the item's page from its summaries (octet_moments: the
// CPU's m and v bits). Spread over the GPU: one CTA per (sequence, kv head) doing this in
// turn was slow (docs/gpu-results.md, tuning notes).
template <int kD>
__global__ void __launch_bounds__(kHierThreads) top_p_weights_kernel(SelParams p, TopPParams t,
                                                                     const std::int32_t* gids,
                                                                     const std::int32_t* gcount,
                                                                     int gstride) {
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  detail::wait_for_predecessor();  // the group top-k's lists
  const TopkSplit sp = topk_split_of(p, b, false);
  if (sp.bad || sp.n == 0) return;
  const TopPItems items = top_p_items(p, sp, gids, gcount, gstride, slot);
  const int it = blockIdx.x * (kHierThreads / 8) + tid / 8;
  if (it >= items.kept + items.m || it >= t.items) return;  // whole octets
  const int j = items.page(it);
  const int g = p.group;
  double* lw = t.lw + (slot * t.items + it) * g;
  if (tid % 8 == 0) t.item_page[slot * t.items + it] = j;
  if (j < 0) return;
  const int phys = p.indices[p.indptr[b] + j];
  const bool ok = phys >= 0 && phys < t.pool;
  if (!ok && tid % 8 == 0) atomicOr(p.err, kBadPhysical);
  const int cnt = ok ? t.count[phys] : 0;
  const std::int64_t row = (static_cast<std::int64_t>(ok ? phys : 0) * p.num_kv_heads + h) * kD;
  for (int i = 0; i < g; ++i) {
    double m, v;
    detail::octet_moments<kD>(t.mean + row, t.m2 + row, p.q + b * p.q_s0 + (h * g + i) * p.q_s1,
                              static_cast<double>(cnt), t.scale, m, v);
    if (tid % 8 == 0)
      lw[i] = cnt > 0 ? __dadd_rn(__dadd_rn(log(static_cast<double>(cnt)), m), 0.5 * v)
                      : -INFINITY;
  }
}

// Descending bitonic sort of n (a power of two) keys in shared memory by the CTA.
__device__ void block_sort_desc(unsigned long long* keys, int n) {
  for (int size = 2; size <= n; size <<= 1)
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      __syncthreads();
      for (int i = threadIdx.x; i < n / 2; i += blockDim.x) {
        const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
        const bool desc = (lo & size) == 0;
        const unsigned long long a = keys[lo], c = keys[hi];
        if ((a < c) == desc) {
          keys[lo] = c;
          keys[hi] = a;
        }
      }
    }
  __syncthreads();
}

// One CTA per (sequence, kv head): log Z per q head (a warp's log-sum-exp over the moment
// groups), each item's mass mean_h exp(lw_h - log Z_h) (select::hier_top_p's operations and
// order), the kept pages' masses summed in page order, the candidates keyed (float mass,
// ~position), the top `need` found by radix selection and sorted, then one thread takes them
// while the count is below p (the CPU's additions in the CPU's order: the same decisions on the
// same masses), and the list is written ascending.
__global__ void __launch_bounds__(kHierThreads) hier_top_p_kernel(SelParams p, TopPParams t,
                                                                  const std::int32_t* gids,
                                                                  const std::int32_t* gcount,
                                                                  int gstride) {
  // Sized by the chosen groups' pages, cap = gstride * kWarpPages (<= kHierCand; top_p_smem):
  // [cap] candidate keys, then flags; [pow2_ceil(cap)] the top ones, sorted; [cap] masses.
  extern __shared__ unsigned long long s_dyn[];
  const int cap = gstride * kWarpPages;
  unsigned long long* s_key = s_dyn;
  unsigned long long* s_sel = s_key + cap;
  double* s_mass = reinterpret_cast<double*>(s_sel + pow2_ceil(cap));
  __shared__ double s_logz[kMaxGroupDims / 64];
  __shared__ int s_hist[256], s_pick[3], s_warp[kHierThreads / 32], s_taken;
  const int h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  std::int32_t* out = p.out_ids + slot * p.max_per_head;
  detail::wait_for_predecessor();  // the weights
  const TopkSplit sp = topk_split_of(p, b, tid == 0);
  const int n = sp.n, g = p.group;
  if (sp.bad || n == 0) {
    for (int i = tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
    if (tid == 0) p.out_count[slot] = 0;
    return;
  }
  const TopPItems items = top_p_items(p, sp, gids, gcount, gstride, slot);
  const int Hq = p.num_kv_heads * g;
  // A moment table the moments kernel flagged ("moment_indptr") counts as no groups here.
  const int mbegin = t.mindptr[b], mend = t.mindptr[b + 1];
  const int ng = mbegin >= 0 && mend >= mbegin && mend <= t.mnnz && mend - mbegin <= t.mv_stride
                     ? mend - mbegin
                     : 0;
  for (int i = warp; i < g; i += kHierThreads / 32) {
    const double* mv = t.mv + (static_cast<std::int64_t>(b) * Hq + h * g + i) * t.mv_stride * 2;
    const auto term = [&](int G) {
      const int ms = t.mindices[mbegin + G];
      const int cnt = ms >= 0 && ms < t.mslots ? t.mcount[ms] : 0;
      return cnt > 0 ? __dadd_rn(__dadd_rn(log(static_cast<double>(cnt)), mv[2 * G]),
                                 0.5 * mv[2 * G + 1])
                     : -INFINITY;
    };
    double mx = -INFINITY;
    for (int G = lane; G < ng; G += 32) mx = fmax(mx, term(G));
    for (int o = 16; o > 0; o >>= 1) mx = fmax(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0;
    for (int G = lane; G < ng; G += 32) {
      const double x = term(G);
      sum += x == -INFINITY ? 0.0 : exp(x - mx);
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if (lane == 0) s_logz[i] = mx + log(sum);
  }
  __syncthreads();
  double* masses = t.masses != nullptr ? t.masses + slot * p.max_pages : nullptr;
  const auto mass_of = [&](int it) {
    const double* lw = t.lw + (slot * t.items + it) * g;
    double agg = 0;
    for (int i = 0; i < g; ++i)
      agg = __dadd_rn(agg, __ddiv_rn(exp(__dsub_rn(lw[i], s_logz[i])), static_cast<double>(g)));
    return agg;
  };
  // Kept pages: thread 0 sums their masses in page order (few: the sinks and the window).
  double held = 0;
  if (tid == 0)
    for (int it = 0; it < items.kept; ++it) {
      const double mk = t.item_page[slot * t.items + it] >= 0 ? mass_of(it) : 0.0;
      held += mk;
      if (masses) masses[items.page(it)] = mk;
    }
  // Candidates: position ci = item - kept, in id order.
  const int m = items.m;
  int keyed = 0;
  for (int ci = tid; ci < m; ci += kHierThreads) {
    const int j = t.item_page[slot * t.items + items.kept + ci];
    const double mass = j >= 0 ? mass_of(items.kept + ci) : 0.0;
    s_mass[ci] = mass;
    s_key[ci] = j >= 0 ? (static_cast<unsigned long long>(ordered_key(static_cast<float>(mass)))
                          << 32) | static_cast<std::uint32_t>(~ci)
                       : 0ull;
    keyed += j >= 0;
    if (j >= 0 && masses) masses[j] = mass;
  }
  int all_keyed = 0;
  block_select::exclusive_scan<kHierThreads>(keyed, s_warp, all_keyed);  // also a barrier
  const int need = max(sp.total - sp.kept, 0);
  const int nsel = min(need, all_keyed);
  if (nsel > 0) {
    const unsigned long long thr =
        block_select::radix_threshold<kHierThreads>(s_key, m, nsel, s_hist, s_pick);
    block_select::ordered_compact<kHierThreads>(
        m, s_warp, [&](int i) { return s_key[i] >= thr; },
        [&](int i, int r) { s_sel[r] = s_key[i]; });
    const int pow2 = pow2_ceil(nsel);
    for (int i = nsel + tid; i < pow2; i += kHierThreads) s_sel[i] = 0ull;
    block_sort_desc(s_sel, pow2);
  }
  if (tid == 0) {
    int taken = 0;
    while (taken < nsel && held < t.p)
      held += s_mass[~static_cast<std::uint32_t>(s_sel[taken++])];
    s_taken = taken;
  }
  __syncthreads();
  const int taken = s_taken;
  // Flag the taken positions in s_key's space (0: not taken), then write in id order.
  for (int i = tid; i < m; i += kHierThreads) s_key[i] = 0ull;
  __syncthreads();
  for (int e = tid; e < taken; e += kHierThreads)
    s_key[~static_cast<std::uint32_t>(s_sel[e])] = 1ull;
  __syncthreads();
  const int s0 = items.s0, window = items.window, total = items.kept + taken;
  for (int j = tid; j < s0; j += kHierThreads) out[j] = j;
  for (int j = window + tid; j < n; j += kHierThreads) out[s0 + taken + (j - window)] = j;
  for (int i = total + tid; i < p.max_per_head; i += kHierThreads) out[i] = -1;
  if (tid == 0) p.out_count[slot] = total;
  if (taken == 0) return;
  block_select::ordered_compact<kHierThreads>(
      m, s_warp, [&](int i) { return s_key[i] != 0ull; },
      [&](int i, int r) { out[s0 + r] = t.item_page[slot * t.items + items.kept + i]; });
}

}  // namespace

// The dynamic shared memory hier_top_p_kernel may use, its limit raised once: kHierCand
// candidates' worth, or what the device leaves (an sm_80 GPU: about 6000 candidates).
std::size_t top_p_room() {
  static const std::size_t room = [] {
    const std::size_t r = std::min(top_p_smem(kHierCand / kWarpPages),
                                   detail::dynamic_smem_room(hier_top_p_kernel));
    detail::set_dynamic_smem(hier_top_p_kernel, r, "the top-p selection");
    return r;
  }();
  return room;
}

// hier_top_p's page pass: the weights over the GPU, then the selection per (sequence, kv head)
// (both by programmatic dependent launch, as the page top-k).
void launch_hier_top_p(const SelParams& p, const TopPParams& t, int d, const std::int32_t* gids,
                       const std::int32_t* gcount, int gstride, dim3 grid, cudaStream_t stream) {
  using Fn = void (*)(SelParams, TopPParams, const std::int32_t*, const std::int32_t*, int);
  const Fn weights = d == 64 ? top_p_weights_kernel<64>
                     : d == 128 ? top_p_weights_kernel<128>
                                : top_p_weights_kernel<256>;
  detail::PdlLaunch lw(stream, dim3((t.items + kHierThreads / 8 - 1) / (kHierThreads / 8), grid.y,
                                    grid.z),
                       dim3(kHierThreads));
  check_cuda(cudaLaunchKernelEx(&lw.cfg, weights, p, t, gids, gcount, gstride),
             "top-p weights kernel launch");
  detail::PdlLaunch l(stream, grid, dim3(kHierThreads), top_p_smem(gstride));
  check_cuda(cudaLaunchKernelEx(&l.cfg, hier_top_p_kernel, p, t, gids, gcount, gstride),
             "hier top-p kernel launch");
}

}  // namespace masskv::cuda::select_impl
