// The shared group machinery of the CPU selectors (select/group.hpp): budgets in items, the
// fill loop and the pooling of per-head rankings (the GQA rule, docs/design.md §3).
#include "select/group.hpp"

#include <array>
#include <cmath>

#include "core/cpu_features.hpp"
#include "select/log_prob.hpp"
#include "select/vec_math.hpp"

namespace masskv::select::detail {

int item_cap(const Group& G, const Budget& budget, int kept, bool tokens, bool fill_to_cap) {
  if (budget.tokens <= 0) return fill_to_cap ? kept : G.n;
  const std::int64_t want =
      tokens ? budget.tokens : (budget.tokens + G.page_size - 1) / G.page_size;
  return static_cast<int>(std::min<std::int64_t>(G.n, std::max<std::int64_t>(kept, want)));
}

int item_floor(const Group& G, const Budget& budget, int kept, int cap, bool tokens) {
  if (budget.kind != Budget::Kind::top_p || budget.min_tokens <= 0) return kept;
  const std::int64_t want =
      tokens ? budget.min_tokens : (budget.min_tokens + G.page_size - 1) / G.page_size;
  return static_cast<int>(std::min<std::int64_t>(cap, std::max<std::int64_t>(kept, want)));
}

int fill(std::vector<Voter>& voters, std::size_t nv, std::vector<std::uint8_t>& in,
         std::span<const std::int32_t> kept, int count, int cap, double p, int floor) {
  for (std::size_t i = 0; i < nv; ++i) {
    Voter& v = voters[i];
    v.have = 0;
    v.pos = 0;
    if (v.mass) {
      for (std::int32_t j : kept) v.have += v.mass[j];
    }
  }
  bool progress = true;
  while (count < cap && progress) {
    progress = false;
    for (std::size_t i = 0; i < nv && count < cap; ++i) {
      Voter& v = voters[i];
      if (v.mass && v.have >= p && count >= floor) continue;
      while (v.pos < v.order.size() && in[static_cast<std::size_t>(v.order[v.pos])]) ++v.pos;
      if (v.pos == v.order.size()) continue;
      const std::int32_t j = v.order[v.pos++];
      in[static_cast<std::size_t>(j)] = 1;
      ++count;
      progress = true;
      for (std::size_t w = 0; w < nv; ++w)
        voters[w].have += voters[w].mass ? voters[w].mass[j] : 0.0;
    }
  }
  return count;
}

void normalise_log(std::span<double> w) {
  double mx = -kInf;
  for (double x : w) mx = std::max(mx, x);
  for (double& x : w) x -= mx;
  exp_inplace(w.data(), w.size());
  double s = 0;
  for (double x : w) s += x;
  for (double& x : w) x /= s;
}

void normalise(std::span<double> w) {
  double s = 0;
  for (double x : w) s += x;
  if (s > 0) {
    for (double& x : w) x /= s;
  }
}

// Counts are at most the page size (<= 256) in any cache we make, so a table of std::log's
// values saves a log per page and head.
double log_count(double n) {
  static const std::array<double, 257> table = [] {
    std::array<double, 257> t{};
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::log(static_cast<double>(i));
    return t;
  }();
  return n >= 0 && n <= 256 && n == std::floor(n) ? table[static_cast<std::size_t>(n)]
                                                  : std::log(n);
}

std::uint64_t lse_sum(const double* v, std::int64_t n, double m) {
  if (cpu::has_avx2() && cpu::simd_allowed()) return lse_sum_avx2(v, n, m);
  return lse_sum_portable(v, n, m);
}

namespace {

// The row's LSE as select/log_prob.hpp defines it (the GPU's bits); 0 for an empty row. The
// max in four independent lanes (a max is exact in any order).
double row_lse(const double* v, int n) {
  double m4[4] = {-kInf, -kInf, -kInf, -kInf};
  int j = 0;
  for (; j + 4 <= n; j += 4) {
    for (int l = 0; l < 4; ++l) m4[l] = std::max(m4[l], v[j + l]);
  }
  for (; j < n; ++j) m4[0] = std::max(m4[0], v[j]);
  const double m = std::max(std::max(m4[0], m4[1]), std::max(m4[2], m4[3]));
  return m > -kInf ? lse_finish(m, lse_sum(v, n, m)) : 0.0;
}

}  // namespace

void pool_log_prob(const double* rank, int n, double* agg) {
  const double lse = row_lse(rank, n);
  for (int j = 0; j < n; ++j) agg[j] = std::max(agg[j], rank[j] - lse);
}

namespace {

// The voters' lists, `cap` deep, from rank rows of m columns: one voter per row, or one for the
// pooled row (Ranked::aggregate). Returns the voter count.
std::size_t make_voters(Scratch& S, const Ranked& r, int m, int cap) {
  const auto row = [m](int i) { return static_cast<std::size_t>(i) * static_cast<std::size_t>(m); };
  if (!r.aggregate) {
    const auto nv = static_cast<std::size_t>(r.rows);
    if (S.voters.size() < nv) S.voters.resize(nv);
    for (int i = 0; i < r.rows; ++i) {
      order_by(r.rank + row(i), m, r.eligible ? r.eligible + row(i) : nullptr, cap,
               S.voters[static_cast<std::size_t>(i)].order);
      S.voters[static_cast<std::size_t>(i)].mass = r.mass ? r.mass + row(i) : nullptr;
    }
    return nv;
  }
  const int g = r.rows;
  S.agg_rank.assign(static_cast<std::size_t>(m), r.rank_is_mass ? 0.0 : -kInf);
  if (r.mass) S.agg_mass.assign(static_cast<std::size_t>(m), 0.0);
  if (r.eligible) S.agg_elig.assign(static_cast<std::size_t>(m), 0);
  for (int i = 0; i < g; ++i) {
    const double* rank = r.rank + row(i);
    double* agg = S.agg_rank.data();
    // One tight loop per pooling (they vectorise; the branches stay outside).
    if (r.rank_is_mass) {
      for (int j = 0; j < m; ++j) agg[j] += rank[j] / g;
    } else if (r.log_prob) {  // the max over heads of the head's log-probability
      pool_log_prob(rank, m, agg);
    } else {
      for (int j = 0; j < m; ++j) agg[j] = std::max(agg[j], rank[j]);
    }
    if (r.mass) {
      for (int j = 0; j < m; ++j) S.agg_mass[j] += r.mass[row(i) + j] / g;
    }
    if (r.eligible) {
      for (int j = 0; j < m; ++j) S.agg_elig[j] |= r.eligible[row(i) + j];
    }
  }
  if (S.voters.empty()) S.voters.resize(1);
  order_by(S.agg_rank.data(), m, r.eligible ? S.agg_elig.data() : nullptr, cap,
           S.voters[0].order);
  S.voters[0].mass = r.mass ? S.agg_mass.data() : nullptr;
  return 1;
}

// Voters of rows over a subset (Ranked::items, without mass or eligibility rows), their lists
// mapped to item ids. They equal the lists of the full rows (−inf for every unlisted item)
// when each holds `cap` listed items ranked above −inf: an unlisted item would rank after
// them. Otherwise returns 0 and the caller ranks the full rows.
std::size_t listed_voters(Scratch& S, const Ranked& r, int cap) {
  const int K = static_cast<int>(r.items.size());
  if (K < cap || r.mass || r.eligible) return 0;
  const std::size_t nv = make_voters(S, r, K, cap);
  for (std::size_t v = 0; v < nv; ++v) {
    std::vector<std::int32_t>& order = S.voters[v].order;
    if (!order.empty()) {
      const double* rank = r.aggregate ? S.agg_rank.data()
                                       : r.rank + v * static_cast<std::size_t>(K);
      if (!(rank[order.back()] > -kInf)) return 0;
    }
  }
  for (std::size_t v = 0; v < nv; ++v) {
    for (std::int32_t& j : S.voters[v].order) j = r.items[static_cast<std::size_t>(j)];
  }
  return nv;
}

// Rows over a subset spread to rows of every item (rank −inf, mass 0, not eligible
// elsewhere), held in the given buffers; returns `r` pointing at them.
Ranked spread_rows(const Group& G, const Ranked& r, std::vector<double>& rank,
                   std::vector<double>& mass, std::vector<std::uint8_t>& eligible) {
  const auto n = static_cast<std::size_t>(G.n), K = r.items.size();
  const auto rows = static_cast<std::size_t>(r.rows);
  rank.assign(rows * n, -kInf);
  if (r.mass) mass.assign(rows * n, 0.0);
  if (r.eligible) eligible.assign(rows * n, 0);
  for (std::size_t i = 0; i < rows; ++i) {
    for (std::size_t k = 0; k < K; ++k) {
      const std::size_t to = i * n + static_cast<std::size_t>(r.items[k]);
      rank[to] = r.rank[i * K + k];
      if (r.mass) mass[to] = r.mass[i * K + k];
      if (r.eligible) eligible[to] = r.eligible[i * K + k];
    }
  }
  Ranked full = r;
  full.items = {};
  full.rank = rank.data();
  full.mass = r.mass ? mass.data() : nullptr;
  full.eligible = r.eligible ? eligible.data() : nullptr;
  return full;
}

}  // namespace

int fill_ranked(const Group& G, Scratch& S, const Ranked& r, int count, int cap, double p,
                int floor) {
  const int n = G.n;
  // Items already in, ascending: the masses they hold start each voter's count.
  S.kept.clear();
  for (int j = 0; j < n; ++j) {
    if (S.in[static_cast<std::size_t>(j)]) S.kept.push_back(j);
  }
  std::size_t nv = 0;
  if (r.items.empty()) {
    nv = make_voters(S, r, n, cap);
  } else if (nv = listed_voters(S, r, cap); nv == 0) {
    thread_local std::vector<double> rank, mass;
    thread_local std::vector<std::uint8_t> eligible;
    nv = make_voters(S, spread_rows(G, r, rank, mass, eligible), n, cap);
  }
  return fill(S.voters, nv, S.in, S.kept, count, cap, p, floor);
}

void selected_mass(const Group& G, const Scratch& S, int rows, double* estimate,
                   std::span<const std::int32_t> items) {
  const std::size_t n = items.empty() ? static_cast<std::size_t>(G.n) : items.size();
  const auto item = [&](std::size_t k) {
    return items.empty() ? k : static_cast<std::size_t>(items[k]);
  };
  for (int i = 0; i < G.g; ++i) {
    const double* m = S.mass.data() + (rows == 1 ? 0 : static_cast<std::size_t>(i)) * n;
    double s = 0;
    for (std::size_t k = 0; k < n; ++k) s += S.in[item(k)] ? m[k] : 0.0;
    estimate[i] = s;
  }
}

}  // namespace masskv::select::detail
