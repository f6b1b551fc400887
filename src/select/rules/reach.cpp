// Rule "reach" (EntmaxKV's Gaussian τ̂, docs/design.md §2.4): page j is a candidate for q head
// i when its bound can reach the model's threshold, (α−1) U_ij − τ̂_i > −tau_margin, and is
// ranked by that margin. An adaptive budget keeps every reaching page (to the cap); a fixed
// budget fills to its cap by the margin, reaching or not; a top-p budget stops at the
// scorer's mass p. Its estimate is τ̂. gaussian_tau.
#include "select/scorer.hpp"

namespace masskv::select::detail {
namespace {

int select(const Context& X, const Group& G, Scratch& S, const Limits& L, double* estimate,
           std::uint8_t&) {
  const SelectorConfig& c = X.c;
  const Budget::Kind kind = c.budget.kind;
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * static_cast<std::size_t>(n);
  const bool mass = kind == Budget::Kind::top_p;
  X.scorer->score(X, G, S, Want{.mass = mass, .moments = true});
  const double alpha = c.mapping.alpha;
  S.rank.resize(ng);
  S.eligible.assign(ng, 0);
  for (int i = 0; i < g; ++i) {
    const double tau_hat = S.tau[static_cast<std::size_t>(i)];
    estimate[i] = tau_hat;
    const float* U = bound_row(X, G, i);
    double* r = rank_row(S, n, i);
    for (int j = 0; j < n; ++j) {
      r[j] = (alpha - 1.0) * static_cast<double>(U[j]) - tau_hat;
      S.eligible[static_cast<std::size_t>(i) * n + j] = r[j] > -c.tau_margin;
    }
  }
  const Ranked r{.rank = S.rank.data(),
                 .mass = mass ? S.mass.data() : nullptr,
                 .eligible = kind == Budget::Kind::fixed ? nullptr : S.eligible.data(),
                 .rows = g,
                 .aggregate = pool_heads(X),
                 .log_prob = pool_log_prob(X),
                 .rank_is_mass = false};
  const double p = mass ? c.budget.p : kInf;
  return fill_ranked(G, S, r, L.count, L.cap, p, L.floor);
}

}  // namespace

extern const Rule rule_reach;
const Rule rule_reach{
    .name = "reach",
    .entmax_only = true,
    .stops_itself = true,  // the τ̂ reach
    .needs = [](const SelectorConfig&) { return unsigned{kHeads | kBound | kMoments}; },
    .select = select,
};

}  // namespace masskv::select::detail
