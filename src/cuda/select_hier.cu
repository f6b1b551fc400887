// The page level of hier_select (include/masskv/cuda/select.hpp). The separate path is four
// launches: score groups (select_score.cu, on the group store), block top-k of groups
// (select_topk.cu; writes the mask), score pages (only the chosen groups' tiles), and
// hier_page_topk_kernel here, which ranks only the chosen groups' pages (the flat top-k
// kernels when the groups' pages exceed kHierCand); with moments its keys may drop pages (the
// adaptive rule). Or, with SelectLaunch::HierKernel::fused, hier_fused_kernel (select_hier.cuh)
// does all four in one launch (a cluster per (sequence, kv head)). Both take the scorers of a
// HierScorer; page_bound_hier is the library's.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <map>
#include <mutex>
#include <tuple>

#include "select_common.cuh"
#include "select_hier.cuh"
#include "select_page_bound.cuh"

namespace masskv::cuda::select_impl {
namespace {

__global__ void __launch_bounds__(kHierThreads) hier_page_topk_kernel(SelParams p,
                                                                      const std::int32_t* gids,
                                                                      const std::int32_t* gcount,
                                                                      int gstride) {
  extern __shared__ unsigned long long s_cand[];  // [gstride * kWarpPages]
  __shared__ int s_hist[256], s_pick[3], s_warp[kHierThreads / 32];
  const int h = blockIdx.y, b = blockIdx.z;
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  detail::stamp(p.stamps, p.stamp_score + 1, 0);
  // The split reads the page table only, written before this step's first (plain) launch:
  // before the wait, so its round trip overlaps the predecessor's tail.
  const TopkSplit sp = topk_split_of(p, b, threadIdx.x == 0);
  detail::wait_for_predecessor();
  // The group list's lines into L1 now: its address needs no load, while its first use waits
  // for the count (gathering the candidates took ~2 µs after the wait, profile-phases).
  detail::prefetch_l1_lines(gids + slot * gstride, gids + (slot + 1) * gstride, threadIdx.x,
                            kHierThreads);
  detail::stamp(p.stamps, p.stamp_score + 1, 1);
  detail::allow_dependents();  // the decode launches now and waits on the device (as above)
  hier_page_topk(p, b, h, sp, gids + slot * gstride, min(gcount[slot], gstride), s_cand, s_hist,
                 s_pick, s_warp);
  detail::stamp(p.stamps, p.stamp_score + 1, stamps::kExit);
}

constexpr int kFusedMaxCtas = 8;  // CTAs per (sequence, kv head): a portable cluster

// hier_fused_plan (select_common.cuh) uncached.
FusedPlan plan_hier_fused(const HierScorer& sc, int group, int max_groups, int gcap, int pairs) {
  FusedPlan f;
  if (!detail::hopper_paths() || sc.fused == nullptr || gcap * kWarpPages > kHierCand) return f;
  const std::size_t region = std::max(
      {sc.groups.bytes(kFusedThreads / 32, group),  // step 0: the group scan
       sc.pages.bytes(kFusedThreads / 32, group),   // step 2: the page scan
       sizeof(unsigned long long) * static_cast<std::size_t>(max_groups),         // step 1
       sizeof(unsigned long long) * static_cast<std::size_t>(gcap) * kWarpPages});  // step 3
  const std::size_t off = (region + 15) / 16 * 16;
  const std::size_t smem = off + sizeof(std::int32_t) * static_cast<std::size_t>(gcap);
  const FusedFn fn = sc.fused;
  const std::size_t dyn_max = detail::dynamic_smem_room(fn);
  if (smem > dyn_max) return f;
  detail::set_dynamic_smem(fn, dyn_max, "the fused hierarchical selection");
  f.fn = fn;
  // Enough CTAs for one scoring warp per tile of the larger scan (group tiles or chosen
  // groups), at most one CTA per SM for all the pairs (B = 16 with 8 kv heads: clusters of 1).
  const int tiles = std::max((max_groups + kWarpPages - 1) / kWarpPages, gcap);
  int c = std::clamp((tiles + kFusedThreads / 32 - 1) / (kFusedThreads / 32), 1, kFusedMaxCtas);
  c = static_cast<int>(std::bit_floor(static_cast<unsigned>(c)));
  while (c > 1 && static_cast<std::int64_t>(pairs) * c > device_sms()) c /= 2;
  // The device must co-schedule one cluster of this size (its CTAs' shared memory).
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg =
      detail::cluster_config(dim3(c), dim3(kFusedThreads), smem, nullptr, attr, c);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, f.fn, &cfg) != cudaSuccess || clusters < 1) {
    (void)cudaGetLastError();
    f.fn = nullptr;
    return f;
  }
  f.ctas = c;
  f.list_off = static_cast<int>(off);
  f.smem = smem;
  return f;
}

}  // namespace

HierScorer page_bound_hier(int d, bool u8) {
  // The fused kernel serves head_dim 64 and 128 (its stages fit the shared memory), groups bf16.
  static const FusedFn fused[2][2] = {
      {fused_kernel<PageBound<64, false>, PageBound<64, false>>(),
       fused_kernel<PageBound<64, false>, PageBound<64, true>>()},
      {fused_kernel<PageBound<128, false>, PageBound<128, false>>(),
       fused_kernel<PageBound<128, false>, PageBound<128, true>>()}};
  return {page_bound_scan(d, false), page_bound_scan(d, u8),
          d == 64 || d == 128 ? fused[d == 128 ? 1 : 0][u8 ? 1 : 0] : nullptr};
}

FusedPlan hier_fused_plan(const HierScorer& sc, int group, int max_groups, int gcap, int pairs) {
  // Cached per device (the shared-memory attribute is set per device): the occupancy query
  // costs host time on every step otherwise. Bounded: shapes that change every step (batch,
  // max pages) start it over now and then.
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mu;
  static std::map<std::tuple<int, const void*, int, int, int, int>, FusedPlan> cache;
  const auto key = std::make_tuple(device, reinterpret_cast<const void*>(sc.fused), group,
                                   max_groups, gcap, pairs);
  std::lock_guard<std::mutex> lock(mu);
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  if (cache.size() >= 256) cache.clear();
  return cache[key] = plan_hier_fused(sc, group, max_groups, gcap, pairs);
}

// One launch: a cluster of f.ctas CTAs per (sequence, kv head).
void launch_hier_fused(const FusedPlan& f, const SelParams& gp, const SelParams& pp,
                       std::int32_t* gids, std::int32_t* gcount, int gstride, int kv_heads,
                       int batch, cudaStream_t stream) {
  cudaLaunchAttribute attr{};
  const cudaLaunchConfig_t cfg = detail::cluster_config(
      dim3(f.ctas, kv_heads, batch), dim3(kFusedThreads), f.smem, stream, attr, f.ctas);
  check_cuda(cudaLaunchKernelEx(&cfg, f.fn, gp, pp, gids, gcount, gstride, f.list_off),
             "hier fused kernel launch");
}

// hier_select's page top-k over the chosen groups' pages (programmatic dependent launch, as
// the block top-k: its prologue overlaps the page scoring's tail).
void launch_hier_page_topk(const SelParams& p, const std::int32_t* gids,
                           const std::int32_t* gcount, int gstride, dim3 grid,
                           cudaStream_t stream) {
  const std::size_t smem = sizeof(unsigned long long) * gstride * kWarpPages;
  static std::once_flag once;
  std::call_once(once, [] {
    detail::set_dynamic_smem(hier_page_topk_kernel, sizeof(unsigned long long) * kHierCand,
                             "the hierarchical page top-k");
  });
  detail::PdlLaunch l(stream, grid, dim3(kHierThreads), smem);
  check_cuda(cudaLaunchKernelEx(&l.cfg, hier_page_topk_kernel, p, gids, gcount, gstride),
             "hier page top-k kernel launch");
}

// How hier_select's page pass finds the chosen groups' pages: walking the group list (list) or
// every tile of the sequence under the group mask (mask). List mode zeroes every page key first
// (one more node), so it pays only on long sequences: list from 16384 pages a sequence
// (docs/gpu-results.md, tuning notes); SelectLaunch::hier_scan may force either (the check
// runs both).
bool hier_list_mode(SelectLaunch::HierScan scan, int max_pages) {
  using enum SelectLaunch::HierScan;
  return scan == list || (scan == automatic && max_pages >= 16384);
}

}  // namespace masskv::cuda::select_impl
