// Page (or group) scoring, the first kernel of every selection: score_kernel<S> runs the scan
// of select_score.cuh for a device scorer S, a CTA per chunk of one (sequence, kv head)'s pages.
// Here: the library's scorer's kernels (the page bound, select_page_bound.cuh) and, for any
// scorer, its plan (the warps and shared memory that fit, cached per kernel and group; the
// pages a CTA takes; the plain or the fully unrolled kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "select_common.cuh"
#include "select_page_bound.cuh"
#include "select_score.cuh"

namespace masskv::cuda::select_impl {

template <int kD, bool kU8>
ScanKernels page_bound_scan_of() {
  return scan_kernels<PageBound<kD, kU8, false>, PageBound<kD, kU8, true>>();
}

ScanKernels page_bound_scan(int d, bool u8) {
  static const ScanKernels k[2][3] = {
      {page_bound_scan_of<64, false>(), page_bound_scan_of<128, false>(),
       page_bound_scan_of<256, false>()},
      {page_bound_scan_of<64, true>(), page_bound_scan_of<128, true>(),
       page_bound_scan_of<256, true>()}};
  return k[u8 ? 1 : 0][d == 64 ? 0 : d == 128 ? 1 : 2];
}

ScorePlan score_plan(const ScanKernels& k, int group) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, ScorePlan> cache;  // by (kernel, group)
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<const void*, int> key{reinterpret_cast<const void*>(k.fn), group};
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const std::size_t optin = detail::smem_optin();  // the kernels hold no static arrays
  detail::set_dynamic_smem(k.fn, optin, "the selection's scoring kernel");
  if (k.fn_hot != k.fn) detail::set_dynamic_smem(k.fn_hot, optin, "the selection's scoring kernel");
  const std::size_t qb = k.query_bytes(group);
  const std::size_t room = optin > qb ? optin - qb : 0;
  ScorePlan plan;
  plan.fn = k.fn;
  plan.fn_hot = k.fn_hot;
  plan.warps = k.warp_bytes == 0
                   ? kScoreMaxWarps
                   : static_cast<int>(std::min<std::size_t>(kScoreMaxWarps, room / k.warp_bytes));
  require(plan.warps >= 1 && qb <= optin, ErrorCode::unsupported, "q",
          "the scoring kernel's shared memory does not fit this device: group ", group, " needs ",
          qb, " bytes of queries plus ", k.warp_bytes, " a warp, of the ", optin, " a block may have");
  plan.smem = k.bytes(plan.warps, group);
  // The chunk plan counts on the fewer resident CTAs of the two (registers may differ).
  int ctas = 0, ctas_hot = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, plan.fn, plan.warps * 32,
                                                           plan.smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(score)");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_hot, plan.fn_hot,
                                                           plan.warps * 32, plan.smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(score)");
  plan.ctas_per_sm = std::max(1, std::min(ctas, ctas_hot));
  if (cache.size() >= 1024) cache.clear();
  cache[key] = plan;
  return plan;
}

// One wave: the (sequence, kv head) pairs split into as many chunks as resident CTA slots
// allow (each CTA's warps then stream many tiles through their pipelines); chunks of whole
// kChunkAlign pages. With more pairs than slots, one chunk per pair.
int plan_score_chunk(int pairs, int max_pages, int ctas_per_sm) {
  const int slots = std::max(1, device_sms() * ctas_per_sm);
  const int chunks = std::max(1, slots / std::max(1, pairs));
  int cp = (max_pages + chunks - 1) / chunks;
  cp = (cp + kChunkAlign - 1) / kChunkAlign * kChunkAlign;
  return std::max(cp, kChunkAlign);
}

// The scoring kernel for the chunk p.chunk_pages (pages, or 16 × list entries a CTA): the
// unrolled one where each warp has hot_tiles tiles or more (SelectLaunch::score_hot_tiles:
// from there the unrolled kernel is faster).
void set_score_kernel(Prepared& pr, int hot_tiles) {
  const int tiles = (pr.p.chunk_pages / kWarpPages + pr.plan.warps - 1) / pr.plan.warps;
  pr.score = tiles >= hot_tiles ? pr.plan.fn_hot : pr.plan.fn;
}

}  // namespace masskv::cuda::select_impl
