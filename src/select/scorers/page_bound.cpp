// Scorer "page_bound": the §2.3 upper bound U_ij of each page's logits (docs/design.md §2.3),
// from the f32 min/max summaries or the outward-rounded bf16 store (SelectArgs::bounds_bf16),
// one page-major scan for the batch (select/page_scan.hpp). Its mass is the bound pseudo-mass
// n_j e^{U_j}, normalised: an over-estimate of every page's weight. quest, entmax_support.
#include <algorithm>

#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

// Normalised bound pseudo-masses n_j e^{U_j} of one head.
void bound_masses(const Context& X, const Group& G, const float* U, double* out) {
  const std::int32_t* cnt = X.a.summaries.count;
  for (int j = 0; j < G.pages; ++j) {
    out[j] = log_count(static_cast<double>(cnt[G.phys[j]])) + static_cast<double>(U[j]);
  }
  normalise_log(std::span<double>(out, static_cast<std::size_t>(G.pages)));
}

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * static_cast<std::size_t>(n);
  if (want.rank) {
    S.rank.resize(ng);
    for (int i = 0; i < g; ++i) std::copy_n(bound_row(X, G, i), n, rank_row(S, n, i));
  }
  S.mass.resize(want.mass ? ng : 0);
  if (want.mass) {
    for (int i = 0; i < g; ++i) bound_masses(X, G, bound_row(X, G, i), mass_row(S, n, i));
  }
}

}  // namespace

extern const Scorer scorer_page_bound;
const Scorer scorer_page_bound{
    .name = "page_bound",
    .provides = kRank | kHeads | kBound | kMass,
    .scans = kBoundScan,
    .score = score,
};

}  // namespace masskv::select::detail
