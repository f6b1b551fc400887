// CUDA Quest page selection (docs/design.md §2.3 page bounds, §3 Selection): page scoring and top-k
// on the GPU, so a sparse decode step needs no host round trip. The result is the CPU
// selector's (select::quest_select with bounds_bf16): same bounds, same GQA aggregation (max
// over the group's q heads), same kept pages (sinks, window, last page), same tie rule (lower
// page id first), same Selection layout (ascending logical ids, -1 padded, counts). Every
// pointer and span in the args is *device* memory.
#pragma once

#include <bit>
#include <cstdint>
#include <memory>
#include <span>

#include "masskv/kv/engine_pages.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

struct CUstream_st;

namespace masskv::cuda {

// Device buffers of a selection step besides its inputs and outputs: the page keys
// ([B][Hkv][max_pages_per_seq] uint32) and the device error flag. Grows on demand (once, at
// the first step of a shape); afterwards a step allocates nothing, so it can be captured in a
// CUDA graph. One workspace per stream.
class SelectWorkspace {
 public:
  SelectWorkspace();
  ~SelectWorkspace();
  SelectWorkspace(const SelectWorkspace&) = delete;
  SelectWorkspace& operator=(const SelectWorkspace&) = delete;

  // Waits for `stream`, reads and clears the error flag, throws masskv::Error when a kernel
  // met bad data: out_of_range "indices" (a physical page outside the bound store),
  // "indptr" (a decreasing indptr, one past indices.size(), or a sequence with more pages
  // than SelectLaunch::max_pages_per_seq), "last_page_len" (outside [1, page_size]),
  // "max_per_head" (a selection longer than the output lists), "max_per_list" (engine_pages:
  // a list longer than the output's), "selection" (a list that is not ascending ids of its
  // sequence's pages), non_finite "q" (a NaN bound:
  // the CPU selector rejects non-finite q up front; the GPU cannot read q on the host).
  // The lists of the affected (sequence, kv head) pairs are then empty (count 0, all -1).
  void check(CUstream_st* stream) const;

  // The page keys of the last quest_select / quest_score: device memory,
  // key of (b, kv head h, logical page j) at [(b * Hkv + h) * keys_stride() + j], j < pages(b).
  // key = order-preserving map of the page's bound (max over the group's q heads); see
  // key_to_bound. Keys of pages whose physical id was bad are 0.
  std::span<const std::uint32_t> page_keys() const;
  int keys_stride() const;
  // The group keys and group lists of the last hier_select (same layout, stride
  // group_keys_stride(); lists [B][Hkv][group_list_stride()], counts [B][Hkv]).
  std::span<const std::uint32_t> group_keys() const;
  int group_keys_stride() const;
  std::span<const std::int32_t> group_ids() const;
  std::span<const std::int32_t> group_counts() const;
  int group_list_stride() const;
  // Whether the last hier_select ran as one kernel (SelectLaunch::HierKernel::fused, served).
  bool last_hier_fused() const;
  // τ̂ [B][Hq] of the last hier_select with moments (select::group_tau_hat's values).
  std::span<const double> tau() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct QuestSelectArgs {
  View3<const float> q;  // device [B][Hq][d], unit stride on d; Hq a multiple of Hkv
  kv::PageTable table;   // device spans: indptr [B+1], indices, last_page_len [B]
  int page_size = 16;    // any >= 1 (the decode kernel needs a power of two <= 256)
  // Device bf16 min/max summaries [page][kv_head][head_dim], rounded outward (the host
  // select::BoundStore's arrays copied to the device). wmax is not used (the kernel
  // recomputes W = max_c max(|m_c|, |M_c|), exact, from the same bf16 values).
  select::BoundStoreView bounds;
  // Device 8-bit store (select::BoundStore8's arrays; codes 16-byte aligned, grid 8-byte
  // aligned). When bounds8.min is set it is scanned instead of `bounds` (then unused): the
  // result is select::quest_select8's (same bounds, bit for bit).
  select::BoundStore8View bounds8;
  float scale = 0;  // 0 means 1/sqrt(d), as the CPU selector
  select::TopkPolicy policy;
  // Output, device: ids [B][Hkv][max_per_head] (ascending logical page ids, -1 padded) and
  // count [B][Hkv]. The SelectionView of these spans feeds cuda::decode directly.
  int max_per_head = 0;
  std::span<std::int32_t> ids;
  std::span<std::int32_t> count;
};

struct SelectLaunch {
  CUstream_st* stream = nullptr;
  SelectWorkspace* workspace = nullptr;  // required
  // Host bound on pages per sequence: sizes the key buffer and the scoring grid without
  // reading the device page table. A longer sequence sets the error flag ("indptr").
  int max_pages_per_seq = 0;
  // Scoring chunk in pages (a multiple of 64); 0 plans it from the SM count.
  int chunk_pages = 0;
  // true: wait and check the error flag (throws). false: call workspace->check later.
  bool check_errors = true;
  // hier_select: `separate` launches (group scoring, group top-k, page scoring, page top-k),
  // or the whole selection in one `fused` kernel (a thread-block cluster per (sequence, kv
  // head)) where it serves: head_dim 64/128, cover x budget <= 8192 pages, and 8 bytes per
  // group of max_pages_per_seq / 16 in shared memory (up to ~7M tokens at 16-token pages);
  // elsewhere the separate launches (SelectWorkspace::last_hier_fused says which ran).
  // automatic: separate (the separate launches measured faster: docs/gpu-results.md, tuning
  // notes).
  enum class HierKernel { automatic, separate, fused };
  HierKernel hier_kernel = HierKernel::automatic;
  // Tiles per scoring warp from which the fully unrolled scoring kernel runs (>= 1; 8 measured
  // best against 3 and 64: docs/gpu-results.md, tuning notes). Same keys either way.
  int score_hot_tiles = 8;
  // The flat top-k (and hier_select's page top-k where the chosen groups hold more than 8192
  // pages): `automatic` takes one CTA per (sequence, kv head) up to ~16K pages a sequence and a
  // thread-block cluster beyond (where each measured faster: docs/gpu-results.md, tuning
  // notes); `cluster` the cluster kernel at every length (sm_90: unsupported on the sm_80
  // paths). topk_cluster: the cluster's CTAs, 1, 2, 4 or 8 (1 under automatic: the one-CTA
  // kernel), or 0 to plan them. Same lists either way (the GPU check runs every size).
  enum class TopkKernel { automatic, cluster };
  TopkKernel topk_kernel = TopkKernel::automatic;
  int topk_cluster = 0;
  // hier_select's page pass finds the chosen groups' pages by walking their list (`list`) or
  // every tile of the sequence under the group mask (`mask`); automatic: list from 16384 pages
  // a sequence (list mode zeroes every page key first: it pays only on long sequences). Same
  // lists either way.
  enum class HierScan { automatic, list, mask };
  HierScan hier_scan = HierScan::automatic;
  // Profiling: a device array of stamps::kEntries (masskv/cuda/stamps.hpp) the kernels write
  // their phase times into; null (the default) writes nothing.
  std::uint64_t* phase_stamps = nullptr;
};

// Scores every page (bounds -> keys in the workspace) and selects. Validates the host-side
// shape of the arguments (throws masskv::Error naming the argument: "workspace", "q",
// "head_dim", "bounds", "indptr", "last_page_len", "page_size", "budget_pages",
// "sink_pages", "window_tokens", "max_pages_per_seq", "max_per_head", "ids", "count",
// "scale", "chunk_pages", "score_hot_tiles", "topk_cluster", "topk_kernel"). Served: head_dim
// 64, 128, 256; group * head_dim <= 8192.
void quest_select(const QuestSelectArgs& args, const SelectLaunch& launch);

// The scoring kernel alone (keys into the workspace; ids/count not written, may be empty).
void quest_score(const QuestSelectArgs& args, const SelectLaunch& launch);

// The top-k alone, on the keys the last quest_score left in the workspace (same args).
void quest_topk(const QuestSelectArgs& args, const SelectLaunch& launch);

// Hierarchical Quest (select::hier_select's result): the group summaries are scanned first,
// the group top-k keeps the last group and the best hier_groups(...) - 1 others per (sequence,
// kv head), then only the pages of those groups are read and scored (every other page key is
// 0), and the page top-k selects as flat Quest does. Four kernels (one with
// SelectLaunch::HierKernel::fused), no host round trip.
struct HierSelectArgs {
  // The page store (bf16, or 8-bit when pages.bounds8 is set: select::HierSelectArgs::pages8),
  // table, q, policy, outputs.
  QuestSelectArgs pages;
  // Device group store (select::GroupStore's arrays: [slot][kv_head][head_dim] bf16) and its
  // table: indptr [B+1] of groups, indices = the slots (GroupStore::indices()).
  select::BoundStoreView groups;
  std::span<const std::int32_t> group_indptr, group_indices;
  int group_pages = 16;  // the GPU serves 16 (a scoring warp tile)
  double cover = 2.0;
  // Entmax-aware ranking (select::HierSelectArgs::tau, Gaussian-τ): when moments.mean is set,
  // τ̂ of every (sequence, q head) is estimated on the device from the pooled moment store
  // (select::MomentStore's arrays: mean, m2 [slot][kv head][d] f32, 16-byte aligned, count
  // [slot]; its table moment_indptr [B+1] / moment_indices, groups of moment_pages pages) as
  // select::group_tau_hat does, then groups and pages rank by select::entmax_rank. alpha: 1.5
  // or 2. adaptive / margin: select::HierSelectArgs's (the adaptive rule needs cover × budget
  // <= 8192 pages).
  kv::SummariesView moments;
  std::span<const std::int32_t> moment_indptr, moment_indices;
  int moment_pages = 64;
  double alpha = 1.5;
  bool adaptive = false;
  float margin = 0.f;
};
// launch.max_pages_per_seq bounds the pages per sequence (groups: ceil(/ 16)).
void hier_select(const HierSelectArgs& args, const SelectLaunch& launch);

// Hierarchical top-p (select::hier_top_p): the group stage of hier_select (Quest group bounds,
// cover; hier.moments, moment_indptr, moment_indices, moment_pages required: the normaliser),
// then one CTA per (sequence, kv head) estimates the mass of the kept pages and of the chosen
// groups' pages from their summaries and takes the heaviest until the mass reaches p, at most
// the budget (cover × budget <= 8192 pages). Four kernels, no host round trip.
struct HierTopPArgs {
  HierSelectArgs hier;
  kv::SummariesView pages;  // device page summaries: mean, m2 [page][kv head][d] (16-byte
                            // aligned), count [page]
  double p = 0.9;           // in (0, 1]
  // Optional device output [B][Hkv][max_pages_per_seq]: the estimated mass of every kept and
  // candidate page (other entries untouched).
  std::span<double> masses;
};
void hier_top_p(const HierTopPArgs& args, const SelectLaunch& launch);

// Recomputes group summaries on the device from the bf16 page store (select::GroupStore's
// values, bit for bit: elementwise min of the members' mins, max of their maxes): every group
// of every sequence, or only each sequence's last group (the one an append changes). The group
// table maps sequence b's group i to slot group_indices[group_indptr[b] + i]; the caller
// allocates slots (a new group when a sequence crosses a multiple of group_pages pages).
struct GroupUpdateArgs {
  kv::PageTable table;                                        // device page table of the sequences
  select::BoundStoreView pages;                               // device bf16 page store
  std::span<const std::int32_t> group_indptr, group_indices;  // device group table
  bf16* group_min = nullptr;  // device group store [slot][kv_head][head_dim]
  bf16* group_max = nullptr;
  int group_slots = 0;  // slots in the group store
  int group_pages = 16;
  bool last_only = false;
};
// Errors (bad page or slot ids, a group table that does not match the page counts) set the
// workspace's device flag (checked as quest_select's: "indices", "indptr").
void update_groups(const GroupUpdateArgs& args, const SelectLaunch& launch);

// Rebuilds moment groups on the device from the page summaries (select::MomentStore's values,
// bit for bit): every group of every sequence, or only each sequence's last group (the one an
// append changes). The moment table maps sequence b's group i to slot
// moment_indices[moment_indptr[b] + i]; the caller allocates slots. Errors set the workspace's
// device flag: a page id outside the summaries ("indices"), a slot outside the store
// ("moment_indices"), a moment table that does not match the page counts ("moment_indptr").
struct MomentUpdateArgs {
  kv::PageTable table;      // device page table of the sequences
  kv::SummariesView pages;  // device page summaries: mean, m2 [page][kv head][d], count [page]
  std::span<const std::int32_t> moment_indptr, moment_indices;  // device moment table
  float* mean = nullptr;  // device moment store [slot][kv head][d]
  float* m2 = nullptr;
  std::int32_t* count = nullptr;  // [slot]
  int slots = 0;
  int group_pages = 64;
  bool last_only = false;
};
void update_moments(const MomentUpdateArgs& args, const SelectLaunch& launch);

// A page selection made at an earlier decode step, brought up to the table's current lengths
// (select::extend_kept's lists, bit for bit; SessionOptions::reselect_every): each list keeps
// its pages and gains the kept pages of the current length (policy.sink_pages, the pages of
// the last policy.window_tokens, the last page; policy.budget_pages is not used). One small
// kernel: the steps between two selections run it instead of the selection chain. `ids_in` /
// `count_in` ([B][Hkv][max_in], [B][Hkv]) must not overlap the outputs. Errors set the
// workspace's flag: "indptr", "last_page_len" (as quest_select), "selection" (a list that is
// not ascending or holds a page beyond its sequence), "max_per_head" (an extended list longer
// than the output lists: size them with select_capacity plus the pages appended between
// selections); the affected lists are then empty.
struct ExtendKeptArgs {
  kv::PageTable table;  // device page table of the sequences now
  int page_size = 16;
  select::TopkPolicy policy;
  int max_in = 0;
  std::span<const std::int32_t> ids_in, count_in;
  int max_per_head = 0;
  std::span<std::int32_t> ids, count;
};
// launch.max_pages_per_seq bounds the pages per sequence (longer: "indptr").
void extend_kept(const ExtendKeptArgs& args, const SelectLaunch& launch);

// A page selection handed to a serving engine (kv::engine_pages' arrays, entry for entry, on the
// device; docs/engine.md): physical page ids in sequence order per (sequence, kv head) or per
// sequence (the union of its kv heads' lists), padded and as a FlashInfer page table. Two small
// kernels on launch.stream, no host sync, nothing allocated after the first call of a shape: it
// can be captured in a CUDA graph with the selection that feeds it.
struct EnginePagesArgs {
  SelectionView selection;  // device spans: a page selection (quest_select's / hier_select's)
  kv::PageTable table;      // device spans: the engine's page table of the sequences
  int page_size = 16;
  kv::EngineLists lists = kv::EngineLists::per_kv_head;
  kv::EnginePagesOut out;   // device spans
};
// Host checks as kv::check_engine_pages_shape (throws masskv::Error naming the argument, and
// "workspace", "max_pages_per_seq"); launch.max_pages_per_seq bounds the pages per sequence
// (longer: "indptr"; head_union keeps a bit per page of it in shared memory, up to ~1.8M pages).
// On the device, a list that is not ascending ids of its sequence's pages ("selection"), a bad
// indptr or last_page_len, or a list longer than max_per_list ("max_per_list") sets the flag
// (launch.workspace->check) and leaves that list empty.
void engine_pages(const EnginePagesArgs& args, const SelectLaunch& launch);

// An upper bound, computable on the host, of the selected pages of any sequence with at most
// max_pages_per_seq pages (size max_per_head with it): min(max_pages, max(budget, kept)),
// kept <= sinks + the pages covering the window + the last page.
int select_capacity(int max_pages_per_seq, int page_size, const select::TopkPolicy& policy);

// The order-preserving key of a bound (-0 as +0) and back; the CPU selector's ordering.
constexpr std::uint32_t bound_to_key(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x + 0.0f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
constexpr float key_to_bound(std::uint32_t k) {
  return std::bit_cast<float>((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

}  // namespace masskv::cuda
