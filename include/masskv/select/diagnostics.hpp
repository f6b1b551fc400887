// Per step and q head diagnostics of a selection (docs/design.md §2.2, §2.5, §4): the entmax
// exactness certificate with its margin, certified dropped-mass (δ) bounds for softmax and
// entmax that read no unselected key, the run-time output-error bound, and in study mode the
// measured quantities (they need the dense pass) with a check that every bound held.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/mapping.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::select {

// Absolute forward-error bound, in score units, of one f32 score scale·q·k over d channels
// with |k_c| <= w: γ_{d+4}·scale·‖q‖₁·w, γ_n = n·u/(1 − n·u), u = 2^-24 (products, sums in any
// order with or without FMA, the scale multiply and the (α−1) multiply).
double score_error_bound(int d, double scale, double q_l1, double w);

// The §2.2 certificate slack ε in z units: an unselected key's computed score may exceed its
// exact one by the bound and tau(S), solved on computed scores, may sit that much lower, so
// ε = 2(α−1)·score_error_bound.
double certificate_eps(double alpha, int d, double scale, double q_l1, double w);

// Throws Error naming `selection` unless it is a valid selection of `table`: shape
// [B][num_kv_heads], counts in [0, max_per_head], ids ascending, in range, -1 padded.
void check_selection(const SelectionView& selection, const kv::PageTable& table, int page_size,
                     int num_kv_heads);

struct DiagnosticsArgs {
  View3<const float> q;  // [B][Hq][d]
  kv::PagedKVView cache;
  kv::SummariesView summaries;                  // bounds (min/max), max ‖v‖ per page
  const BoundStoreView* bounds_bf16 = nullptr;  // optional: bounds from the bf16 store
  Mapping mapping = Mapping::softmax();
  float scale = 0;  // 0 means 1/sqrt(d)
  const SelectionView* selection = nullptr;
  // Study mode: reads every key and value for the measured δ, recall, ‖o − ô‖ (f64).
  bool study = false;
};

struct HeadDiagnostics {
  std::int64_t selected_tokens = 0, total_tokens = 0;
  // entmax (§2.2): margin = tau_lo(S) − ε − (α−1)·max_{j∉S} U_j in z units (+inf when every
  // page is selected); certified = margin >= 0. softmax: certified = nothing unselected.
  bool certified = false;
  double margin = 0, tau_lo = 0, eps = 0;
  double tau_or_lse = 0;   // entmax tau(S) / softmax log-sum-exp of the selected scores
  double delta_bound = 1;  // certified upper bound on δ (§2.5), rounded up, in [0, 1]
  double error_bound = 0;  // bound on ‖o − ô‖: δ_bound·(max_{S}‖v‖ + max_{∉S}‖v‖)
  // Study mode only (NaN otherwise).
  double delta = NAN, recall = NAN, abs_error = NAN, rel_error = NAN;
  std::int64_t support = 0;  // entmax support size / softmax 90%-mass set size
  bool bounds_held = true;   // δ <= δ_bound, ‖o − ô‖ <= error_bound, certified ⇒ ô = o
};

// One entry per (b, q head), [B][Hq]. Validates (throws Error naming the argument).
// Tokens of pages not fully selected count as unselected for the bounds (§2.2).
void diagnose(const DiagnosticsArgs& args, std::vector<HeadDiagnostics>& out);

}  // namespace masskv::select
