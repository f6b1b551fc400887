// Rule "growth" (EntmaxKV's support growth, docs/design.md §2.2): from a seed of the best pages
// by bound, grow by the largest max_h[(α−1)U_hj − (τ_lo,h(S) − ε_h)] until no unselected page
// can reach any head's threshold (the certificate: the selection holds the whole entmax
// support of every head) or the cap is reached. τ(S) is computed on the exact scores of the
// selected pages, so it reads their keys. A fixed budget then fills the rest by bound. Its
// estimate is τ(S); certified where the certificate held. entmax_support.
#include <algorithm>
#include <cmath>

#include "masskv/select/diagnostics.hpp"
#include "select/scorer.hpp"
#include "select/scores.hpp"

namespace masskv::select::detail {
namespace {

// Per-thread state of the growth: per-head bound lists, their cursors, the thresholds.
struct GrowthScratch {
  std::vector<std::vector<double>> sc;  // [g]: exact scores of the selected pages
  std::vector<std::int32_t> lists;      // [g][depth]
  std::vector<std::size_t> cursor;
  std::vector<double> eps, thr;
};

// Largest |key channel| of the group's pages (for the certificate ε).
double group_key_max(const Context& X, const Group& G) {
  double w = 0;
  if (X.wmax) {  // the bound scan's W of the same f32 summaries: the same value
    for (int j = 0; j < G.pages; ++j) {
      w = std::max(w, static_cast<double>(X.wmax[(G.csr + j) * X.Hkv + G.h]));
    }
    return w;
  }
  const auto& s = X.a.summaries;
  for (int j = 0; j < G.pages; ++j) {
    const std::int64_t at = s.at(G.phys[j], G.h);
    for (int x = 0; x < X.d; ++x) {
      w = std::max({w, std::fabs(static_cast<double>(s.min[at + x])),
                    std::fabs(static_cast<double>(s.max[at + x]))});
    }
  }
  return w;
}

double q_l1(const float* q, int d) {
  double s = 0;
  for (int x = 0; x < d; ++x) s += std::fabs(static_cast<double>(q[x]));
  return s;
}

// Per-head lists of the group's pages by bound, best first (ties: lower id), `depth` deep.
void bound_lists(const Context& X, const Group& G, int depth, Scratch& S, GrowthScratch& R) {
  const int n = G.pages, g = G.g;
  R.lists.resize(static_cast<std::size_t>(g) * depth);
  R.cursor.assign(static_cast<std::size_t>(g), 0);
  for (int i = 0; i < g; ++i) {
    order_by(bound_row(X, G, i), n, nullptr, depth, S.picked);
    std::copy(S.picked.begin(), S.picked.end(),
              R.lists.begin() + static_cast<std::ptrdiff_t>(i) * depth);
  }
}

// Takes, one at a time, the unselected page with the largest max_i (c U_ij - T_i) (ties: the
// lower id) while fewer than `want` were taken (and, with `positive`, while that value is
// > 0); marks them in S.in and appends them to `taken`. The per-head lists are sorted by U_ij, so
// this is their merge: a page's first appearance carries its maximum. Lists `depth` deep suffice
// while at most depth - 1 pages are selected.
int take_best(const Context& X, const Group& G, int depth, double c, const double* T, bool positive,
              int want, Scratch& S, GrowthScratch& R, std::vector<std::int32_t>& taken) {
  const int g = G.g;
  int took = 0;
  while (took < want) {
    int best_i = -1;
    std::int32_t best_j = 0;
    double best = 0;
    for (int i = 0; i < g; ++i) {
      const std::int32_t* L = R.lists.data() + static_cast<std::size_t>(i) * depth;
      std::size_t& k = R.cursor[static_cast<std::size_t>(i)];
      const std::size_t len =
          std::min<std::size_t>(static_cast<std::size_t>(depth), static_cast<std::size_t>(G.pages));
      while (k < len && S.in[static_cast<std::size_t>(L[k])]) ++k;
      if (k == len) continue;
      const std::int32_t j = L[k];
      const double val = c * bound_row(X, G, i)[j] - T[i];
      if (best_i < 0 || val > best || (val == best && j < best_j)) {
        best_i = i;
        best_j = j;
        best = val;
      }
    }
    if (best_i < 0 || (positive && !(best > 0))) break;
    S.in[static_cast<std::size_t>(best_j)] = 1;
    taken.push_back(best_j);
    ++took;
  }
  return took;
}

// The growth (§2.2). Each round adds min(cap - count, violators, max(1, count / 8)) pages.
int grow_support(const Context& X, const Group& G, Scratch& S, int count, int cap, double* estimate,
                 std::uint8_t& certified) {
  thread_local GrowthScratch R;
  const double alpha = X.c.mapping.alpha;
  const int n = G.pages, g = G.g;
  const int depth = std::min(n, cap + 1);
  bound_lists(X, G, depth, S, R);
  S.picked.clear();
  // Seed: the best pages by max-over-heads bound.
  R.thr.assign(static_cast<std::size_t>(g), 0.0);
  count += take_best(X, G, depth, 1.0, R.thr.data(), false, std::min(cap - count, X.c.seed_pages),
                     S, R, S.picked);
  const double w = group_key_max(X, G);
  R.sc.resize(
      static_cast<std::size_t>(std::max<std::size_t>(R.sc.size(), static_cast<std::size_t>(g))));
  R.eps.resize(static_cast<std::size_t>(g));
  for (int i = 0; i < g; ++i) {
    R.sc[static_cast<std::size_t>(i)].clear();
    R.eps[static_cast<std::size_t>(i)] =
        certificate_eps(alpha, X.d, X.scale, q_l1(qrow(X, G.b, G.h * X.gsize + i), X.d), w);
  }
  // The first round scores every selected page, ascending; later rounds the pages they took.
  std::vector<std::int32_t>& fresh = S.kept;
  fresh.clear();
  for (int j = 0; j < n; ++j) {
    if (S.in[static_cast<std::size_t>(j)]) fresh.push_back(j);
  }
  std::vector<double>& T = R.thr;
  certified = 0;
  while (true) {
    for (int i = 0; i < g; ++i) {
      auto& sc = R.sc[static_cast<std::size_t>(i)];
      append_scores(X.a.cache, G.b, G.h, qrow(X, G.b, G.h * X.gsize + i), X.scale,
                    SelectionView::Unit::page, fresh, sc);
      const EntmaxThreshold t = entmax_threshold(std::span<const double>(sc), alpha);
      estimate[i] = t.tau;
      T[static_cast<std::size_t>(i)] = t.tau_lo - R.eps[static_cast<std::size_t>(i)];
    }
    // Any violator left? Peek at the best value without taking it.
    S.picked.clear();
    const int any = take_best(X, G, depth, alpha - 1.0, T.data(), true, 1, S, R, S.picked);
    if (any == 0) {
      certified = 1;
      return count;
    }
    if (count >= cap) {
      S.in[static_cast<std::size_t>(S.picked[0])] = 0;  // over the cap: not taken
      return count;
    }
    const int want = std::min(cap - count, std::max(1, count / 8));
    const int more = take_best(X, G, depth, alpha - 1.0, T.data(), true, want - 1, S, R, S.picked);
    count += 1 + more;
    fresh.assign(S.picked.begin(), S.picked.end());
    std::sort(fresh.begin(), fresh.end());  // the old scan's order: ascending page id
  }
}

int select(const Context& X, const Group& G, Scratch& S, const Limits& L, double* estimate,
           std::uint8_t& certified) {
  const int count = grow_support(X, G, S, L.count, L.cap, estimate, certified);
  // A fixed budget fills the rest by the scorer's ranking; the other kinds stop at the
  // certificate.
  if (X.c.budget.kind != Budget::Kind::fixed) return count;
  X.scorer->score(X, G, S, Want{.rank = true});
  const Ranked r{.rank = S.rank.data(),
                 .rows = score_rows(X, G),
                 .aggregate = pool_heads(X),
                 .log_prob = pool_log_prob(X),
                 .rank_is_mass = X.scorer->rank_is_mass};
  return fill_ranked(G, S, r, count, L.cap, kInf, L.floor);
}

}  // namespace

extern const Rule rule_growth;
const Rule rule_growth{
    .name = "growth",
    .entmax_only = true,
    .stops_itself = true,  // the §2.2 certificate
    .needs = [](const SelectorConfig&) { return unsigned{kRank | kHeads | kBound}; },
    // The certificate's ε needs the keys' largest channel W: the f32 bound scan gives it.
    .scans = [](const SelectArgs& a, const SelectorConfig&) {
      return a.bounds_bf16 ? unsigned{kBoundScan} : unsigned{kKeyMaxScan};
    },
    .select = select,
};

}  // namespace masskv::select::detail
