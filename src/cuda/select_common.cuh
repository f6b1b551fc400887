// What the CUDA Quest selection's rooms share (select.cu holds the entry points): the
// launch's device parameters (SelParams), the error bits, a sequence's kept-page split, the
// plan of one flat selection (Prepared), the workspace's buffers, and each kernel family's
// host side, declared here and defined in its room:
//   select_score.cu   page (or group) scoring: a scorer's ranks -> ordered keys (the scan is
//                     select_score.cuh, generic over a device scorer; the library's scorer,
//                     the page bound, is select_page_bound.cuh)
//   select_topk.cu    the flat top-k: one CTA per (sequence, kv head), or a cluster
//   select_hier.cu    the hierarchical page top-k over the chosen groups, and the one-kernel
//                     path's plan (its kernel, generic over the scorers, is select_hier.cuh)
//   select_top_p.cu   hierarchical top-p: masses from the page summaries, heaviest until p
//   select_groups.cu  group summaries rebuilt from the page store
//   select_plan.cu    the workspace, the argument checks and the launch plan (prepare)
// Kernels stay in their room's anonymous namespace, except those generic over a device scorer
// (select_score.cuh, select_hier.cuh: a scorer's file instantiates them); only host launchers
// and kernel pointers cross rooms.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "device.cuh"
#include "masskv/cuda/select.hpp"
#include "select/kept.hpp"

namespace masskv::cuda {

// Defined here, not in select_plan.cu: hier_launch (select.cu) and the upkeep entry points
// fill these buffers too.
struct SelectWorkspace::Impl {
  detail::GrowBuffer<std::uint32_t> keys;
  std::size_t keys_used = 0;
  int stride = 0;
  // Hierarchical selection: group keys, group lists and counts, the group mask.
  detail::GrowBuffer<std::uint32_t> gkeys;
  std::size_t gkeys_used = 0;
  int gstride = 0;
  detail::GrowBuffer<std::int32_t> gids, gcount;
  std::size_t gids_used = 0, gcount_used = 0;
  int glist_stride = 0;
  bool hier_fused = false;  // the last hier_select ran as one kernel
  detail::GrowBuffer<std::uint8_t> gmask;
  // Entmax-aware ranking: (m, v) per (sequence, q head, moment group) and τ̂ per (sequence, q head).
  detail::GrowBuffer<double> mv, tau;
  std::size_t tau_used = 0;
  // Top-p: log-weights per (item, q head) and the items' pages.
  detail::GrowBuffer<double> lw;
  detail::GrowBuffer<std::int32_t> item_page;
  detail::ErrorFlag err;
};

namespace select_impl {

using detail::check_cuda;
using detail::device_sms;

constexpr int kChunkAlign = 64;      // SelectLaunch::chunk_pages: a multiple of this
constexpr int kMaxGroupDims = 8192;  // group * head_dim (q+ and q- live in shared memory)
constexpr int kWarpPages = 16;       // pages of a scoring warp tile, and of a group
constexpr int kHierThreads = 256;    // the hierarchical page top-k's and top-p's CTAs
constexpr int kHierCand = 8192;      // candidate pages (chosen groups × 16) a CTA holds

enum ErrBit : unsigned {
  kBadPhysical = 1u,
  kBadIndptr = 2u,
  kBadLastLen = 4u,
  kBadCapacity = 8u,
  kNonFinite = 16u,
  kBadMomentSlot = 32u,
  kBadMomentIndptr = 64u,
  kBadSelection = 128u,
  kBadListCapacity = 256u,  // engine_pages: a list longer than max_per_list
};

struct SelParams {
  const float* q;
  std::int64_t q_s0, q_s1;
  const std::uint16_t* mn;  // bf16 bits [page][kv][d] (8-bit store: codes, as bytes)
  const std::uint16_t* mx;
  const float* grid;  // 8-bit store: [page][kv][2] (lo, step); null for bf16
  // Hierarchical page pass: [B][Hkv][mask_stride] group flags (group = page / kWarpPages);
  // pages of a group flagged 0 get key 0 and are not read. Null: every page is scored.
  const std::uint8_t* tile_mask;
  int mask_stride;
  // Hierarchical page pass, list mode: the tiles are the groups of tile_ids [B][Hkv][tile_stride]
  // (tile_count of them, group = 16 pages), chunk_pages / 16 of them per CTA; pages of other
  // groups are neither read nor written (their keys are zeroed before the launch).
  const std::int32_t* tile_ids;
  const std::int32_t* tile_count;
  int tile_stride;
  int pool_pages, num_kv_heads, group, page_size;
  int nnz;  // entries of indices: indptr must stay inside
  const std::int32_t* indptr;
  const std::int32_t* indices;
  const std::int32_t* last_len;
  float scale, slack_f;  // slack_f = 2 (2d + 4) 2^-24, as page_bound.cpp
  int max_pages;         // keys stride
  int chunk_pages;
  std::uint32_t* keys;
  // top-k
  int budget, sinks, window_tokens, max_per_head;
  int key_cache;  // keys the top-k kernel's dynamic shared memory holds
  std::int32_t* out_ids;
  std::int32_t* out_count;
  std::uint8_t* out_mask;  // optional [B][Hkv][max_pages]: 1 where selected (block top-k only)
  unsigned* err;
  // Entmax-aware ranking (hier_select with moments): tau [B][Hq] (τ̂ per q head), am1 = α - 1;
  // a page's key is that of max_i float(am1 · U_i - τ̂_i) (select::entmax_rank). adaptive: a page
  // whose rank is not above -margin gets key 0, and hier_page_topk_kernel takes no key-0 page.
  const double* tau;
  double am1;
  float margin;
  int adaptive;
  // SelectLaunch::phase_stamps (profiling), usually null; the scoring kernel stamps as
  // stamp_score, the top-k kernels as stamp_score + 1 (stamps.hpp).
  std::uint64_t* stamps;
  int stamp_score;
};

__device__ __forceinline__ std::uint32_t ordered_key(float x) {
  const std::uint32_t u = __float_as_uint(__fadd_rn(x, 0.0f));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Sequence b's page count, checked (flags and returns -1 when bad).
__device__ inline int seq_pages(const SelParams& p, int b) {
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int n = end - begin;
  if (n < 0 || n > p.max_pages || begin < 0 || end > p.nnz) {
    atomicOr(p.err, kBadIndptr);
    return -1;
  }
  return n;
}

// The split of one (sequence, kv head)'s pages, as topk_split (topk_rank.hpp): sinks
// [0, sinks) and [window, n) kept (`kept` pages, by the rule of select/kept.hpp), `total`
// selected. bad: a bad indptr, last_page_len or a selection longer than the lists (flagged by
// `flag`'s thread).
struct TopkSplit {
  int n, sinks, window, kept, total;
  bool bad;
};
__device__ inline TopkSplit topk_split_of(const SelParams& p, int b, bool flag) {
  TopkSplit s{seq_pages(p, b), 0, 0, 0, 0, false};
  const int n = s.n;
  int last = 0;
  s.bad = n < 0;
  if (!s.bad && n > 0) {
    last = p.last_len[b];
    if (last < 1 || last > p.page_size) {
      if (flag) atomicOr(p.err, kBadLastLen);
      s.bad = true;
    }
  }
  if (!s.bad && n > 0) {
    const std::int64_t length = static_cast<std::int64_t>(n - 1) * p.page_size + last;
    const select::KeptRanges<int> k =
        select::kept_pages(n, length, p.page_size, p.sinks, p.window_tokens);
    s.sinks = k.first_end;
    s.window = k.last_begin;
    s.kept = k.count(n);
    s.total = min(n, max(p.budget, s.kept));
    if (s.total > p.max_per_head) {
      if (flag) atomicOr(p.err, kBadCapacity);
      s.bad = true;
    }
  }
  return s;
}

// The least power of two >= x (x >= 1).
__host__ __device__ constexpr int pow2_ceil(int x) {
  int p = 1;
  while (p < x) p <<= 1;
  return p;
}

// hier_top_p_kernel's dynamic shared memory for `groups` chosen groups a (sequence, kv head).
constexpr std::size_t top_p_smem(int groups) {
  const int cap = groups * kWarpPages;
  return sizeof(unsigned long long) * static_cast<std::size_t>(2 * cap + pow2_ceil(cap));
}

// Hierarchical top-p (select::hier_top_p): what the page pass needs beyond SelParams.
struct TopPParams {
  const float* mean;  // page summaries [page][kv][d], count [page]
  const float* m2;
  const std::int32_t* count;
  int pool;
  const double* mv;  // group_moments_kernel's [B][Hq][mv_stride][2] over the moment groups
  int mv_stride;
  const std::int32_t *mindptr, *mindices, *mcount;  // moment table and counts
  int mslots, mnnz;
  double p, scale;
  double* masses;  // optional [B][Hkv][max_pages]: the mass of every kept and candidate page
  // Workspace: per (sequence, kv head) `items` items (its kept pages, then the candidate slots):
  // lw [item][q head of the group] = log n + m + v/2 (-inf: no mass), page [item] (-1: none).
  double* lw;
  std::int32_t* item_page;
  int items;
};

// ---- host: the plans, and each room's launchers ------------------------------------------

using ScoreFn = void (*)(SelParams);

// The host side of a device scorer (select_score.cuh's contract): its scan kernels
// (score_kernel<S>, and one with the row loop fully unrolled for warps that score many tiles;
// the same kernel where the scorer has no such form) and its shared memory: warp_bytes for one
// scoring warp's stages, query_bytes(group) for the staged query. scan_kernels<S>() fills it.
struct ScanKernels {
  ScoreFn fn = nullptr, fn_hot = nullptr;
  std::size_t warp_bytes = 0;
  std::size_t (*query_bytes)(int group) = nullptr;
  std::size_t bytes(int warps, int group) const {
    return static_cast<std::size_t>(warps) * warp_bytes + query_bytes(group);
  }
};
// The library's scorer: the §2.3 page bound over the bf16 (u8: 8-bit) store (select_score.cu).
ScanKernels page_bound_scan(int d, bool u8);

// The scoring launch of one (scorer, group): the kernel (its dynamic shared-memory limit
// raised to the device's), warps per CTA (as many as fit, <= kScoreMaxWarps), shared memory,
// and resident CTAs per SM (for the chunk plan). Cached per (kernel, group): after the first
// step of a shape no CUDA call is made (stream capture).
struct ScorePlan {
  ScoreFn fn = nullptr;      // a warp scores one or two tiles (loops by 2: small code)
  ScoreFn fn_hot = nullptr;  // a warp scores score_hot_tiles or more (loops fully unrolled)
  int warps = 0;
  std::size_t smem = 0;
  int ctas_per_sm = 1;
};

using TopkFn = void (*)(SelParams);

// One flat selection's two launches (prepare): the scoring kernel's and the top-k's.
struct Prepared {
  SelParams p{};
  dim3 score_grid, topk_grid;
  ScoreFn score = nullptr;  // plan.fn or plan.fn_hot by the chunk (set_score_kernel)
  ScorePlan plan;
  TopkFn topk = nullptr;
  bool block_topk = false;  // the block kernel: launched with programmatic dependent launch
  int score_threads = 0;
  std::size_t smem = 0, topk_smem = 0;
};

// Which key buffer a launch writes: the page keys, or the group keys of hier_select.
enum class KeyLevel { pages, groups };

// select_plan.cu: checks a flat selection's arguments and plans its two launches (scoring
// kernel, grids, top-k kernel, shared memory; workspace buffers grown). outputs: ids and count
// are checked too.
// scan: the scorer (null: the page bound of a's store).
Prepared prepare(const QuestSelectArgs& a, const SelectLaunch& launch, bool outputs,
                 KeyLevel level = KeyLevel::pages, const ScanKernels* scan = nullptr);
void check_policy(const select::TopkPolicy& pol);

// select_score.cu: the scoring kernel's plan for (scorer, group), the pages a CTA scores, and
// the kernel for a prepared chunk (the fully unrolled one from hot_tiles tiles a warp:
// SelectLaunch::score_hot_tiles).
ScorePlan score_plan(const ScanKernels& k, int group);
int plan_score_chunk(int pairs, int max_pages, int ctas_per_sm);
void set_score_kernel(Prepared& pr, int hot_tiles);

// select_topk.cu: the cluster (c CTAs) and block kernels, the keys a CTA caches, the cluster
// size planned for a launch, and the launch (after the scoring kernel).
TopkFn topk_kernel(int c);
TopkFn block_topk_kernel();
int key_cache_cap();
int plan_topk_cluster(int pairs, int max_pages);
void launch_topk(const Prepared& pr, cudaStream_t stream);

// select_hier.cu: the one-kernel path's plan and launch, the page top-k over the chosen
// groups, and whether the page pass walks the group list (SelectLaunch::hier_scan).
using FusedFn = void (*)(SelParams, SelParams, std::int32_t*, std::int32_t*, int, int);
struct FusedPlan {
  FusedFn fn = nullptr;
  int ctas = 0;  // the cluster (grid.x)
  int list_off = 0;
  std::size_t smem = 0;
};
// What the hierarchical selection runs for one scorer: the group scan (over the bf16 group
// store), the page scan, and the one-kernel path (hier_fused_kernel<group scorer, page scorer>,
// select_hier.cuh; null where the scorer has none).
struct HierScorer {
  ScanKernels groups, pages;
  FusedFn fused = nullptr;
};
// The library's: the page bound at both levels (fused for head_dim 64 and 128).
HierScorer page_bound_hier(int d, bool u8);
// hier_select with scorer sc (select.cu; cuda::hier_select passes page_bound_hier). A test
// reaches the GPU with its own scorer through it.
void hier_select_with(const HierSelectArgs& h, const SelectLaunch& launch, const HierScorer& sc);
// The fused kernel for this call, or fn == null where it does not serve: a scorer with a fused
// kernel, at most kHierCand chosen pages, everything in the shared memory that fits, and
// clusters the device can schedule. pairs = batch * kv heads.
FusedPlan hier_fused_plan(const HierScorer& sc, int group, int max_groups, int gcap, int pairs);
void launch_hier_fused(const FusedPlan& f, const SelParams& gp, const SelParams& pp,
                       std::int32_t* gids, std::int32_t* gcount, int gstride, int kv_heads,
                       int batch, cudaStream_t stream);
void launch_hier_page_topk(const SelParams& p, const std::int32_t* gids, const std::int32_t* gcount,
                           int gstride, dim3 grid, cudaStream_t stream);
bool hier_list_mode(SelectLaunch::HierScan scan, int max_pages);

// select_top_p.cu: the shared memory its kernel may use (limit raised once), and its launches.
std::size_t top_p_room();
void launch_hier_top_p(const SelParams& p, const TopPParams& t, int d, const std::int32_t* gids,
                       const std::int32_t* gcount, int gstride, dim3 grid, cudaStream_t stream);

// select_groups.cu: group_update_kernel, grid (groups or 1, kv heads, batch).
struct GroupParams {
  const std::int32_t *indptr, *indices, *gindptr, *gindices;
  const std::uint16_t *mn, *mx;  // page store, bf16 bits
  std::uint16_t *gmn, *gmx;      // group store
  int pool_pages, slots, num_kv_heads, head_dim, group_pages, nnz, gnnz;
  bool last_only;
  unsigned* err;
};
void launch_group_update(const GroupParams& p, dim3 grid, int threads, cudaStream_t stream);

}  // namespace select_impl
}  // namespace masskv::cuda
