// Scorer "exact": the true attention distribution (§2.7, docs/design.md): every key's exact
// score (f64), mapped by the config's softmax or entmax over the whole sequence, summed per
// page (or per token with oracle_tokens); with oracle_head_collapsed every head sees the mean
// over all q heads (and the rules pool the group: select/scorer.hpp's pool_heads). A
// reference, not a selector one would run: it reads every key. Its ranking is its mass.
// oracle.
#include <algorithm>
#include <numeric>

#include "select/scorer.hpp"
#include "select/scores.hpp"

namespace masskv::select::detail {
namespace {

// Context::prepared[b]: [Hq][items], one task per (sequence, q head).
void prepare(Context& X) {
  const auto& t = X.a.cache.table;
  const int B = t.batch(), P = X.a.cache.page_size;
  X.prepared.resize(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    const std::int64_t L = t.length(b, P);
    const int items = X.tokens ? static_cast<int>(L) : t.num_pages(b);
    X.prepared[b].assign(static_cast<std::size_t>(X.Hq) * items, 0.0);
  }
  const int tasks = B * X.Hq;
#pragma omp parallel if (tasks > 1)
  {
    std::vector<double> s, p;
    std::vector<std::int32_t> pages;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / X.Hq, qh = task % X.Hq;
      const int np = t.num_pages(b);
      pages.resize(static_cast<std::size_t>(np));
      std::iota(pages.begin(), pages.end(), 0);
      s.clear();
      append_scores(X.a.cache, b, qh / X.gsize, qrow(X, b, qh), X.scale, SelectionView::Unit::page,
                    pages, s);
      p.resize(s.size());
      if (X.c.mapping.is_entmax()) {
        entmax(std::span<const double>(s), X.c.mapping.alpha, std::span<double>(p));
      } else {
        softmax(std::span<const double>(s), std::span<double>(p));
      }
      const int items = X.tokens ? static_cast<int>(s.size()) : np;
      double* out = X.prepared[b].data() + static_cast<std::size_t>(qh) * items;
      for (std::size_t i = 0; i < p.size(); ++i) out[X.tokens ? i : i / P] += p[i];
    }
  }
  if (X.c.oracle_head_collapsed) {  // every head sees the mean over all heads
    for (auto& m : X.prepared) {
      const std::size_t items = m.size() / X.Hq;
      for (std::size_t j = 0; j < items; ++j) {
        double s = 0;
        for (int h = 0; h < X.Hq; ++h) s += m[h * items + j];
        for (int h = 0; h < X.Hq; ++h) m[h * items + j] = s / X.Hq;
      }
    }
  }
}

void score(const Context& X, const Group& G, Scratch& S, const Want& want) {
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * static_cast<std::size_t>(n);
  const auto& om = X.prepared[static_cast<std::size_t>(G.b)];
  const int first = X.c.oracle_head_collapsed ? 0 : G.h * X.gsize;
  S.mass.resize(want.mass ? ng : 0);
  if (want.rank) S.rank.resize(ng);
  for (int i = 0; i < g; ++i) {
    const auto row = om.begin() + static_cast<std::ptrdiff_t>(first + i) * n;
    if (want.mass) std::copy_n(row, n, mass_row(S, n, i));
    if (want.rank) std::copy_n(row, n, rank_row(S, n, i));
  }
}

}  // namespace

extern const Scorer scorer_exact;
const Scorer scorer_exact{
    .name = "exact",
    .provides = kRank | kHeads | kMass,
    .rank_is_mass = true,
    .tokens = [](const SelectorConfig& c) { return c.oracle_tokens; },
    .prepare = prepare,
    .score = score,
};

}  // namespace masskv::select::detail
