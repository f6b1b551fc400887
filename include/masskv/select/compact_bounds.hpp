// Smaller page summaries for the Quest bound (docs/design.md §2.3; issue 7 item 5), the CPU
// references of what the GPU selector scans:
//  - BoundStore8: per (page, kv head) min/max codes of 8 bits on an affine grid lo + step·code
//    (lo, step per (page, head)), min codes rounded down and max codes rounded up, so the bound
//    stays an upper bound of every score in the page. 2·d + 8 bytes per (page, head) against
//    4·d for the bf16 BoundStore.
//  - GroupStore: one bf16 min/max per group of G consecutive logical pages of a sequence
//    (elementwise min of the members' mins, max of their maxes: exact), scanned first; then
//    only the pages of the best groups are scored (hier_select).
// Every bound here is evaluated in one fixed order, the GPU scoring kernel's (which is also
// the CPU AVX2 kernel's): eight FMA chains over channels c ≡ l (mod 8), q+·M and q-·m in
// separate chains, the horizontal sum ((v0+v4)+(v2+v6)) + ((v1+v5)+(v3+v7)), every other
// operation rounded separately. So the GPU's bounds are expected to have these bits on any
// host.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "masskv/kv/page_codes.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::select {

// The value of an 8-bit code: fma(code, step, lo) in f32, one rounding (the kernels' formula;
// kv/page_codes.hpp, where the rounding of ranges onto the grid lives).
using kv::dequant8;

struct BoundStore8View {
  const std::uint8_t* min = nullptr;  // codes [page][kv_head][head_dim]
  const std::uint8_t* max = nullptr;
  const float* grid = nullptr;  // [page][kv_head][2]: lo, step
  int num_pages = 0, num_kv_heads = 0, head_dim = 0;

  std::int64_t at(std::int32_t page, int head) const {
    return (static_cast<std::int64_t>(page) * num_kv_heads + head) * head_dim;
  }
};

// Rounding (per page and kv head, from the f32 summaries m, M; kv::round_range8): lo = min_c m_c,
// hi = max_c M_c, step = the smallest float with fma(255, step, lo) >= hi (0 when hi == lo);
// min code = the largest code whose value is <= m_c, max code = the smallest whose value is
// >= M_c. Both exist: code 0 is lo <= m_c and code 255 is >= hi >= M_c, and the value is
// nondecreasing in the code. A page without tokens (non-finite summaries) gets lo = step = 0.
//
// Why the bound stays an upper bound: for every key k of the page and channel c,
// m~_c <= m_c <= k_c <= M_c <= M~_c (m~, M~ the dequantised codes), so
// q·k = sum_c q_c k_c <= sum_c max(q_c m~_c, q_c M~_c) = q+·M~ + q-·m~ exactly; the f32
// evaluation of that sum is covered by the same slack as the bf16 bound (page_bound.cpp: it
// holds for any float m~, M~, with W = max_c max(|m~_c|, |M~_c|)).
class BoundStore8 {
 public:
  BoundStore8() = default;
  explicit BoundStore8(const kv::SummariesView& s);
  // Re-rounds the listed physical pages from `s`.
  void update(const kv::SummariesView& s, std::span<const std::int32_t> pages);
  BoundStore8View view() const;
  // Codes and grid of every kv head, per token of a full page: (2 H d + 8 H) / page_size.
  double bytes_per_token(int page_size) const;

 private:
  void round_page(const kv::SummariesView& s, std::int32_t page);

  std::vector<std::uint8_t> min_, max_;
  std::vector<float> grid_;
  int num_pages_ = 0, num_kv_heads_ = 0, head_dim_ = 0;
};

// §2.3 bounds from the 8-bit store (the contract of page_upper_bounds in page_bound.hpp:
// out[i * pages.size() + j] for q head i, >= scale * q_i·k for every key k of page j), in the
// GPU order above. Throws Error naming "pages", "kv_head", "q", "num_q", "scale" or "out".
void page_upper_bounds(const BoundStore8View& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out);

// The same for the bf16 store, in the GPU order (page_upper_bounds of page_bound.hpp may use
// another order on a host without AVX2).
void page_upper_bounds_gpu_order(const BoundStoreView& s, std::span<const std::int32_t> pages,
                                 int kv_head, const float* q, int num_q, std::int64_t q_stride,
                                 float scale, std::span<float> out);

// Group summaries of the sequences of `table` over a bf16 page store: sequence b's group i
// covers its logical pages [i·G, min(n_b, (i+1)·G)) and is slot group_indptr()[b] + i of the
// group store, [slot][kv_head][head_dim] bf16 (a BoundStoreView: the same bound formula, the
// same kernels). Rebuild after appends (the last group of a sequence changes).
class GroupStore {
 public:
  GroupStore() = default;
  GroupStore(const BoundStoreView& pages, const kv::PageTable& table, int group_pages);
  BoundStoreView view() const;
  int group_pages() const { return group_pages_; }
  // Sequence b's groups are slots [indptr[b], indptr[b + 1]); indices() lists the slots in
  // order (the group page table: 0, 1, 2, ...).
  std::span<const std::int32_t> indptr() const { return indptr_; }
  std::span<const std::int32_t> indices() const { return indices_; }
  // bf16 min + max per kv head, per token of full groups of full pages: 4 H d / (G · page).
  double bytes_per_token(int page_size) const;

 private:
  std::vector<bf16> min_, max_;
  std::vector<float> wmax_;
  std::vector<std::int32_t> indptr_, indices_;
  int num_slots_ = 0, num_kv_heads_ = 0, head_dim_ = 0, group_pages_ = 16;
};

// Pooled page moments (docs/design.md §2.4: means and second moments pool exactly over groups):
// one f32 mean[d], M2[d] and count per group of G consecutive logical pages of a sequence and
// kv head, slot indptr()[b] + i for sequence b's group i (as GroupStore). Pooled in f64 from
// the pages' f32 Welford state: N = Σ n_j, mean = Σ n_j μ_j / N, M2 = Σ (M2_j + n_j (μ_j −
// mean)²), then rounded to f32. The Gaussian-τ selector estimates τ̂ from these instead of every
// page's statistics: 8 d / (G · page) bytes per token and kv head.
class MomentStore {
 public:
  MomentStore() = default;
  MomentStore(const kv::SummariesView& pages, const kv::PageTable& table, int group_pages);
  // mean, m2 and count over the slots (min, max, max_vnorm null): the page summaries' layout.
  kv::SummariesView view() const;
  int group_pages() const { return group_pages_; }
  std::span<const std::int32_t> indptr() const { return indptr_; }
  std::span<const std::int32_t> indices() const { return indices_; }
  // The group table as a page table over the slots (last_page_len 1: groups have no partial
  // slots), for the per-page scans of page_scan.hpp.
  kv::PageTable table() const { return {indptr_, indices_, last_len_}; }
  double bytes_per_token(int page_size) const;

 private:
  std::vector<float> mean_, m2_;
  std::vector<std::int32_t> count_, indptr_, indices_, last_len_;
  int num_slots_ = 0, num_kv_heads_ = 0, head_dim_ = 0, group_pages_ = 64;
};

// τ̂ of every (sequence, q head) from pooled moments (§2.4: Σ_G N_G E[((α−1)X_G − τ)_+^r] = 1
// with X_G ~ N(m_G, v_G) of the group's pooled mean and variance; gaussian_tau_hat's solver),
// tau[b * Hq + i]. Served: alpha in (1, 2]; a sequence without tokens gets NaN. Throws Error
// naming "q", "store", "alpha" or "tau".
void group_tau_hat(const MomentStore& store, const View3<const float>& q, float scale,
                   double alpha, std::span<double> tau);

// The entmax-aware rank of a page or group bound U of q head i (§2.2, support-aware growth's
// order): float((α−1)·U − τ̂_i), evaluated in f64 (the product is exact) and rounded once; the
// GPU computes the same bits.
inline float entmax_rank(float bound, double am1, double tau) {
  return static_cast<float>(am1 * static_cast<double>(bound) - tau);
}

// How many groups the hierarchical selector scores pages from: the last group (it holds the
// window and the last page) and the best ceil(cover · budget_pages / G) others, at most all.
int hier_groups(int num_groups, int group_pages, int budget_pages, double cover);

struct HierSelectArgs {
  View3<const float> q;  // [B][Hq][d], finite
  kv::PageTable table;
  int page_size = 16;
  const BoundStoreView* pages = nullptr;  // the bf16 page store
  const GroupStore* groups = nullptr;     // built over `pages` and `table`
  // Optional: score the chosen groups' pages from this 8-bit store (of the same summaries)
  // instead of `pages`.
  const BoundStore8View* pages8 = nullptr;
  float scale = 0;  // 0 means 1/sqrt(d)
  TopkPolicy policy;
  double cover = 2.0;  // groups scored: enough for cover × budget pages (hier_groups)
  // Entmax-aware ranking (Gaussian-τ, §2.4): when set, tau[b * Hq + i] is q head i's τ̂ and
  // groups and pages rank by max_i entmax_rank(U_i, alpha − 1, tau_i) instead of max_i U_i.
  const double* tau = nullptr;
  double alpha = 1.5;
  // With tau: adaptive = true keeps only pages whose rank is > −margin (the budget is then a
  // cap: a list may hold fewer pages); false fills the budget as Quest does.
  bool adaptive = false;
  float margin = 0.f;
};

// Hierarchical Quest (an approximation of flat Quest: a page is ranked only when its group is
// among the best): per (sequence, kv head),
//  1. group bounds (max over the group's q heads), the last group and the best
//     hier_groups(...) - 1 others by group bound (ties to the lower group id);
//  2. page bounds of the pages of those groups; every other page gets rank key 0 (below any
//     bound);
//  3. the flat selection rule (kept pages, ties to the lower page id) on those keys.
// Writes the selection; page_keys (optional) receives the pages' keys
// (cuda::bound_to_key of the bound, 0 when not scored), [b][kv head][max_pages_per_seq].
void hier_select(const HierSelectArgs& args, SelectionStorage& out,
                 std::vector<std::uint32_t>* page_keys = nullptr, int keys_stride = 0);

// Hierarchical top-p (softmax; docs/design.md §2.4 page masses, §2.8 top-K ∧ top-p): groups chosen
// as hier_select's (Quest group bounds, cover); each page of the chosen groups and each kept page
// gets the estimated mass  mean_h exp(log n_j + m_hj + v_hj / 2 − log Z_h)  from its own
// summaries (m, v as §2.4: scale q·μ_j, scale² Σ_c q_c² M2_jc / n_j), Z_h = Σ_G N_G exp(m_hG +
// v_hG / 2) over every pooled moment group of the sequence (the total without reading every
// page). The kept pages are in and their masses start the count; candidates follow by mass
// (the float of it; ties to the lower page id) while the count is below p, at most the budget.
struct HierTopPArgs {
  HierSelectArgs hier;  // tau must be null (the groups are chosen by Quest's group bounds)
  kv::SummariesView pages;            // page mean, m2, count of the pages of hier.pages
  const MomentStore* moments = nullptr;  // pooled over the same table
  double p = 0.9;                     // in (0, 1]
};
// masses (optional): [b][kv head][keys_stride] the estimated mass of every kept page and, when
// the budget leaves pages to take, every candidate page (0 elsewhere).
void hier_top_p(const HierTopPArgs& args, SelectionStorage& out,
                std::vector<double>* masses = nullptr, int keys_stride = 0);
// The rule alone on given masses of one (sequence, kv head) of n pages: candidate[j] flags the
// ranked pages of [sinks, window); returns the count and writes out as select_by_keys.
int top_p_by_masses(const double* mass, const std::uint8_t* candidate, int n, std::int64_t length,
                    int page_size, const TopkPolicy& policy, double p, std::int32_t* out,
                    int out_size);

// Flat Quest on the 8-bit store (the CPU reference of the GPU's 8-bit selection); page_keys as
// hier_select.
void quest_select8(const View3<const float>& q, const kv::PageTable& table, int page_size,
                   const BoundStore8View& store, float scale, const TopkPolicy& policy,
                   SelectionStorage& out, std::vector<std::uint32_t>* page_keys = nullptr,
                   int keys_stride = 0);

// How many ids two ascending lists share (a merge).
std::size_t common_ids(std::span<const std::int32_t> a, std::span<const std::int32_t> b);

// Recall of `ref`'s selected pages in `got` (same shape), over the (sequence, kv head) lists:
// |got ∩ ref| / |ref| summed over lists; and how many lists are identical.
struct SelectionAgreement {
  long lists = 0, identical = 0;
  double recall = 1.0;  // 1 when ref selects nothing
};
SelectionAgreement compare_selections(const SelectionView& ref, const SelectionView& got);

}  // namespace masskv::select
