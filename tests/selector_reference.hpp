// The selectors as they were before the cost work (commit 4a50dc2): a plain, unoptimised
// reference (per-group strided summary reads, partial_sort rankings, a bisection tau_hat, a
// full violator scan per growth round) that the fast run_selector must reproduce.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::select::reference {

// The bisection of the §2.1 bracket the selectors used before the Newton solve.
inline double tau_hat_bisection(std::span<const double> m, std::span<const double> v,
                                std::span<const double> n, double alpha) {
  auto total = [&](double tau) {
    double s = 0;
    for (std::size_t j = 0; j < m.size(); ++j) {
      if (n[j] > 0) s += n[j] * gaussian_entmax_mass(m[j], v[j], alpha, tau);
    }
    return s;
  };
  double lo = -std::numeric_limits<double>::infinity(), hi = lo;
  for (std::size_t j = 0; j < m.size(); ++j) {
    if (n[j] <= 0) continue;
    const double a = (alpha - 1.0) * m[j], b = (alpha - 1.0) * std::sqrt(std::max(v[j], 0.0));
    lo = std::max(lo, a - 1.0);
    hi = std::max(hi, a + 40.0 * b + 1.0);
  }
  for (int it = 0; it < 200 && hi - lo > 1e-8 * std::max(1.0, std::fabs(lo)); ++it) {
    const double mid = 0.5 * (lo + hi);
    (total(mid) >= 1.0 ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// One (sequence, kv head): the unit of work and of the shared selection.
struct Group {
  int b = 0, h = 0, g = 0;  // g: q heads in the group (or all heads, head-collapsed oracle)
  int n = 0;                // items: pages, or tokens for the token oracle
  int pages = 0, page_size = 0;
  std::int64_t length = 0;
  std::span<const std::int32_t> phys;  // physical pages in logical order
};

// Always-kept items (§3): sink pages, pages covering the last W tokens, the last page.
// Token items: the same tokens.
inline std::vector<std::uint8_t> kept_items(const Group& G, const SelectorConfig& c, bool tokens) {
  std::vector<std::uint8_t> in(static_cast<std::size_t>(G.n), 0);
  const std::int64_t P = G.page_size;
  const std::int64_t sink_end = std::min<std::int64_t>(c.sink_pages, G.pages) * P;
  const std::int64_t last_page_start = (G.pages - 1) * P;
  const std::int64_t win_start =
      std::min(last_page_start, std::max<std::int64_t>(0, G.length - c.window_tokens));
  for (std::int64_t t = 0; t < G.length; ++t) {
    if (t < sink_end || t >= win_start) in[static_cast<std::size_t>(tokens ? t : t / P)] = 1;
  }
  return in;
}

// Items of a selection: how many the rule may hold.
inline int item_cap(const Group& G, const Budget& budget, int kept, bool tokens, bool fill_to_cap) {
  if (budget.tokens <= 0) return fill_to_cap ? kept : G.n;
  const std::int64_t want =
      tokens ? budget.tokens : (budget.tokens + G.page_size - 1) / G.page_size;
  return static_cast<int>(std::min<std::int64_t>(G.n, std::max<std::int64_t>(kept, want)));
}

// A ranking of one voter (a q head, or the group's aggregate): candidate items best first,
// ties to the lower id. Only the first `limit` are needed by a fill of at most `limit`.
inline std::vector<std::int32_t> order_by(const double* rank, int n, const std::uint8_t* eligible,
                                   int limit) {
  std::vector<std::int32_t> ids;
  ids.reserve(static_cast<std::size_t>(n));
  for (int j = 0; j < n; ++j) {
    if (!eligible || eligible[j]) ids.push_back(j);
  }
  auto better = [rank](std::int32_t x, std::int32_t y) {
    return rank[x] > rank[y] || (rank[x] == rank[y] && x < y);
  };
  const std::size_t k = std::min<std::size_t>(ids.size(), static_cast<std::size_t>(limit));
  std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), better);
  ids.resize(k);
  return ids;
}

struct Voter {
  std::vector<std::int32_t> order;
  const double* mass = nullptr;  // normalised estimated mass per item, or none
  double have = 0;
};

// The fill loop: voters take turns adding their best unselected item (round robin, which is
// the union of per-head top lists cut to the budget) until `cap` items are in, every voter
// with a mass estimate holds >= p of it, or no voter has candidates left.
inline int fill(std::vector<Voter>& voters, std::vector<std::uint8_t>& in, int count, int cap, double p) {
  for (auto& v : voters) {
    v.have = 0;
    if (v.mass) {
      for (std::size_t j = 0; j < in.size(); ++j) v.have += in[j] ? v.mass[j] : 0.0;
    }
  }
  std::vector<std::size_t> pos(voters.size(), 0);
  bool progress = true;
  while (count < cap && progress) {
    progress = false;
    for (std::size_t i = 0; i < voters.size() && count < cap; ++i) {
      Voter& v = voters[i];
      if (v.mass && v.have >= p) continue;
      while (pos[i] < v.order.size() && in[static_cast<std::size_t>(v.order[pos[i]])]) ++pos[i];
      if (pos[i] == v.order.size()) continue;
      const std::int32_t j = v.order[pos[i]++];
      in[static_cast<std::size_t>(j)] = 1;
      ++count;
      progress = true;
      for (auto& w : voters) w.have += w.mass ? w.mass[j] : 0.0;
    }
  }
  return count;
}

// Normalises exp(logw) in place to masses summing to 1.
inline void normalise_log(std::vector<double>& w) {
  double mx = -kInf;
  for (double x : w) mx = std::max(mx, x);
  double s = 0;
  for (double& x : w) s += (x = std::exp(x - mx));
  for (double& x : w) x /= s;
}
inline void normalise(std::span<double> w) {
  double s = 0;
  for (double x : w) s += x;
  if (s > 0) {
    for (double& x : w) x /= s;
  }
}

// Per group q head: page model (§2.4) m_j = scale q·μ_j, v_j = scale² Σ_c q_c² σ²_jc.
inline void page_moments(const kv::SummariesView& s, const Group& G, const float* q, double scale,
                  std::vector<double>& m, std::vector<double>& v, std::vector<double>& cnt) {
  const int d = s.head_dim;
  m.assign(static_cast<std::size_t>(G.pages), 0);
  v.assign(m.size(), 0);
  cnt.assign(m.size(), 0);
  for (int j = 0; j < G.pages; ++j) {
    const std::int64_t at = s.at(G.phys[j], G.h);
    const double c = s.count[G.phys[j]];
    double mm = 0, vv = 0;
    for (int x = 0; x < d; ++x) {
      const double qx = q[x];
      mm += qx * s.mean[at + x];
      vv += qx * qx * (c > 0 ? std::max(0.0, static_cast<double>(s.m2[at + x])) / c : 0.0);
    }
    m[j] = scale * mm;
    v[j] = scale * scale * vv;
    cnt[j] = c;
  }
}

struct Context {
  const SelectArgs& a;
  const SelectorConfig& c;
  int d = 0, Hq = 0, Hkv = 0, gsize = 0;
  float scale = 0;
  bool tokens = false;  // token oracle
  // Oracle: true mass per (b, q head) over items, [b] -> [Hq][items].
  std::vector<std::vector<double>> oracle_mass;
};

inline const float* qrow(const Context& X, int b, int qh) { return X.a.q.row(b, qh); }

inline void group_bounds(const Context& X, const Group& G, std::vector<float>& U) {
  U.resize(static_cast<std::size_t>(G.g) * G.pages);
  const float* q0 = qrow(X, G.b, G.h * X.gsize);
  if (X.a.bounds_bf16) {
    page_upper_bounds(*X.a.bounds_bf16, G.phys, G.h, q0, G.g, X.a.q.s1, X.scale, U);
  } else {
    page_upper_bounds(X.a.summaries, G.phys, G.h, q0, G.g, X.a.q.s1, X.scale, U);
  }
}

// Largest |key channel| of the group's pages (for the certificate ε).
inline double group_key_max(const Context& X, const Group& G) {
  double w = 0;
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

inline double q_l1(const float* q, int d) {
  double s = 0;
  for (int x = 0; x < d; ++x) s += std::fabs(static_cast<double>(q[x]));
  return s;
}

// entmax_support (§2.2): grow by the largest max_h[(α−1)U_hj − (τ_lo,h(S) − ε_h)] until no
// unselected page can reach any head's threshold, or the cap is reached.
inline int grow_support(const Context& X, const Group& G, std::vector<std::uint8_t>& in, int count,
                 int cap, double* estimate, std::uint8_t& certified) {
  const double alpha = X.c.mapping.alpha;
  std::vector<float> U;
  group_bounds(X, G, U);
  const int n = G.pages, g = G.g;
  // Seed: the best pages by max-over-heads bound.
  std::vector<double> agg(static_cast<std::size_t>(n), -kInf);
  for (int i = 0; i < g; ++i) {
    for (int j = 0; j < n; ++j) agg[j] = std::max(agg[j], static_cast<double>(U[i * n + j]));
  }
  {
    std::vector<Voter> seed(1);
    seed[0].order = order_by(agg.data(), n, nullptr, count + X.c.seed_pages);
    count = fill(seed, in, count, std::min(cap, count + X.c.seed_pages), kInf);
  }
  const double w = group_key_max(X, G);
  std::vector<std::vector<double>> sc(static_cast<std::size_t>(g));
  std::vector<double> eps(static_cast<std::size_t>(g)), tau_lo(eps.size());
  std::vector<std::uint8_t> scored(static_cast<std::size_t>(n), 0);
  std::vector<std::int32_t> fresh;
  std::vector<double> viol(static_cast<std::size_t>(n));
  for (int i = 0; i < g; ++i) {
    eps[i] = certificate_eps(alpha, X.d, X.scale, q_l1(qrow(X, G.b, G.h * X.gsize + i), X.d), w);
  }
  certified = 0;
  while (true) {
    fresh.clear();
    for (int j = 0; j < n; ++j) {
      if (in[j] && !scored[j]) {
        fresh.push_back(j);
        scored[j] = 1;
      }
    }
    for (int i = 0; i < g; ++i) {
      std::vector<double> more;
      exact_scores(X.a.cache, G.b, G.h, qrow(X, G.b, G.h * X.gsize + i), X.scale,
                   SelectionView::Unit::page, fresh, more);
      sc[i].insert(sc[i].end(), more.begin(), more.end());
      const EntmaxThreshold t = entmax_threshold(std::span<const double>(sc[i]), alpha);
      tau_lo[i] = t.tau_lo;
      estimate[i] = t.tau;
    }
    int violators = 0;
    for (int j = 0; j < n; ++j) {
      double v = -kInf;
      if (!in[j]) {
        for (int i = 0; i < g; ++i) {
          v = std::max(v, (alpha - 1.0) * U[i * n + j] - (tau_lo[i] - eps[i]));
        }
      }
      viol[j] = v;
      violators += v > 0;
    }
    if (violators == 0) {
      certified = 1;
      return count;
    }
    if (count >= cap) return count;
    const int add = std::min({cap - count, violators, std::max(1, count / 8)});
    std::vector<Voter> grow(1);
    grow[0].order = order_by(viol.data(), n, nullptr, add);
    count = fill(grow, in, count, count + add, kInf);
  }
}

// Everything of one group except entmax_support: rankings, masses, rule, fill.
inline void select_group(const Context& X, const Group& G, std::vector<std::uint8_t>& in, int& count,
                  int cap, double* estimate, std::uint8_t& certified) {
  const SelectorConfig& c = X.c;
  const Method method = c.method;
  const Budget::Kind kind = c.budget.kind;
  const int n = G.n, g = G.g;
  certified = 0;
  if (method == Method::dense) {
    std::fill(in.begin(), in.end(), 1);
    count = n;
    std::fill(estimate, estimate + g, 1.0);
    return;
  }
  if (method == Method::entmax_support) {
    if (kind == Budget::Kind::fixed) {  // grow to the budget: the certificate is reported only
      count = grow_support(X, G, in, count, cap, estimate, certified);
      // grow_support stops at the certificate; fill the rest of the budget by bound below.
    } else {
      count = grow_support(X, G, in, count, cap, estimate, certified);
      return;
    }
  }
  // rank[i][j], mass[i][j] per q head i of the group.
  std::vector<std::vector<double>> rank(static_cast<std::size_t>(g)), mass;
  bool rank_is_mass = false;
  std::vector<std::uint8_t> eligible;  // per head [g][n], adaptive rules only
  double p = kind == Budget::Kind::fixed ? kInf : c.budget.p;
  const double alpha = c.mapping.alpha;
  std::vector<float> U;
  if (method == Method::sink_recent) {
    for (auto& r : rank) {
      r.resize(static_cast<std::size_t>(n));
      std::iota(r.begin(), r.end(), 0.0);  // the most recent first
    }
    std::fill(estimate, estimate + g, std::numeric_limits<double>::quiet_NaN());
  } else if (method == Method::oracle) {
    mass.resize(static_cast<std::size_t>(g));
    const auto& om = X.oracle_mass[static_cast<std::size_t>(G.b)];
    const int first = c.oracle_head_collapsed ? 0 : G.h * X.gsize;
    for (int i = 0; i < g; ++i) {
      mass[i].assign(om.begin() + static_cast<std::ptrdiff_t>(first + i) * n,
                     om.begin() + static_cast<std::ptrdiff_t>(first + i + 1) * n);
      rank[i] = mass[i];
    }
    rank_is_mass = true;
  } else {
    group_bounds(X, G, U);
    for (int i = 0; i < g; ++i) rank[i].assign(U.begin() + i * n, U.begin() + (i + 1) * n);
    if (method == Method::quest || method == Method::entmax_support) {
      // Bound pseudo-mass n_j e^{U_j}: an over-estimate of every page's weight.
      mass.resize(static_cast<std::size_t>(g));
      for (int i = 0; i < g; ++i) {
        mass[i].resize(static_cast<std::size_t>(n));
        for (int j = 0; j < n; ++j) {
          mass[i][j] = std::log(static_cast<double>(X.a.summaries.count[G.phys[j]])) + rank[i][j];
        }
        normalise_log(mass[i]);
      }
    } else {  // top_p, gaussian_tau: the §2.4 page model
      mass.resize(static_cast<std::size_t>(g));
      std::vector<double> m, v, cnt;
      const bool gaussian = c.mass_source == MassSource::page_gaussian;
      if (method == Method::gaussian_tau) eligible.assign(static_cast<std::size_t>(g) * n, 0);
      for (int i = 0; i < g; ++i) {
        page_moments(X.a.summaries, G, qrow(X, G.b, G.h * X.gsize + i), X.scale, m, v, cnt);
        if (!gaussian) std::fill(v.begin(), v.end(), 0.0);
        auto& w = mass[i];
        w.resize(static_cast<std::size_t>(n));
        if (!c.mapping.is_entmax()) {
          for (int j = 0; j < n; ++j) w[j] = std::log(std::max(cnt[j], 1.0)) + m[j] + 0.5 * v[j];
          normalise_log(w);
        } else {
          const double tau_hat = tau_hat_bisection(m, v, cnt, alpha);
          for (int j = 0; j < n; ++j)
            w[j] = cnt[j] * gaussian_entmax_mass(m[j], v[j], alpha, tau_hat);
          normalise(w);
          if (method == Method::gaussian_tau) {
            estimate[i] = tau_hat;
            for (int j = 0; j < n; ++j) {
              rank[i][j] = (alpha - 1.0) * rank[i][j] - tau_hat;
              eligible[static_cast<std::size_t>(i) * n + j] = rank[i][j] > -c.tau_margin;
            }
          }
        }
        if (method == Method::top_p) {
          if (kind == Budget::Kind::adaptive && c.budget.tokens > 0) {
            // Twilight: candidates are the head's top-cap pages by bound, then by mass.
            eligible.resize(static_cast<std::size_t>(g) * n, 0);
            for (std::int32_t j : order_by(rank[i].data(), n, nullptr, cap)) {
              eligible[static_cast<std::size_t>(i) * n + j] = 1;
            }
          }
          rank[i] = w;
        }
      }
      rank_is_mass = method == Method::top_p;
      if (method == Method::gaussian_tau && kind == Budget::Kind::adaptive) p = kInf;
    }
  }
  if (kind == Budget::Kind::top_p || (kind == Budget::Kind::adaptive && method == Method::top_p)) {
    require(!mass.empty(), ErrorCode::invalid_argument, "budget",
            "a top-p budget needs a selector with a mass estimate (not ", to_string(method), ")");
  }
  if (kind == Budget::Kind::fixed || method != Method::gaussian_tau) {
    if (!(kind == Budget::Kind::adaptive && method == Method::top_p)) eligible.clear();
  }

  std::vector<Voter> voters;
  std::vector<double> agg_rank, agg_mass, agg_elig_rank;
  std::vector<std::uint8_t> agg_elig;
  const bool aggregate = c.group == GroupRule::aggregate || c.oracle_head_collapsed;
  if (!aggregate) {
    voters.resize(static_cast<std::size_t>(g));
    for (int i = 0; i < g; ++i) {
      voters[i].order =
          order_by(rank[i].data(), n, eligible.empty() ? nullptr : eligible.data() + i * n, cap);
      voters[i].mass = mass.empty() ? nullptr : mass[i].data();
    }
  } else {
    agg_rank.assign(static_cast<std::size_t>(n), rank_is_mass ? 0.0 : -kInf);
    if (!mass.empty()) agg_mass.assign(static_cast<std::size_t>(n), 0.0);
    if (!eligible.empty()) agg_elig.assign(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < g; ++i) {
      for (int j = 0; j < n; ++j) {
        // Mass ranks pool by the mean (the head-averaged mass of §2.7); bound ranks by the
        // max, so a page one head needs is not outvoted (as select_topk_pages does).
        agg_rank[j] =
            rank_is_mass ? agg_rank[j] + rank[i][j] / g : std::max(agg_rank[j], rank[i][j]);
        if (!mass.empty()) agg_mass[j] += mass[i][j] / g;
        if (!eligible.empty()) agg_elig[j] |= eligible[static_cast<std::size_t>(i) * n + j];
      }
    }
    voters.resize(1);
    voters[0].order =
        order_by(agg_rank.data(), n, agg_elig.empty() ? nullptr : agg_elig.data(), cap);
    voters[0].mass = agg_mass.empty() ? nullptr : agg_mass.data();
  }
  count = fill(voters, in, count, cap, p);
  if (method != Method::sink_recent && method != Method::gaussian_tau &&
      method != Method::entmax_support) {
    for (int i = 0; i < g; ++i) {  // the estimated mass of the selection, per head
      double s = 0;
      for (int j = 0; j < n; ++j) s += in[j] ? mass[i][j] : 0.0;
      estimate[i] = s;
    }
  }
}

// Oracle masses (§2.7): the true distribution of every q head over every token (f64), summed
// per page for page items.
inline void oracle_masses(Context& X) {
  const auto& t = X.a.cache.table;
  const int B = t.batch(), P = X.a.cache.page_size;
  X.oracle_mass.resize(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    const std::int64_t L = t.length(b, P);
    const int items = X.tokens ? static_cast<int>(L) : t.num_pages(b);
    X.oracle_mass[b].assign(static_cast<std::size_t>(X.Hq) * items, 0.0);
  }
  const int tasks = B * X.Hq;
  {
    std::vector<double> s, p;
    std::vector<std::int32_t> pages;
    for (int task = 0; task < tasks; ++task) {
      const int b = task / X.Hq, qh = task % X.Hq;
      const int np = t.num_pages(b);
      pages.resize(static_cast<std::size_t>(np));
      std::iota(pages.begin(), pages.end(), 0);
      s.clear();
      exact_scores(X.a.cache, b, qh / X.gsize, qrow(X, b, qh), X.scale,
                   SelectionView::Unit::page, pages, s);
      p.resize(s.size());
      if (X.c.mapping.is_entmax()) {
        entmax(std::span<const double>(s), X.c.mapping.alpha, std::span<double>(p));
      } else {
        softmax(std::span<const double>(s), std::span<double>(p));
      }
      const int items = X.tokens ? static_cast<int>(s.size()) : np;
      double* out = X.oracle_mass[b].data() + static_cast<std::size_t>(qh) * items;
      for (std::size_t i = 0; i < p.size(); ++i) out[X.tokens ? i : i / P] += p[i];
    }
  }
  if (X.c.oracle_head_collapsed) {  // every head sees the mean over all heads
    for (auto& m : X.oracle_mass) {
      const std::size_t items = m.size() / X.Hq;
      for (std::size_t j = 0; j < items; ++j) {
        double s = 0;
        for (int h = 0; h < X.Hq; ++h) s += m[h * items + j];
        for (int h = 0; h < X.Hq; ++h) m[h * items + j] = s / X.Hq;
      }
    }
  }
}

inline void run_selector(const SelectArgs& args, const SelectorConfig& config, SelectOutput& out) {
  Context X{args, config, 0, 0, 0, 0, 0.0f, false, {}};
  X.d = args.cache.head_dim;
  X.Hq = args.q.n1;
  X.Hkv = args.cache.num_kv_heads;
  X.gsize = X.Hq / X.Hkv;
  X.scale = args.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(X.d)) : args.scale;
  X.tokens = config.method == Method::oracle && config.oracle_tokens;
  if (config.method == Method::oracle) oracle_masses(X);

  const auto& t = args.cache.table;
  const int B = t.batch(), P = args.cache.page_size;
  std::vector<Group> groups;
  std::vector<int> caps;
  int max_cap = 0;
  const bool fill_to_cap = config.budget.kind == Budget::Kind::fixed;
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < X.Hkv; ++h) {
      Group G;
      G.b = b;
      G.h = h;
      G.g = X.gsize;
      G.pages = t.num_pages(b);
      G.page_size = P;
      G.length = t.length(b, P);
      G.n = X.tokens ? static_cast<int>(G.length) : G.pages;
      G.phys = t.indices.subspan(static_cast<std::size_t>(t.indptr[b]),
                                 static_cast<std::size_t>(G.pages));
      const auto kept = kept_items(G, config, X.tokens);
      const int k = static_cast<int>(std::count(kept.begin(), kept.end(), 1));
      const int cap = config.method == Method::dense
                          ? G.n
                          : item_cap(G, config.budget, k, X.tokens, fill_to_cap);
      groups.push_back(G);
      caps.push_back(cap);
      max_cap = std::max(max_cap, cap);
    }
  }
  out.selection.reset(X.tokens ? SelectionView::Unit::token : SelectionView::Unit::page, B, X.Hkv,
                      max_cap);
  out.estimate.assign(static_cast<std::size_t>(B) * X.Hq, std::numeric_limits<double>::quiet_NaN());
  out.certified.assign(static_cast<std::size_t>(B) * X.Hkv, 0);
  const int tasks = static_cast<int>(groups.size());
  // The only throw left (a top-p budget without a mass estimate) is decided by the config:
  // check it once, outside the parallel region.
  if (config.budget.kind == Budget::Kind::top_p ||
      (config.budget.kind == Budget::Kind::adaptive && config.method == Method::top_p)) {
    require(config.method != Method::dense && config.method != Method::sink_recent,
            ErrorCode::invalid_argument, "budget", "a top-p budget needs a mass estimate (not ",
            to_string(config.method), ")");
  }
  for (int task = 0; task < tasks; ++task) {
    const Group& G = groups[task];
    std::vector<std::uint8_t> in = kept_items(G, config, X.tokens);
    int count = static_cast<int>(std::count(in.begin(), in.end(), 1));
    double* est = out.estimate.data() + static_cast<std::size_t>(G.b) * X.Hq + G.h * X.gsize;
    select_group(X, G, in, count, caps[task], est, out.certified[task]);
    const std::span<std::int32_t> slots = out.selection.slots(G.b, G.h);
    int w = 0;
    for (int j = 0; j < G.n; ++j) {
      if (in[j]) slots[w++] = j;
    }
    out.selection.count[task] = w;
  }
}

}  // namespace masskv::select::reference
