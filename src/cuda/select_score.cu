// Page (or group) scoring, the first kernel of every selection: quest_score_kernel runs the
// scan of select_score.cuh, a CTA per chunk of one (sequence, kv head)'s pages. Host: its plan
// (the warps and shared memory that fit, cached per shape; the pages a CTA takes; the plain or
// the fully unrolled kernel).
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>

#include "select_common.cuh"
#include "select_score.cuh"

namespace masskv::cuda::select_impl {
namespace {

// grid (chunks, kv heads, batch), blockDim = 32 * warps (warps <= kScoreMaxWarps, planned on the
// host from the shared memory that fits). Chunk c: pages [c·chunk_pages, +chunk_pages), or in
// list mode entries [c·chunk_pages/16, +chunk_pages/16) of the pair's tile list. kHot: the plan
// gives a warp many tiles (ScorePlan::fn_hot).
template <int kD, bool kU8, bool kHot>
__global__ void __launch_bounds__(kScoreMaxWarps * 32) quest_score_kernel(SelParams p) {
  extern __shared__ uint4 smem_raw[];
  const int chunk = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  detail::stamp(p.stamps, p.stamp_score, 0);
  // Launched by programmatic dependent launch after the group top-k (hier_select's page pass):
  // nothing is read before the predecessor is done (a no-op after a plain launch). Then the
  // top-k may launch: its CTAs wait on the device for this grid, with no launch gap between
  // (docs/gpu-results.md, tuning notes).
  detail::wait_for_predecessor();
  detail::allow_dependents();
  const int n = seq_pages(p, b);
  const std::int64_t slot = static_cast<std::int64_t>(b) * p.num_kv_heads + h;
  const std::int32_t* list = p.tile_ids != nullptr ? p.tile_ids + slot * p.tile_stride : nullptr;
  const int j0 = list != nullptr ? chunk * (p.chunk_pages / kWarpPages) : chunk * p.chunk_pages;
  const int j_end = list != nullptr ? (n < 0 ? 0 : min(p.tile_count[slot], p.tile_stride)) : n;
  const int j1 = list != nullptr ? min(j_end, j0 + p.chunk_pages / kWarpPages)
                                 : min(n, j0 + p.chunk_pages);
  score_tiles<kD, kU8, kHot>(p, reinterpret_cast<unsigned char*>(smem_raw), b, h, n, list, j0,
                             j1);
  detail::stamp(p.stamps, p.stamp_score, stamps::kExit);
}

}  // namespace

ScorePlan score_plan(int d, int group, bool u8) {
  static std::mutex mu;
  static bool ready[2][3] = {};
  static ScorePlan cache[2][3][kMaxGroupDims / 64 + 1];  // group <= kMaxGroupDims / head_dim
  const int idx = d == 64 ? 0 : d == 128 ? 1 : 2;
  const int e = u8 ? 1 : 0;
  const ScoreFn fns[2][2][3] = {
      {{quest_score_kernel<64, false, false>, quest_score_kernel<128, false, false>,
        quest_score_kernel<256, false, false>},
       {quest_score_kernel<64, true, false>, quest_score_kernel<128, true, false>,
        quest_score_kernel<256, true, false>}},
      {{quest_score_kernel<64, false, true>, quest_score_kernel<128, false, true>,
        quest_score_kernel<256, false, true>},
       {quest_score_kernel<64, true, true>, quest_score_kernel<128, true, true>,
        quest_score_kernel<256, true, true>}}};
  std::lock_guard<std::mutex> lock(mu);
  const std::size_t optin = detail::smem_optin();  // the kernels hold no static arrays
  if (!ready[e][idx]) {
    for (int hot = 0; hot < 2; ++hot)
      detail::set_dynamic_smem(fns[hot][e][idx], optin, "the Quest scoring kernel");
    ready[e][idx] = true;
  }
  if (cache[e][idx][group].fn != nullptr) return cache[e][idx][group];
  const ScoreSizes sz = score_sizes(d, u8, group);
  const std::size_t room = optin > sz.q_bytes ? optin - sz.q_bytes : 0;
  ScorePlan plan;
  plan.fn = fns[0][e][idx];
  plan.fn_hot = fns[1][e][idx];
  plan.warps = static_cast<int>(std::min<std::size_t>(kScoreMaxWarps, room / sz.warp_bytes));
  require(plan.warps >= 1, ErrorCode::unsupported, "q",
          "the scoring kernel's shared memory does not fit this device for group ", group,
          " and head_dim ", d);
  plan.smem = sz.bytes(plan.warps);
  // The chunk plan counts on the fewer resident CTAs of the two (registers may differ).
  int ctas = 0, ctas_hot = 0;
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, plan.fn, plan.warps * 32,
                                                           plan.smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(score)");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_hot, plan.fn_hot,
                                                           plan.warps * 32, plan.smem),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor(score)");
  plan.ctas_per_sm = std::max(1, std::min(ctas, ctas_hot));
  cache[e][idx][group] = plan;
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
