// The selection's workspace and plan: SelectWorkspace's buffers and error check, the
// output capacity (select_capacity), and prepare, which checks a flat selection's arguments
// and plans its scoring and top-k launches (every entry point of select.cu starts there).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "select_common.cuh"

namespace masskv::cuda {

using namespace select_impl;

SelectWorkspace::SelectWorkspace() : impl_(std::make_unique<Impl>()) {}

SelectWorkspace::~SelectWorkspace() = default;

std::span<const std::uint32_t> SelectWorkspace::page_keys() const {
  return {impl_->keys.data(), impl_->keys_used};
}
int SelectWorkspace::keys_stride() const { return impl_->stride; }
std::span<const std::uint32_t> SelectWorkspace::group_keys() const {
  return {impl_->gkeys.data(), impl_->gkeys_used};
}
int SelectWorkspace::group_keys_stride() const { return impl_->gstride; }
std::span<const std::int32_t> SelectWorkspace::group_ids() const {
  return {impl_->gids.data(), impl_->gids_used};
}
bool SelectWorkspace::last_hier_fused() const { return impl_->hier_fused; }
std::span<const std::int32_t> SelectWorkspace::group_counts() const {
  return {impl_->gcount.data(), impl_->gcount_used};
}
int SelectWorkspace::group_list_stride() const { return impl_->glist_stride; }
std::span<const double> SelectWorkspace::tau() const {
  return {impl_->tau.data(), impl_->tau_used};
}

void SelectWorkspace::check(CUstream_st* stream) const {
  const unsigned flag = impl_->err.take(stream, "select step");
  if (flag == 0) return;
  if (flag & kBadPhysical)
    fail(ErrorCode::out_of_range, "indices",
         "a page id outside [0, bounds.num_pages) was met on the GPU");
  if (flag & kBadIndptr)
    fail(ErrorCode::out_of_range, "indptr",
         "decreasing, past indices.size(), or a sequence longer than "
         "SelectLaunch::max_pages_per_seq");
  if (flag & kBadLastLen)
    fail(ErrorCode::out_of_range, "last_page_len", "a value outside [1, page_size] on the GPU");
  if (flag & kBadMomentSlot)
    fail(ErrorCode::out_of_range, "moment_indices",
         "a moment group slot outside the moment store was met on the GPU");
  if (flag & kBadMomentIndptr)
    fail(ErrorCode::out_of_range, "moment_indptr",
         "decreasing, past moment_indices.size(), or more groups than max_pages_per_seq needs");
  if (flag & kBadSelection)
    fail(ErrorCode::invalid_argument, "selection",
         "a list that is not ascending, or holds a page beyond its sequence, was met on the GPU");
  if (flag & kBadListCapacity)
    fail(ErrorCode::invalid_argument, "max_per_list",
         "an engine page list holds more pages than the output's lists (engine_pages)");
  if (flag & kBadCapacity)
    fail(ErrorCode::shape_mismatch, "max_per_head",
         "a selection holds more pages than the output lists (see select_capacity)");
  fail(ErrorCode::non_finite, "q", "a page bound is NaN (non-finite q or summaries)");
}

int select_capacity(int max_pages_per_seq, int page_size, const select::TopkPolicy& policy) {
  check_policy(policy);
  require(page_size >= 1, ErrorCode::invalid_argument, "page_size", "must be >= 1");
  const int n = std::max(0, max_pages_per_seq);
  const std::int64_t window_pages =
      policy.window_tokens > 0
          ? (static_cast<std::int64_t>(policy.window_tokens) + page_size - 1) / page_size + 1
          : 1;
  const std::int64_t kept =
      std::min<std::int64_t>(n, static_cast<std::int64_t>(policy.sink_pages) + window_pages);
  return static_cast<int>(
      std::min<std::int64_t>(n, std::max<std::int64_t>(policy.budget_pages, kept)));
}

namespace select_impl {

void check_policy(const select::TopkPolicy& pol) {
  using enum ErrorCode;
  require(pol.budget_pages >= 0, invalid_argument, "budget_pages", "must be >= 0, got ",
          pol.budget_pages);
  require(pol.sink_pages >= 0, invalid_argument, "sink_pages", "must be >= 0, got ",
          pol.sink_pages);
  require(pol.window_tokens >= 0, invalid_argument, "window_tokens", "must be >= 0, got ",
          pol.window_tokens);
}

Prepared prepare(const QuestSelectArgs& a, const SelectLaunch& launch, bool outputs,
                 KeyLevel level, const ScanKernels* scan) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const bool u8 = a.bounds8.min != nullptr;
  // The store's shape and pointers, whichever it is.
  struct {
    const void *min, *max;
    int num_pages, num_kv_heads, head_dim;
  } s = u8 ? decltype(s){a.bounds8.min, a.bounds8.max, a.bounds8.num_pages, a.bounds8.num_kv_heads,
                         a.bounds8.head_dim}
           : decltype(s){a.bounds.min, a.bounds.max, a.bounds.num_pages, a.bounds.num_kv_heads,
                         a.bounds.head_dim};
  const int d = s.head_dim;
  require(d == 64 || d == 128 || d == 256, unsupported, "head_dim",
          "the CUDA selector serves head_dim 64, 128, 256; got ", d);
  require(s.min != nullptr && s.max != nullptr && s.num_pages > 0 && s.num_kv_heads > 0,
          invalid_argument, "bounds", "null min/max or empty store");
  const auto aligned16 = [](const void* ptr) {
    return reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  };
  require(aligned16(s.min) && aligned16(s.max), invalid_argument, "bounds",
          "min and max must be 16-byte aligned");
  require(!u8 || (a.bounds8.grid != nullptr &&
                  reinterpret_cast<std::uintptr_t>(a.bounds8.grid) % 8 == 0),
          invalid_argument, "bounds", "the 8-bit store needs its grid, 8-byte aligned");
  const int B = a.q.n0, Hq = a.q.n1, Hkv = s.num_kv_heads;
  require(a.q.data != nullptr && a.q.n2 == d && B >= 0, shape_mismatch, "q",
          "must be [batch][q heads][head_dim] with the store's head_dim");
  require(Hq > 0 && Hq % Hkv == 0, shape_mismatch, "q", "q heads (", Hq,
          ") must be a multiple of the kv heads (", Hkv, ")");
  const int group = Hq / Hkv;
  require(static_cast<std::int64_t>(group) * d <= kMaxGroupDims, unsupported, "q",
          "group * head_dim must be <= ", kMaxGroupDims);
  require(a.table.indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch, "indptr",
          "needs batch + 1 entries (batch from q)");
  require(a.table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs batch entries");
  require(a.page_size >= 1, invalid_argument, "page_size", "must be >= 1, got ", a.page_size);
  check_policy(a.policy);
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  require(launch.chunk_pages >= 0 && launch.chunk_pages % kChunkAlign == 0,
          invalid_argument, "chunk_pages", "must be 0 or a multiple of ", kChunkAlign);
  require(launch.score_hot_tiles >= 1, invalid_argument, "score_hot_tiles", "must be >= 1, got ",
          launch.score_hot_tiles);
  const int forced_cluster = launch.topk_cluster;
  require(forced_cluster == 0 || forced_cluster == 1 || forced_cluster == 2 ||
              forced_cluster == 4 || forced_cluster == 8,
          invalid_argument, "topk_cluster", "must be 0, 1, 2, 4 or 8, got ", forced_cluster);
  if (outputs) {
    require(a.max_per_head >= 0, invalid_argument, "max_per_head", "must be >= 0");
    require(a.ids.size() == static_cast<std::size_t>(B) * Hkv * a.max_per_head &&
                (a.ids.data() != nullptr || a.ids.empty()),
            shape_mismatch, "ids", "needs batch * kv heads * max_per_head entries");
    require(a.count.size() == static_cast<std::size_t>(B) * Hkv, shape_mismatch, "count",
            "needs batch * kv heads entries");
  }
  const float scale = a.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : a.scale;
  require(std::isfinite(scale) && scale > 0, invalid_argument, "scale",
          "must be finite and > 0, got ", a.scale);

  const ScorePlan splan = score_plan(scan != nullptr ? *scan : page_bound_scan(d, u8), group);
  Prepared pr;
  SelParams& p = pr.p;
  p.q = a.q.data;
  p.q_s0 = a.q.s0;
  p.q_s1 = a.q.s1;
  p.mn = reinterpret_cast<const std::uint16_t*>(s.min);
  p.mx = reinterpret_cast<const std::uint16_t*>(s.max);
  p.grid = u8 ? a.bounds8.grid : nullptr;
  p.pool_pages = s.num_pages;
  p.num_kv_heads = Hkv;
  p.group = group;
  p.page_size = a.page_size;
  p.indptr = a.table.indptr.data();
  p.indices = a.table.indices.data();
  require(a.table.indices.size() <= static_cast<std::size_t>(INT32_MAX), shape_mismatch, "indices",
          "more than 2^31 - 1 entries");
  p.nnz = static_cast<int>(a.table.indices.size());
  p.last_len = a.table.last_page_len.data();
  p.scale = scale;
  p.slack_f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
  p.max_pages = launch.max_pages_per_seq;
  p.chunk_pages = launch.chunk_pages > 0 ? launch.chunk_pages
                                         : plan_score_chunk(B * Hkv, launch.max_pages_per_seq,
                                                            splan.ctas_per_sm);
  p.budget = a.policy.budget_pages;
  p.sinks = a.policy.sink_pages;
  p.window_tokens = a.policy.window_tokens;
  p.max_per_head = a.max_per_head;
  p.out_ids = a.ids.data();
  p.out_count = a.count.data();

  SelectWorkspace::Impl& ws = launch.workspace->impl();
  const std::size_t nkeys = static_cast<std::size_t>(B) * Hkv * launch.max_pages_per_seq;
  if (level == KeyLevel::pages) {
    ws.keys.reserve(nkeys, "cudaMalloc(page keys)");
    ws.keys_used = nkeys;
    ws.stride = launch.max_pages_per_seq;
    p.keys = ws.keys.data();
  } else {
    ws.gkeys.reserve(nkeys, "cudaMalloc(group keys)");
    ws.gkeys_used = nkeys;
    ws.gstride = launch.max_pages_per_seq;
    p.keys = ws.gkeys.data();
  }
  p.err = ws.err.get();
  p.stamps = launch.phase_stamps;
  p.stamp_score = level == KeyLevel::pages ? stamps::page_score : stamps::group_score;

  const int chunks = (launch.max_pages_per_seq + p.chunk_pages - 1) / p.chunk_pages;
  require(B <= 65535, unsupported, "q", "batch must be <= 65535");
  require(Hkv <= 65535, unsupported, "bounds", "num_kv_heads must be <= 65535");
  pr.score_grid = dim3(chunks, Hkv, B);
  // The block kernel where one CTA per pair is the plan; clusters where the plan splits a
  // pair's pages (long sequences), where they beat it (docs/gpu-results.md, tuning notes).
  // Before sm_90 (no clusters) the block kernel serves every length.
  const bool cluster = launch.topk_kernel == SelectLaunch::TopkKernel::cluster;
  require(detail::hopper_paths() || !cluster, unsupported, "topk_kernel",
          "the cluster top-k needs sm_90 (thread-block clusters)");
  const int planned = !detail::hopper_paths() ? 1
                      : forced_cluster != 0   ? forced_cluster
                                            : plan_topk_cluster(B * Hkv, launch.max_pages_per_seq);
  pr.block_topk = !cluster && planned == 1;
  const int tc = pr.block_topk ? 1 : planned;
  pr.topk_grid = dim3(tc, Hkv, B);
  pr.topk = pr.block_topk ? block_topk_kernel() : topk_kernel(tc);
  pr.plan = splan;
  set_score_kernel(pr, launch.score_hot_tiles);
  pr.score_threads = splan.warps * 32;
  pr.smem = splan.smem;
  // A CTA's slice of the candidates (whole warps), cached up to key_cache_cap() keys.
  const int slice = (launch.max_pages_per_seq + tc * 32 - 1) / (tc * 32) * 32;
  p.key_cache = std::min(slice, key_cache_cap());
  pr.topk_smem = sizeof(std::uint32_t) * static_cast<std::size_t>(p.key_cache);
  return pr;
}

}  // namespace select_impl
}  // namespace masskv::cuda
