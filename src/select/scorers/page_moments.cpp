// Scorer "page_moments": the §2.4 Gaussian page model (docs/design.md §2.4) from the mean/M2
// summaries (one page-major scan, select/page_scan.hpp). Under softmax a page's mass is
// n_j e^{m_j + v_j/2} (MassSource::page_gaussian) or n_j e^{m_j} (page_mean); under entmax it
// is the model's mass at τ̂, the τ that makes the expected masses sum to 1 (the moments it
// provides). It also scans the §2.3 bounds: the τ̂ reach compares them with τ̂. Its ranking is
// its mass. top_p (page_mean, page_gaussian), gaussian_tau.
#include <algorithm>
#include <limits>

#include "select/gaussian_model.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

struct MomentScratch {
  GaussianPages gauss;
  std::vector<double> cnt, zeros;
};

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  thread_local MomentScratch M;
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * static_cast<std::size_t>(n);
  const SelectorConfig& c = X.c;
  M.cnt.resize(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) M.cnt[j] = X.a.summaries.count[G.phys[j]];
  const bool gaussian = c.mass_source != MassSource::page_mean;
  const double alpha = c.mapping.alpha;
  const bool masses = want.mass || want.rank;  // the ranking is the mass
  S.mass.resize(masses ? ng : 0);
  if (want.rank) S.rank.resize(ng);
  if (want.moments) S.tau.resize(static_cast<std::size_t>(g));
  for (int i = 0; i < g; ++i) {
    const double* m = head_row(X.m, X, G, i);
    const double* v = head_row(X.v, X, G, i);
    double* w = masses ? mass_row(S, n, i) : nullptr;
    if (!c.mapping.is_entmax()) {
      if (w) {
        for (int j = 0; j < n; ++j) {
          w[j] = log_count(std::max(M.cnt[j], 1.0)) + m[j] + (gaussian ? 0.5 * v[j] : 0.0);
        }
        normalise_log(std::span<double>(w, static_cast<std::size_t>(n)));
      }
      if (want.moments) S.tau[i] = std::numeric_limits<double>::quiet_NaN();  // entmax only
    } else {
      std::span<const double> vs(v, static_cast<std::size_t>(n));
      if (!gaussian) {  // page means only: zero variances
        M.zeros.assign(static_cast<std::size_t>(n), 0.0);
        vs = M.zeros;
      }
      M.gauss.assign(std::span<const double>(m, static_cast<std::size_t>(n)), vs, M.cnt, alpha);
      const double tau_hat = M.gauss.solve();
      if (w) {
        M.gauss.masses(tau_hat, std::span<double>(w, static_cast<std::size_t>(n)));
        normalise(std::span<double>(w, static_cast<std::size_t>(n)));
      }
      if (want.moments) S.tau[i] = tau_hat;
    }
    if (want.rank) std::copy_n(w, n, rank_row(S, n, i));
  }
}

}  // namespace

extern const Scorer scorer_page_moments;
const Scorer scorer_page_moments{
    .name = "page_moments",
    .provides = kRank | kHeads | kBound | kMass | kMoments,
    .scans = kBoundScan | kMomentScan,
    .rank_is_mass = true,
    .score = score,
};

}  // namespace masskv::select::detail
