// CUDA Quest selection (docs/design.md §2.3 page bounds, §3 Selection, kept pages): the entry
// points of include/masskv/cuda/select.hpp. A flat selection is two kernels: page scoring
// (select_score.cu: an order-preserving key per page, the CPU bounds' bits) and a top-k
// (select_topk.cu: the kept pages and the best keys, ties to the lower page id, ascending).
// hier_select chains four launches: score groups, block top-k of groups (writes the mask),
// score pages, and the page top-k over the chosen groups (select_hier.cu), or one fused kernel;
// hier_top_p replaces the page pass by masses from the pages' summaries (select_top_p.cu).
// Checks, workspace and launch plans: select_plan.cu; what the rooms share:
// select_common.cuh. Between selections, update_groups (select_groups.cu), update_moments
// (group_tau.cu) and extend_kept (extend_kept.cu) keep the stores and lists current.
// All are deterministic (integer atomics only count; no order depends on timing).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "extend_kept.cuh"
#include "group_tau.cuh"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "select_common.cuh"

namespace masskv::cuda {

using namespace select_impl;

void quest_select(const QuestSelectArgs& a, const SelectLaunch& launch) {
  const Prepared pr = prepare(a, launch, true);
  if (a.q.n0 == 0) return;
  cudaStream_t stream = launch.stream;
  pr.score<<<pr.score_grid, pr.score_threads, pr.smem, stream>>>(pr.p);
  check_cuda(cudaGetLastError(), "quest score kernel launch");
  launch_topk(pr, stream);
  if (launch.check_errors) launch.workspace->check(stream);
}

void quest_score(const QuestSelectArgs& a, const SelectLaunch& launch) {
  const Prepared pr = prepare(a, launch, false);
  if (a.q.n0 == 0) return;
  cudaStream_t stream = launch.stream;
  pr.score<<<pr.score_grid, pr.score_threads, pr.smem, stream>>>(pr.p);
  check_cuda(cudaGetLastError(), "quest score kernel launch");
  if (launch.check_errors) launch.workspace->check(stream);
}

void quest_topk(const QuestSelectArgs& a, const SelectLaunch& launch) {
  const Prepared pr = prepare(a, launch, true);
  if (a.q.n0 == 0) return;
  launch_topk(pr, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

namespace {

// What hier_top_p adds to the hierarchical launch: the page pass becomes hier_top_p_kernel.
struct TopPExtra {
  kv::SummariesView pages;
  double p;
  std::span<double> masses;
};

// hier_select's launches, or hier_top_p's when topp is set (moments kernel only, then the
// group stage, then hier_top_p_kernel instead of the page scan and top-k).
void hier_launch(const HierSelectArgs& h, const SelectLaunch& launch, const TopPExtra* topp,
                 const HierScorer& sc) {
  using enum ErrorCode;
  require(h.groups.num_kv_heads == (h.pages.bounds8.min != nullptr
                                        ? h.pages.bounds8.num_kv_heads
                                        : h.pages.bounds.num_kv_heads),
          shape_mismatch, "groups", "the group store needs the page store's kv heads");
  require(h.group_pages == kWarpPages, unsupported, "group_pages",
          "the CUDA hierarchical selector serves groups of ", kWarpPages, " pages, got ",
          h.group_pages);
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const QuestSelectArgs& a = h.pages;
  const int B = a.q.n0;
  require(h.group_indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch, "group_indptr",
          "needs batch + 1 entries");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int max_groups = (launch.max_pages_per_seq + kWarpPages - 1) / kWarpPages;
  // The group level: the group store over the group table, the last group kept (window 0),
  // the best m - 1 others (m = hier_groups without the per-sequence clamp, which the kernel's
  // min(n, budget) applies).
  QuestSelectArgs ga = a;
  ga.bounds = h.groups;
  ga.bounds8 = {};  // groups are bf16
  ga.table.indptr = h.group_indptr;
  ga.table.indices = h.group_indices;
  ga.policy.budget_pages = select::hier_groups(std::numeric_limits<int>::max(), kWarpPages,
                                               a.policy.budget_pages, h.cover);
  ga.policy.sink_pages = 0;
  ga.policy.window_tokens = 0;
  SelectWorkspace::Impl& ws = launch.workspace->impl();
  ws.hier_fused = false;
  const int gcap = std::min(max_groups, ga.policy.budget_pages);
  const std::size_t nlists = static_cast<std::size_t>(B) * h.groups.num_kv_heads;
  ws.gids.reserve(nlists * gcap, "cudaMalloc(group lists)");
  ws.gcount.reserve(nlists, "cudaMalloc(group counts)");
  ws.gmask.reserve(nlists * max_groups, "cudaMalloc(group mask)");
  ws.gids_used = nlists * gcap;
  ws.gcount_used = nlists;
  ws.glist_stride = gcap;
  ga.max_per_head = gcap;
  ga.ids = {ws.gids.data(), nlists * gcap};
  ga.count = {ws.gcount.data(), nlists};
  SelectLaunch gl = launch;
  gl.max_pages_per_seq = max_groups;
  gl.chunk_pages = 0;
  Prepared gp = prepare(ga, gl, true, KeyLevel::groups, &sc.groups);
  gp.p.out_mask = ws.gmask.data();
  gp.block_topk = true;  // the mask comes from the block kernel
  gp.topk = block_topk_kernel();
  gp.topk_grid = dim3(1, h.groups.num_kv_heads, B);
  gp.p.key_cache = std::min((max_groups + 31) / 32 * 32, key_cache_cap());
  gp.topk_smem = sizeof(std::uint32_t) * static_cast<std::size_t>(gp.p.key_cache);
  // The page level, restricted to the chosen groups' pages (hier_list_mode): the scoring kernel
  // walks the group list (one group a warp; every other page key zeroed first), or every tile
  // of the sequence under the group mask (unchosen tiles: keys 0, nothing read).
  Prepared pp = prepare(a, launch, true, KeyLevel::pages, &sc.pages);
  const bool list_mode = hier_list_mode(launch.hier_scan, launch.max_pages_per_seq);
  if (list_mode) {
    const int list_chunk = pp.score_threads / 32;  // groups per CTA
    pp.p.tile_ids = ws.gids.data();
    pp.p.tile_count = ws.gcount.data();
    pp.p.tile_stride = gcap;
    pp.p.chunk_pages = list_chunk * kWarpPages;
    pp.score_grid.x = (gcap + list_chunk - 1) / list_chunk;
    set_score_kernel(pp, launch.score_hot_tiles);
  } else {
    pp.p.tile_mask = ws.gmask.data();
    pp.p.mask_stride = max_groups;
    pp.score = pp.plan.fn;  // the mask skips most of a warp's tiles: few are scored (not hot)
  }
  // Entmax-aware ranking: τ̂ per (sequence, q head) from the moment store, before any scan.
  // Top-p: the moment groups' m and v only (its normaliser).
  detail::TauParams tp{};
  const bool entmax_rank = h.moments.mean != nullptr && topp == nullptr;
  require(topp == nullptr || h.moments.mean != nullptr, invalid_argument, "moments",
          "top-p needs the pooled moment store");
  if (entmax_rank || topp != nullptr) {
    if (entmax_rank) {
      require(h.alpha == 1.5 || h.alpha == 2.0, unsupported, "alpha",
              "the GPU Gaussian-tau serves alpha 1.5 and 2 (closed forms), got ", h.alpha);
      require(std::isfinite(h.margin), invalid_argument, "margin", "must be finite");
    }
    const kv::SummariesView& ms = h.moments;
    require(ms.m2 != nullptr && ms.count != nullptr && ms.num_pages > 0 &&
                ms.num_kv_heads == h.groups.num_kv_heads && ms.head_dim == a.q.n2 &&
                reinterpret_cast<std::uintptr_t>(ms.mean) % 16 == 0 &&
                reinterpret_cast<std::uintptr_t>(ms.m2) % 16 == 0,
            invalid_argument, "moments",
            "needs mean, m2 (16-byte aligned) and count with the page store's heads and dims");
    require(h.moment_pages >= 1, invalid_argument, "moment_pages", "must be >= 1");
    require(h.moment_indptr.size() == static_cast<std::size_t>(B) + 1, shape_mismatch,
            "moment_indptr", "needs batch + 1 entries");
    require((!h.adaptive && topp == nullptr) || gcap * kWarpPages <= kHierCand, unsupported,
            "budget_pages", "the adaptive and top-p rules rank at most ", kHierCand,
            " candidate pages (cover * budget)");
    // Before any launch: top-p's page kernel holds the chosen groups' pages in shared memory.
    require(topp == nullptr || top_p_smem(gcap) <= top_p_room(), unsupported, "budget_pages",
            "top-p over ", gcap, " chosen groups needs ", top_p_smem(gcap),
            " bytes of shared memory per block; this device leaves ", top_p_room(),
            " (a smaller budget or cover fits)");
    const int Hq = a.q.n1;
    tp.q = a.q.data;
    tp.q_s0 = a.q.s0;
    tp.q_s1 = a.q.s1;
    tp.batch = B;
    tp.num_q_heads = Hq;
    tp.num_kv_heads = ms.num_kv_heads;
    tp.head_dim = ms.head_dim;
    tp.mean = ms.mean;
    tp.m2 = ms.m2;
    tp.count = ms.count;
    tp.slots = ms.num_pages;
    tp.indptr = h.moment_indptr.data();
    tp.indices = h.moment_indices.data();
    tp.nnz = static_cast<int>(h.moment_indices.size());
    tp.max_groups = (launch.max_pages_per_seq + h.moment_pages - 1) / h.moment_pages;
    // select::group_tau_hat's scale: the f64 of the float scale, or 1/sqrt(d) in f64.
    tp.scale = a.scale == 0 ? 1.0 / std::sqrt(static_cast<double>(ms.head_dim)) : a.scale;
    tp.alpha = h.alpha;
    ws.mv.reserve(static_cast<std::size_t>(B) * Hq * tp.max_groups * 2, "cudaMalloc(moments)");
    ws.tau.reserve(static_cast<std::size_t>(B) * Hq, "cudaMalloc(tau)");
    ws.tau_used = static_cast<std::size_t>(B) * Hq;
    tp.mv = ws.mv.data();
    tp.tau = ws.tau.data();
    tp.err = ws.err.get();
    tp.bad_slot = kBadMomentSlot;
    tp.bad_indptr = kBadMomentIndptr;
    if (entmax_rank) {
      for (SelParams* sp : {&gp.p, &pp.p}) {
        sp->tau = ws.tau.data();
        sp->am1 = h.alpha - 1.0;
        sp->margin = h.margin;
      }
      pp.p.adaptive = h.adaptive ? 1 : 0;  // groups are never dropped (their rank bounds pages')
    }
  }
  if (B == 0) return;
  cudaStream_t stream = launch.stream;
  // Every path's first launch below is a plain one (or a memset then a plain one), so all
  // earlier writers of the page table are done before any of these kernels starts: the top-k
  // kernels read it before their programmatic-dependent-launch wait. Keep it so.
  if (topp != nullptr) {
    detail::launch_group_moments(tp, stream);
    gp.score<<<gp.score_grid, gp.score_threads, gp.smem, stream>>>(gp.p);
    check_cuda(cudaGetLastError(), "quest score kernel launch (groups)");
    launch_topk(gp, stream);
    TopPParams t{};
    t.mean = topp->pages.mean;
    t.m2 = topp->pages.m2;
    t.count = topp->pages.count;
    t.pool = topp->pages.num_pages;
    t.mv = tp.mv;
    t.mv_stride = tp.max_groups;
    t.mindptr = tp.indptr;
    t.mindices = tp.indices;
    t.mcount = tp.count;
    t.mslots = tp.slots;
    t.mnnz = tp.nnz;
    t.p = topp->p;
    t.scale = tp.scale;
    t.masses = topp->masses.data();
    // Items per (sequence, kv head): at most the kept pages (select_capacity's bound with a
    // budget of 0) and the chosen groups' pages.
    select::TopkPolicy kept_only = a.policy;
    kept_only.budget_pages = 0;
    t.items = select_capacity(launch.max_pages_per_seq, a.page_size, kept_only) + gcap * kWarpPages;
    const std::size_t lists = static_cast<std::size_t>(B) * h.groups.num_kv_heads;
    ws.lw.reserve(lists * t.items * (a.q.n1 / h.groups.num_kv_heads), "cudaMalloc(top-p weights)");
    ws.item_page.reserve(lists * t.items, "cudaMalloc(top-p items)");
    t.lw = ws.lw.data();
    t.item_page = ws.item_page.data();
    launch_hier_top_p(pp.p, t, a.q.n2, ws.gids.data(), ws.gcount.data(), gcap,
                      dim3(1, h.groups.num_kv_heads, B), stream);
    if (launch.check_errors) launch.workspace->check(stream);
    return;
  }
  if (entmax_rank) detail::launch_group_tau(tp, stream);
  const FusedPlan fused =
      launch.hier_kernel == SelectLaunch::HierKernel::fused
          ? hier_fused_plan(sc, a.q.n1 / h.groups.num_kv_heads, max_groups, gcap,
                            B * h.groups.num_kv_heads)
          : FusedPlan{};
  ws.hier_fused = fused.fn != nullptr;
  if (fused.fn != nullptr) {
    SelParams fp = pp.p;  // the page pass walks the kernel's own group list
    fp.tile_mask = nullptr;
    fp.tile_ids = nullptr;
    fp.tile_count = nullptr;
    launch_hier_fused(fused, gp.p, fp, ws.gids.data(), ws.gcount.data(), gcap,
                      h.groups.num_kv_heads, B, stream);
    if (launch.check_errors) launch.workspace->check(stream);
    return;
  }
  if (list_mode) {
    check_cuda(cudaMemsetAsync(pp.p.keys, 0,
                               sizeof(std::uint32_t) * B * h.groups.num_kv_heads * pp.p.max_pages,
                               stream),
               "cudaMemsetAsync(page keys)");
  }
  gp.score<<<gp.score_grid, gp.score_threads, gp.smem, stream>>>(gp.p);
  check_cuda(cudaGetLastError(), "quest score kernel launch (groups)");
  launch_topk(gp, stream);
  {  // launched while the group top-k runs; its CTAs wait on the device for the group lists
    detail::PdlLaunch l(stream, pp.score_grid, dim3(pp.score_threads), pp.smem);
    check_cuda(cudaLaunchKernelEx(&l.cfg, pp.score, pp.p), "quest score kernel launch (pages)");
  }
  if (gcap * kWarpPages <= kHierCand) {
    launch_hier_page_topk(pp.p, ws.gids.data(), ws.gcount.data(), gcap,
                          dim3(1, h.groups.num_kv_heads, B), stream);
  } else {
    launch_topk(pp, stream);
  }
  if (launch.check_errors) launch.workspace->check(stream);
}

}  // namespace

void select_impl::hier_select_with(const HierSelectArgs& h, const SelectLaunch& launch,
                                   const HierScorer& sc) {
  hier_launch(h, launch, nullptr, sc);
}

void hier_select(const HierSelectArgs& h, const SelectLaunch& launch) {
  select_impl::hier_select_with(
      h, launch, page_bound_hier(h.pages.q.n2, h.pages.bounds8.min != nullptr));
}

void hier_top_p(const HierTopPArgs& a, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(a.p > 0 && a.p <= 1, invalid_argument, "p", "must be in (0, 1], got ", a.p);
  const kv::SummariesView& s = a.pages;
  const int d = a.hier.pages.q.n2;
  require(s.mean != nullptr && s.m2 != nullptr && s.count != nullptr && s.num_pages > 0 &&
              s.num_kv_heads == a.hier.groups.num_kv_heads && s.head_dim == d &&
              reinterpret_cast<std::uintptr_t>(s.mean) % 16 == 0 &&
              reinterpret_cast<std::uintptr_t>(s.m2) % 16 == 0,
          invalid_argument, "pages", "needs the page summaries' mean, m2 and count");
  const int B = a.hier.pages.q.n0, Hkv = s.num_kv_heads;
  require(a.masses.empty() ||
              a.masses.size() == static_cast<std::size_t>(B) * Hkv * launch.max_pages_per_seq,
          shape_mismatch, "masses", "needs batch * kv heads * max_pages_per_seq entries");
  const TopPExtra t{s, a.p, a.masses};
  hier_launch(a.hier, launch, &t, page_bound_hier(d, a.hier.pages.bounds8.min != nullptr));
}

void update_groups(const GroupUpdateArgs& g, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const select::BoundStoreView& s = g.pages;
  require(s.min != nullptr && s.max != nullptr && s.head_dim >= 1 && s.head_dim <= 256 &&
              s.num_kv_heads >= 1 && s.num_kv_heads <= 65535,
          invalid_argument, "pages", "null store, or head_dim outside [1, 256]");
  require(g.group_min != nullptr && g.group_max != nullptr && g.group_slots > 0, invalid_argument,
          "group_min", "null group store");
  require(g.group_pages >= 1, invalid_argument, "group_pages", "must be >= 1");
  require(!g.table.indptr.empty() && g.group_indptr.size() == g.table.indptr.size(), shape_mismatch,
          "group_indptr", "needs batch + 1 entries, as indptr");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int B = static_cast<int>(g.table.indptr.size()) - 1;
  require(B <= 65535, unsupported, "indptr", "batch must be <= 65535");
  GroupParams p{};
  p.indptr = g.table.indptr.data();
  p.indices = g.table.indices.data();
  p.gindptr = g.group_indptr.data();
  p.gindices = g.group_indices.data();
  p.mn = reinterpret_cast<const std::uint16_t*>(s.min);
  p.mx = reinterpret_cast<const std::uint16_t*>(s.max);
  p.gmn = reinterpret_cast<std::uint16_t*>(g.group_min);
  p.gmx = reinterpret_cast<std::uint16_t*>(g.group_max);
  p.pool_pages = s.num_pages;
  p.slots = g.group_slots;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.group_pages = g.group_pages;
  p.nnz = static_cast<int>(g.table.indices.size());
  p.gnnz = static_cast<int>(g.group_indices.size());
  p.last_only = g.last_only;
  p.err = launch.workspace->impl().err.get();
  if (B == 0) return;
  const int groups =
      g.last_only ? 1 : (launch.max_pages_per_seq + g.group_pages - 1) / g.group_pages;
  launch_group_update(p, dim3(groups, s.num_kv_heads, B), s.head_dim, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

void extend_kept(const ExtendKeptArgs& e, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  check_policy(e.policy);
  require(e.page_size >= 1, invalid_argument, "page_size", "must be >= 1, got ", e.page_size);
  require(!e.table.indptr.empty(), shape_mismatch, "indptr", "needs batch + 1 entries");
  const int B = static_cast<int>(e.table.indptr.size()) - 1;
  require(B <= 65535, unsupported, "indptr", "batch must be <= 65535");
  require(e.table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs one entry per sequence");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  if (B == 0) return;
  require(e.max_in >= 0 && !e.count_in.empty() &&
              e.count_in.size() % static_cast<std::size_t>(B) == 0,
          shape_mismatch, "count_in", "needs [batch][kv heads] entries");
  const int Hkv = static_cast<int>(e.count_in.size() / static_cast<std::size_t>(B));
  require(Hkv <= 65535, unsupported, "count_in", "kv heads must be <= 65535");
  require(e.ids_in.size() == e.count_in.size() * static_cast<std::size_t>(e.max_in),
          shape_mismatch, "ids_in", "needs [batch][kv heads][max_in] entries");
  require(e.max_per_head >= 0 && e.count.size() == e.count_in.size(), shape_mismatch, "count",
          "needs [batch][kv heads] entries, as count_in");
  require(e.ids.size() == e.count.size() * static_cast<std::size_t>(e.max_per_head),
          shape_mismatch, "ids", "needs [batch][kv heads][max_per_head] entries");
  const auto overlaps = [](const void* a, std::size_t na, const void* b, std::size_t nb) {
    const auto* pa = static_cast<const char*>(a);
    const auto* pb = static_cast<const char*>(b);
    return na > 0 && nb > 0 && pa < pb + nb && pb < pa + na;
  };
  const std::size_t w = sizeof(std::int32_t);
  const std::size_t ni = e.ids_in.size() * w, nc = e.count_in.size() * w;
  const std::size_t no = e.ids.size() * w, nk = e.count.size() * w;
  require(!overlaps(e.ids_in.data(), ni, e.ids.data(), no) &&
              !overlaps(e.ids_in.data(), ni, e.count.data(), nk) &&
              !overlaps(e.count_in.data(), nc, e.ids.data(), no) &&
              !overlaps(e.count_in.data(), nc, e.count.data(), nk),
          invalid_argument, "ids", "the outputs overlap the earlier selection");
  detail::ExtendParams p{};
  p.indptr = e.table.indptr.data();
  p.last_page_len = e.table.last_page_len.data();
  p.nnz = static_cast<int>(e.table.indices.size());
  p.page_size = e.page_size;
  p.max_pages = launch.max_pages_per_seq;
  p.num_kv_heads = Hkv;
  p.sink_pages = e.policy.sink_pages;
  p.window_tokens = e.policy.window_tokens;
  p.ids_in = e.ids_in.data();
  p.count_in = e.count_in.data();
  p.max_in = e.max_in;
  p.ids = e.ids.data();
  p.count = e.count.data();
  p.max_per_head = e.max_per_head;
  p.err = launch.workspace->impl().err.get();
  p.bad_indptr = kBadIndptr;
  p.bad_last_len = kBadLastLen;
  p.bad_capacity = kBadCapacity;
  p.bad_selection = kBadSelection;
  detail::launch_extend_kept(p, B, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

void update_moments(const MomentUpdateArgs& m, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  const kv::SummariesView& s = m.pages;
  require(s.mean != nullptr && s.m2 != nullptr && s.count != nullptr && s.head_dim >= 1 &&
              s.head_dim <= 256 && s.num_kv_heads >= 1 && s.num_kv_heads <= 65535,
          invalid_argument, "pages", "null mean, m2 or count, or head_dim outside [1, 256]");
  require(m.mean != nullptr && m.m2 != nullptr && m.count != nullptr && m.slots > 0,
          invalid_argument, "mean", "null moment store");
  require(m.group_pages >= 1, invalid_argument, "group_pages", "must be >= 1");
  require(!m.table.indptr.empty() && m.moment_indptr.size() == m.table.indptr.size(),
          shape_mismatch, "moment_indptr", "needs batch + 1 entries, as indptr");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int B = static_cast<int>(m.table.indptr.size()) - 1;
  require(B <= 65535, unsupported, "indptr", "batch must be <= 65535");
  detail::MomentUpdateParams p{};
  p.indptr = m.table.indptr.data();
  p.indices = m.table.indices.data();
  p.mindptr = m.moment_indptr.data();
  p.mindices = m.moment_indices.data();
  p.mean = s.mean;
  p.m2 = s.m2;
  p.count = s.count;
  p.gmean = m.mean;
  p.gm2 = m.m2;
  p.gcount = m.count;
  p.pool_pages = s.num_pages;
  p.slots = m.slots;
  p.num_kv_heads = s.num_kv_heads;
  p.head_dim = s.head_dim;
  p.group_pages = m.group_pages;
  p.nnz = static_cast<int>(m.table.indices.size());
  p.mnnz = static_cast<int>(m.moment_indices.size());
  p.last_only = m.last_only;
  p.err = launch.workspace->impl().err.get();
  p.bad_page = kBadPhysical;
  p.bad_slot = kBadMomentSlot;
  p.bad_indptr = kBadMomentIndptr;
  detail::launch_moment_update(
      p, B, (launch.max_pages_per_seq + m.group_pages - 1) / m.group_pages, launch.stream);
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

}  // namespace masskv::cuda
