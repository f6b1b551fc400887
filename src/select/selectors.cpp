// Training-free selectors (DESIGN.md §2.2–§2.4, §2.7, §3). Every selector reduces to: items
// (pages, or tokens for the token oracle), the always-kept items, per q head a ranking and
// optionally an estimated mass, and a stopping rule; one fill loop turns these into the
// group's shared selection (GQA rule of selector.hpp). entmax_support has its own loop
// because its ranking moves with tau(S).
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "masskv/error.hpp"
#include "masskv/kv/page_codes.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/selector.hpp"
#include "select/gaussian_model.hpp"
#include "select/kept.hpp"
#include "select/learned.hpp"
#include "select/page_scan.hpp"
#include "select/scores.hpp"
#include "select/vec_math.hpp"

namespace masskv::select {

std::string_view to_string(Method m) {
  switch (m) {
    case Method::dense:
      return "dense";
    case Method::sink_recent:
      return "sink_recent";
    case Method::quest:
      return "quest";
    case Method::top_p:
      return "top_p";
    case Method::entmax_support:
      return "entmax_support";
    case Method::gaussian_tau:
      return "gaussian_tau";
    case Method::oracle:
      return "oracle";
    case Method::learned:
      return "learned";
    case Method::two_stage:
      return "two_stage";
  }
  return "?";
}

Method parse_method(std::string_view name, std::string_view argument) {
  for (Method m : {Method::dense, Method::sink_recent, Method::quest, Method::top_p,
                   Method::entmax_support, Method::gaussian_tau, Method::oracle, Method::learned,
                   Method::two_stage}) {
    if (name == to_string(m)) return m;
  }
  fail(ErrorCode::invalid_argument, argument, "unknown selector '", name,
       "' (dense, sink_recent, quest, top_p, entmax_support, gaussian_tau, oracle, learned, "
       "two_stage)");
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// One (sequence, kv head): the unit of work and of the shared selection.
struct Group {
  int b = 0, h = 0, g = 0;  // g: q heads in the group (or all heads, head-collapsed oracle)
  int n = 0;                // items: pages, or tokens for the token oracle
  int pages = 0, page_size = 0;
  std::int64_t length = 0;
  std::span<const std::int32_t> phys;  // physical pages in logical order
  std::size_t csr = 0;                 // indptr[b]: the group's offset in the CSR page order
};

// Always-kept items (§3; the one rule of select/kept.hpp): sink pages, pages covering the last
// W tokens, the last page; token items: the same tokens. Two ranges, [0, first_end) and
// [last_begin, n).
using Kept = KeptRanges<std::int64_t>;
Kept kept_items(const Group& G, const SelectorConfig& c, bool tokens) {
  if (tokens) return kept_tokens(G.pages, G.length, G.page_size, c.sink_pages, c.window_tokens);
  const KeptRanges<int> k =
      kept_pages(G.pages, G.length, G.page_size, c.sink_pages, c.window_tokens);
  return {k.first_end, k.last_begin};
}

// Items of a selection: how many the rule may hold.
int item_cap(const Group& G, const Budget& budget, int kept, bool tokens, bool fill_to_cap) {
  if (budget.tokens <= 0) return fill_to_cap ? kept : G.n;
  const std::int64_t want =
      tokens ? budget.tokens : (budget.tokens + G.page_size - 1) / G.page_size;
  return static_cast<int>(std::min<std::int64_t>(G.n, std::max<std::int64_t>(kept, want)));
}

// Items a top-p selection holds at least (K_min of §2.8), within [kept, cap].
int item_floor(const Group& G, const Budget& budget, int kept, int cap, bool tokens) {
  if (budget.kind != Budget::Kind::top_p || budget.min_tokens <= 0) return kept;
  const std::int64_t want =
      tokens ? budget.min_tokens : (budget.min_tokens + G.page_size - 1) / G.page_size;
  return static_cast<int>(std::min<std::int64_t>(cap, std::max<std::int64_t>(kept, want)));
}

// A ranking of one voter (a q head, or the group's aggregate): candidate items best first,
// ties to the lower id. Only the first `limit` are needed by a fill of at most `limit`:
// nth_element finds them in O(n), and only those are sorted. (rank, id) pairs are sorted in
// place rather than ids through the rank array, which costs a cache miss per comparison.
template <class R>
void order_by(const R* rank, int n, const std::uint8_t* eligible, int limit,
              std::vector<std::int32_t>& ids) {
  struct Item {
    double r;
    std::int32_t id;
  };
  thread_local std::vector<Item> items;
  items.clear();
  for (int j = 0; j < n; ++j) {
    if (!eligible || eligible[j]) items.push_back({static_cast<double>(rank[j]), j});
  }
  auto better = [](const Item& x, const Item& y) {
    return x.r > y.r || (x.r == y.r && x.id < y.id);
  };
  const std::size_t k = std::min<std::size_t>(items.size(), static_cast<std::size_t>(limit));
  if (k < items.size()) {
    std::nth_element(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(k), items.end(),
                     better);
    items.resize(k);
  }
  std::sort(items.begin(), items.end(), better);
  ids.resize(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) ids[i] = items[i].id;
}

struct Voter {
  std::vector<std::int32_t> order;
  const double* mass = nullptr;  // normalised estimated mass per item, or none
  double have = 0;
  std::size_t pos = 0;
};

// Per-thread scratch, reused across groups and calls (no allocation per call once warm).
struct Scratch {
  std::vector<std::uint8_t> in, eligible, agg_elig;
  std::vector<std::int32_t> kept, picked;
  std::vector<double> rank, mass, agg_rank, agg_mass, cnt;  // rank/mass: [g][n]
  std::vector<Voter> voters;
  detail::GaussianPages gauss;
  // entmax_support
  std::vector<std::vector<double>> sc;
  std::vector<std::int32_t> lists;  // [g][depth]
  std::vector<std::size_t> cursor;
  std::vector<double> eps, thr, zeros;
  std::vector<double> qs, qp;  // quant_keys: token scores and probabilities
  // two_stage: candidate pages, their tokens and per-head code scores [g][tokens]
  std::vector<std::uint8_t> page_in;
  std::vector<std::int32_t> cand_tokens;
  std::vector<double> code_w;
  static Scratch& get() {
    thread_local Scratch s;
    return s;
  }
};

// The fill loop: voters take turns adding their best unselected item (round robin, which is
// the union of per-head top lists cut to the budget) until `cap` items are in, every voter
// with a mass estimate holds >= p of it (once `floor` items are in), or no voter has
// candidates left. `kept` lists the items already in, ascending.
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

// w <- exp(w - max w) / sum: masses from log-weights.
void normalise_log(std::span<double> w) {
  double mx = -kInf;
  for (double x : w) mx = std::max(mx, x);
  for (double& x : w) x -= mx;
  detail::exp_inplace(w.data(), w.size());
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

struct Context {
  const SelectArgs& a;
  const SelectorConfig& c;
  int d = 0, Hq = 0, Hkv = 0, gsize = 0;
  float scale = 0;
  bool tokens = false;  // token oracle
  // Oracle: true mass per (b, q head) over items, [b] -> [Hq][items].
  std::vector<std::vector<double>> oracle_mass;
  // Learned: page masses per (b, selector group), [b] -> [groups][pages].
  std::vector<std::vector<double>> learned_mass;
  // Page-major scans (select/page_scan.hpp), CSR order [indptr[b] * Hq + q head * pages + j].
  const float* bounds = nullptr;
  const float* wmax = nullptr;  // [indptr[b] + j][Hkv]: W of the f32 summaries
  const double* m = nullptr;
  const double* v = nullptr;
};

const float* qrow(const Context& X, int b, int qh) { return X.a.q.row(b, qh); }

// Row of q head i of group G in a CSR-ordered scan output.
template <class T>
const T* head_row(const T* base, const Context& X, const Group& G, int i) {
  return base + G.csr * X.Hq + static_cast<std::size_t>(G.h * X.gsize + i) * G.pages;
}

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
void bound_lists(const Context& X, const Group& G, int depth, Scratch& S) {
  const int n = G.pages, g = G.g;
  S.lists.resize(static_cast<std::size_t>(g) * depth);
  S.cursor.assign(static_cast<std::size_t>(g), 0);
  for (int i = 0; i < g; ++i) {
    order_by(head_row(X.bounds, X, G, i), n, nullptr, depth, S.picked);
    std::copy(S.picked.begin(), S.picked.end(),
              S.lists.begin() + static_cast<std::ptrdiff_t>(i) * depth);
  }
}

// Takes, one at a time, the unselected page with the largest max_i (c U_ij - T_i) (ties: the
// lower id) while fewer than `want` were taken (and, with `positive`, while that value is
// > 0); marks them in S.in and appends them to `taken`. The per-head lists are sorted by U_ij, so
// this is their merge: a page's first appearance carries its maximum. Lists `depth` deep suffice
// while at most depth - 1 pages are selected.
int take_best(const Context& X, const Group& G, int depth, double c, const double* T, bool positive,
              int want, Scratch& S, std::vector<std::int32_t>& taken) {
  const int g = G.g;
  int took = 0;
  while (took < want) {
    int best_i = -1;
    std::int32_t best_j = 0;
    double best = 0;
    for (int i = 0; i < g; ++i) {
      const std::int32_t* L = S.lists.data() + static_cast<std::size_t>(i) * depth;
      std::size_t& k = S.cursor[static_cast<std::size_t>(i)];
      const std::size_t len =
          std::min<std::size_t>(static_cast<std::size_t>(depth), static_cast<std::size_t>(G.pages));
      while (k < len && S.in[static_cast<std::size_t>(L[k])]) ++k;
      if (k == len) continue;
      const std::int32_t j = L[k];
      const double val = c * head_row(X.bounds, X, G, i)[j] - T[i];
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

// entmax_support (§2.2): grow by the largest max_h[(α−1)U_hj − (τ_lo,h(S) − ε_h)] until no
// unselected page can reach any head's threshold, or the cap is reached. Each round adds
// min(cap - count, violators, max(1, count / 8)) pages.
int grow_support(const Context& X, const Group& G, Scratch& S, int count, int cap, double* estimate,
                 std::uint8_t& certified) {
  const double alpha = X.c.mapping.alpha;
  const int n = G.pages, g = G.g;
  const int depth = std::min(n, cap + 1);
  bound_lists(X, G, depth, S);
  S.picked.clear();
  // Seed: the best pages by max-over-heads bound.
  S.thr.assign(static_cast<std::size_t>(g), 0.0);
  count += take_best(X, G, depth, 1.0, S.thr.data(), false, std::min(cap - count, X.c.seed_pages),
                     S, S.picked);
  const double w = group_key_max(X, G);
  S.sc.resize(
      static_cast<std::size_t>(std::max<std::size_t>(S.sc.size(), static_cast<std::size_t>(g))));
  S.eps.resize(static_cast<std::size_t>(g));
  for (int i = 0; i < g; ++i) {
    S.sc[static_cast<std::size_t>(i)].clear();
    S.eps[static_cast<std::size_t>(i)] =
        certificate_eps(alpha, X.d, X.scale, q_l1(qrow(X, G.b, G.h * X.gsize + i), X.d), w);
  }
  // The first round scores every selected page, ascending; later rounds the pages they took.
  std::vector<std::int32_t>& fresh = S.kept;
  fresh.clear();
  for (int j = 0; j < n; ++j) {
    if (S.in[static_cast<std::size_t>(j)]) fresh.push_back(j);
  }
  std::vector<double>& T = S.thr;
  certified = 0;
  while (true) {
    for (int i = 0; i < g; ++i) {
      auto& sc = S.sc[static_cast<std::size_t>(i)];
      detail::append_scores(X.a.cache, G.b, G.h, qrow(X, G.b, G.h * X.gsize + i), X.scale,
                            SelectionView::Unit::page, fresh, sc);
      const EntmaxThreshold t = entmax_threshold(std::span<const double>(sc), alpha);
      estimate[i] = t.tau;
      T[static_cast<std::size_t>(i)] = t.tau_lo - S.eps[static_cast<std::size_t>(i)];
    }
    // Any violator left? Peek at the best value without taking it.
    S.picked.clear();
    const int any = take_best(X, G, depth, alpha - 1.0, T.data(), true, 1, S, S.picked);
    if (any == 0) {
      certified = 1;
      return count;
    }
    if (count >= cap) {
      S.in[static_cast<std::size_t>(S.picked[0])] = 0;  // over the cap: not taken
      return count;
    }
    const int want = std::min(cap - count, std::max(1, count / 8));
    const int more = take_best(X, G, depth, alpha - 1.0, T.data(), true, want - 1, S, S.picked);
    count += 1 + more;
    fresh.assign(S.picked.begin(), S.picked.end());
    std::sort(fresh.begin(), fresh.end());  // the old scan's order: ascending page id
  }
}

// log(n) of a page count: counts are at most the page size (<= 256) in any cache we make, so
// a table of std::log's values saves a log per page and head.
double log_count(double n) {
  static const std::array<double, 257> table = [] {
    std::array<double, 257> t{};
    for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::log(static_cast<double>(i));
    return t;
  }();
  return n >= 0 && n <= 256 && n == std::floor(n) ? table[static_cast<std::size_t>(n)]
                                                  : std::log(n);
}

// Normalised bound pseudo-masses n_j e^{U_j} of one head (quest, entmax_support).
void bound_masses(const Context& X, const Group& G, const float* U, double* out) {
  const std::int32_t* cnt = X.a.summaries.count;
  for (int j = 0; j < G.pages; ++j) {
    out[j] = log_count(static_cast<double>(cnt[G.phys[j]])) + static_cast<double>(U[j]);
  }
  normalise_log(std::span<double>(out, static_cast<std::size_t>(G.pages)));
}

// Page masses of one q head from scores on the selector keys of every token (§2.9):
// softmax or entmax of the approximate scores, summed per page. The scores are computed on
// the codes (kv::dot_row_kernel); no dequantised key is stored.
void quant_key_masses(const Context& X, const Group& G, int i, Scratch& S, double* w) {
  S.qs.clear();
  detail::append_selector_key_scores(X.a.selector_keys, X.a.cache.table, G.b, G.h,
                                     qrow(X, G.b, G.h * X.gsize + i), X.scale, S.qs);
  S.qp.resize(S.qs.size());
  if (X.c.mapping.is_entmax()) {
    entmax(std::span<const double>(S.qs), X.c.mapping.alpha, std::span<double>(S.qp));
  } else {
    softmax(std::span<const double>(S.qs), std::span<double>(S.qp));
  }
  std::fill(w, w + G.pages, 0.0);
  for (std::size_t t = 0; t < S.qp.size(); ++t)
    w[t / static_cast<std::size_t>(G.page_size)] += S.qp[t];
}

// two_stage: the group's token selection (S.in holds the kept tokens; `cap` tokens at most).
// Stage 1 merges the q heads' bound rankings of the pages that hold no kept token, up to
// candidate_factor × ceil(cap / page_size) pages; stage 2 ranks those pages' tokens per q head
// by q·k̂ on the 2-bit page codes and merges those rankings (the same round robin) to the cap.
// Reads the bounds of every page and the codes of the candidates' tokens only.
int two_stage_group(const Context& X, const Group& G, Scratch& S, int count, int cap) {
  const int P = G.page_size, g = G.g;
  const Kept kept = kept_items(G, X.c, true);
  // Pages holding a kept token are read anyway: they are never candidates.
  S.page_in.assign(static_cast<std::size_t>(G.pages), 0);
  int kept_pages = 0;
  for (int j = 0; j < G.pages; ++j) {
    const std::int64_t a = static_cast<std::int64_t>(j) * P;
    const std::int64_t b = std::min<std::int64_t>(a + P, G.length);
    const bool holds_kept = a < kept.first_end || b > kept.last_begin;
    S.page_in[static_cast<std::size_t>(j)] = holds_kept ? 1 : 0;
    kept_pages += holds_kept ? 1 : 0;
  }
  const std::int64_t budget_pages = (static_cast<std::int64_t>(cap) + P - 1) / P;
  const int want = static_cast<int>(std::min<std::int64_t>(
      G.pages, kept_pages + static_cast<std::int64_t>(X.c.candidate_factor) * budget_pages));
  if (S.voters.size() < static_cast<std::size_t>(g)) S.voters.resize(static_cast<std::size_t>(g));
  // Eligible pages: those holding no kept token.
  S.eligible.resize(static_cast<std::size_t>(G.pages));
  for (int j = 0; j < G.pages; ++j) {
    S.eligible[static_cast<std::size_t>(j)] = S.page_in[static_cast<std::size_t>(j)] ? 0 : 1;
  }
  for (int i = 0; i < g; ++i) {
    order_by(head_row(X.bounds, X, G, i), G.pages, S.eligible.data(), want, S.voters[i].order);
    S.voters[i].mass = nullptr;
  }
  fill(S.voters, static_cast<std::size_t>(g), S.page_in, {}, kept_pages, want, kInf, 0);
  // Candidates: the eligible pages stage 1 took, their tokens in order.
  S.cand_tokens.clear();
  for (int j = 0; j < G.pages; ++j) {
    if (!S.page_in[static_cast<std::size_t>(j)] || !S.eligible[static_cast<std::size_t>(j)]) continue;
    const std::int64_t a = static_cast<std::int64_t>(j) * P;
    const std::int64_t b = std::min<std::int64_t>(a + P, G.length);
    for (std::int64_t t = a; t < b; ++t) S.cand_tokens.push_back(static_cast<std::int32_t>(t));
  }
  const int K = static_cast<int>(S.cand_tokens.size());
  S.rank.resize(static_cast<std::size_t>(g) * static_cast<std::size_t>(K));
  S.code_w.resize(static_cast<std::size_t>(X.d));
  const kv::SummariesView& sum = X.a.summaries;
  const kv::PageCodesView& pc = X.a.page_codes;
  std::vector<float> qs(static_cast<std::size_t>(X.d));
  for (int i = 0; i < g; ++i) {
    const float* q = qrow(X, G.b, G.h * X.gsize + i);
    for (int x = 0; x < X.d; ++x) qs[static_cast<std::size_t>(x)] = q[x] * X.scale;
    double* r = S.rank.data() + static_cast<std::size_t>(i) * K;
    for (int k = 0; k < K;) {  // page by page: one affine form per (page, head)
      const int j = S.cand_tokens[static_cast<std::size_t>(k)] / P;
      const std::int32_t phys = G.phys[static_cast<std::size_t>(j)];
      const std::int64_t at = sum.at(phys, G.h);
      const kv::PageCodeScorer sc =
          kv::page_code_scorer(qs.data(), sum.min + at, sum.max + at, X.d, S.code_w.data());
      for (; k < K && S.cand_tokens[static_cast<std::size_t>(k)] / P == j; ++k) {
        const int slot = S.cand_tokens[static_cast<std::size_t>(k)] - j * P;
        r[k] = kv::page_code_score(sc, pc.row(phys, G.h, slot), X.d);
      }
    }
    // Ranked over the compact candidate list; ascending ids keep the lower-id tie rule.
    order_by(r, K, nullptr, cap, S.voters[i].order);
    for (std::int32_t& id : S.voters[i].order) id = S.cand_tokens[static_cast<std::size_t>(id)];
  }
  return fill(S.voters, static_cast<std::size_t>(g), S.in, {}, count, cap, kInf, 0);
}

// Everything of one group but the kept items (already in S.in): rankings, masses, rule, fill.
void select_group(const Context& X, const Group& G, Scratch& S, int& count, int cap, int floor,
                  double* estimate, std::uint8_t& certified) {
  const SelectorConfig& c = X.c;
  const Method method = c.method;
  const Budget::Kind kind = c.budget.kind;
  const int n = G.n, g = G.g;
  const std::size_t ng = static_cast<std::size_t>(g) * n;
  std::vector<std::uint8_t>& in = S.in;
  certified = 0;
  if (method == Method::dense) {
    std::fill(in.begin(), in.end(), 1);
    count = n;
    std::fill(estimate, estimate + g, 1.0);
    return;
  }
  if (method == Method::sink_recent) {
    // Every head ranks the most recent first: the union is the latest pages up to the cap.
    for (int j = n - 1; j >= 0 && count < cap; --j) {
      if (!in[static_cast<std::size_t>(j)]) {
        in[static_cast<std::size_t>(j)] = 1;
        ++count;
      }
    }
    std::fill(estimate, estimate + g, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  if (method == Method::learned) {
    // One voter: the group's softmax(ŝ) page masses (head-collapsed: group 0 for every kv
    // head), ranked by mass; the prefix stops at mass >= p (fixed budgets: at the cap).
    const int groups = X.a.learned_keys.groups;
    const double* m = X.learned_mass[static_cast<std::size_t>(G.b)].data() +
                      static_cast<std::size_t>(groups == 1 ? 0 : G.h) * static_cast<std::size_t>(n);
    S.kept.clear();
    for (int j = 0; j < n; ++j) {
      if (in[static_cast<std::size_t>(j)]) S.kept.push_back(j);
    }
    if (S.voters.empty()) S.voters.resize(1);
    order_by(m, n, nullptr, cap, S.voters[0].order);
    S.voters[0].mass = m;
    count = fill(S.voters, 1, in, S.kept, count, cap,
                 kind == Budget::Kind::fixed ? kInf : c.budget.p, floor);
    double held = 0;
    for (int j = 0; j < n; ++j) held += in[static_cast<std::size_t>(j)] ? m[j] : 0.0;
    std::fill(estimate, estimate + g, held);
    return;
  }
  if (method == Method::two_stage) {
    count = two_stage_group(X, G, S, count, cap);
    std::fill(estimate, estimate + g, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  if (method == Method::entmax_support) {
    count = grow_support(X, G, S, count, cap, estimate, certified);
    // A fixed budget fills the rest by bound below; the other kinds stop at the certificate.
    if (kind != Budget::Kind::fixed) return;
  }
  // rank[i][j], mass[i][j] per q head i of the group.
  const bool need_mass = kind == Budget::Kind::top_p || method == Method::quest ||
                         method == Method::top_p || method == Method::oracle;
  S.rank.resize(ng);
  S.mass.resize(need_mass ? ng : 0);
  bool rank_is_mass = false;
  S.eligible.clear();  // per head [g][n], adaptive rules only
  double p = kind == Budget::Kind::fixed ? kInf : c.budget.p;
  const double alpha = c.mapping.alpha;
  auto rank = [&](int i) { return S.rank.data() + static_cast<std::size_t>(i) * n; };
  auto mass = [&](int i) { return S.mass.data() + static_cast<std::size_t>(i) * n; };
  if (method == Method::oracle) {
    const auto& om = X.oracle_mass[static_cast<std::size_t>(G.b)];
    const int first = c.oracle_head_collapsed ? 0 : G.h * X.gsize;
    for (int i = 0; i < g; ++i) {
      std::copy_n(om.begin() + static_cast<std::ptrdiff_t>(first + i) * n, n, mass(i));
      std::copy_n(mass(i), n, rank(i));
    }
    rank_is_mass = true;
  } else {
    for (int i = 0; i < g; ++i) {
      const float* U = head_row(X.bounds, X, G, i);
      std::copy_n(U, n, rank(i));
    }
    if (method == Method::quest || method == Method::entmax_support) {
      // Bound pseudo-mass n_j e^{U_j}: an over-estimate of every page's weight.
      if (need_mass) {
        for (int i = 0; i < g; ++i) bound_masses(X, G, head_row(X.bounds, X, G, i), mass(i));
      }
    } else {  // top_p, gaussian_tau: the §2.4 page model
      S.cnt.resize(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) S.cnt[j] = X.a.summaries.count[G.phys[j]];
      const bool gaussian = c.mass_source != MassSource::page_mean;
      const bool quant = method == Method::top_p && c.mass_source == MassSource::quant_keys;
      if (method == Method::gaussian_tau) S.eligible.assign(ng, 0);
      for (int i = 0; i < g; ++i) {
        const double* m = quant ? nullptr : head_row(X.m, X, G, i);
        const double* v = quant ? nullptr : head_row(X.v, X, G, i);
        double* w = need_mass ? mass(i) : nullptr;
        if (quant) {
          quant_key_masses(X, G, i, S, w);
        } else if (!c.mapping.is_entmax()) {
          for (int j = 0; j < n; ++j) {
            w[j] = log_count(std::max(S.cnt[j], 1.0)) + m[j] + (gaussian ? 0.5 * v[j] : 0.0);
          }
          normalise_log(std::span<double>(w, static_cast<std::size_t>(n)));
        } else {
          std::span<const double> vs(v, static_cast<std::size_t>(n));
          if (!gaussian) {  // page means only: zero variances
            S.zeros.assign(static_cast<std::size_t>(n), 0.0);
            vs = S.zeros;
          }
          S.gauss.assign(std::span<const double>(m, static_cast<std::size_t>(n)), vs, S.cnt, alpha);
          const double tau_hat = S.gauss.solve();
          if (w) {
            S.gauss.masses(tau_hat, std::span<double>(w, static_cast<std::size_t>(n)));
            normalise(std::span<double>(w, static_cast<std::size_t>(n)));
          }
          if (method == Method::gaussian_tau) {
            estimate[i] = tau_hat;
            double* r = rank(i);
            for (int j = 0; j < n; ++j) {
              r[j] = (alpha - 1.0) * r[j] - tau_hat;
              S.eligible[static_cast<std::size_t>(i) * n + j] = r[j] > -c.tau_margin;
            }
          }
        }
        if (method == Method::top_p) {
          if (kind == Budget::Kind::adaptive && c.budget.tokens > 0) {
            // Twilight: candidates are the head's top-cap pages by bound, then by mass.
            S.eligible.resize(ng, 0);
            order_by(rank(i), n, nullptr, cap, S.picked);
            for (std::int32_t j : S.picked) S.eligible[static_cast<std::size_t>(i) * n + j] = 1;
          }
          std::copy_n(w, n, rank(i));
        }
      }
      rank_is_mass = method == Method::top_p;
      if (method == Method::gaussian_tau && kind == Budget::Kind::adaptive) p = kInf;
    }
  }
  if (kind == Budget::Kind::fixed || method != Method::gaussian_tau) {
    if (!(kind == Budget::Kind::adaptive && method == Method::top_p)) S.eligible.clear();
  }

  // Items already in, ascending: the masses they hold start each voter's count.
  S.kept.clear();
  for (int j = 0; j < n; ++j) {
    if (in[static_cast<std::size_t>(j)]) S.kept.push_back(j);
  }
  const bool aggregate = c.group == GroupRule::aggregate || c.oracle_head_collapsed;
  const bool with_mass = need_mass;
  std::size_t nv = 0;
  if (!aggregate) {
    nv = static_cast<std::size_t>(g);
    if (S.voters.size() < nv) S.voters.resize(nv);
    for (int i = 0; i < g; ++i) {
      order_by(rank(i), n,
               S.eligible.empty() ? nullptr : S.eligible.data() + static_cast<std::size_t>(i) * n,
               cap, S.voters[i].order);
      S.voters[i].mass = with_mass ? mass(i) : nullptr;
    }
  } else {
    S.agg_rank.assign(static_cast<std::size_t>(n), rank_is_mass ? 0.0 : -kInf);
    if (with_mass) S.agg_mass.assign(static_cast<std::size_t>(n), 0.0);
    if (!S.eligible.empty()) S.agg_elig.assign(static_cast<std::size_t>(n), 0);
    for (int i = 0; i < g; ++i) {
      for (int j = 0; j < n; ++j) {
        // Mass ranks pool by the mean (the head-averaged mass of §2.7); bound ranks by the
        // max, so a page one head needs is not outvoted (as select_topk_pages does).
        S.agg_rank[j] =
            rank_is_mass ? S.agg_rank[j] + rank(i)[j] / g : std::max(S.agg_rank[j], rank(i)[j]);
        if (with_mass) S.agg_mass[j] += mass(i)[j] / g;
        if (!S.eligible.empty()) S.agg_elig[j] |= S.eligible[static_cast<std::size_t>(i) * n + j];
      }
    }
    nv = 1;
    if (S.voters.empty()) S.voters.resize(1);
    order_by(S.agg_rank.data(), n, S.eligible.empty() ? nullptr : S.agg_elig.data(), cap,
             S.voters[0].order);
    S.voters[0].mass = with_mass ? S.agg_mass.data() : nullptr;
  }
  count = fill(S.voters, nv, in, S.kept, count, cap, p, floor);
  if (method != Method::gaussian_tau && method != Method::entmax_support) {
    for (int i = 0; i < g; ++i) {  // the estimated mass of the selection, per head
      double s = 0;
      for (int j = 0; j < n; ++j) s += in[static_cast<std::size_t>(j)] ? mass(i)[j] : 0.0;
      estimate[i] = s;
    }
  }
}

// Oracle masses (§2.7): the true distribution of every q head over every token (f64), summed
// per page for page items.
void oracle_masses(Context& X) {
  const auto& t = X.a.cache.table;
  const int B = t.batch(), P = X.a.cache.page_size;
  X.oracle_mass.resize(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    const std::int64_t L = t.length(b, P);
    const int items = X.tokens ? static_cast<int>(L) : t.num_pages(b);
    X.oracle_mass[b].assign(static_cast<std::size_t>(X.Hq) * items, 0.0);
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
      detail::append_scores(X.a.cache, b, qh / X.gsize, qrow(X, b, qh), X.scale,
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

// Learned page masses (§2.8) of every (sequence, selector group): one task each, sequential
// inside, so the result does not depend on the thread count.
void learned_masses(Context& X) {
  const auto& t = X.a.cache.table;
  const kv::KeyRowsView& keys = X.a.learned_keys;
  const int B = t.batch(), G = keys.groups;
  X.learned_mass.resize(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    X.learned_mass[static_cast<std::size_t>(b)].assign(
        static_cast<std::size_t>(G) * static_cast<std::size_t>(t.num_pages(b)), 0.0);
  }
  const int tasks = B * G;
#pragma omp parallel if (tasks > 1)
  {
    std::vector<double> scores;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / G, g = task % G;
      const auto pages = static_cast<std::size_t>(t.num_pages(b));
      std::span<double> out(
          X.learned_mass[static_cast<std::size_t>(b)].data() + static_cast<std::size_t>(g) * pages,
          pages);
      detail::learned_page_masses(keys, t, b, g, X.a.learned_q.row(b, g), scores, out);
    }
  }
}

void check_learned(const SelectArgs& a, const SelectorConfig& c) {
  using enum ErrorCode;
  const kv::KeyRowsView& k = a.learned_keys;
  require(!k.empty() && k.groups > 0 && k.dim > 0, invalid_argument, "learned_keys",
          "Method::learned needs the selector key rows of the cache's pool");
  require(k.num_pages == a.cache.num_pages && k.page_size == a.cache.page_size, shape_mismatch,
          "learned_keys", "pool geometry (", k.num_pages, " pages of ", k.page_size,
          ") differs from the cache's (", a.cache.num_pages, " of ", a.cache.page_size, ")");
  require(k.groups == 1 || k.groups == a.cache.num_kv_heads, shape_mismatch, "learned_keys",
          k.groups, " groups: neither 1 (head-collapsed) nor the cache's ", a.cache.num_kv_heads,
          " kv heads");
  const View3<const float>& q = a.learned_q;
  require(q.data != nullptr && q.n0 == a.cache.table.batch() && q.n1 == k.groups && q.n2 == k.dim,
          shape_mismatch, "learned_q", "expected [", a.cache.table.batch(), "][", k.groups, "][",
          k.dim, "], got [", q.n0, "][", q.n1, "][", q.n2, "]");
  for (int b = 0; b < q.n0; ++b) {
    for (int g = 0; g < q.n1; ++g) {
      for (int x = 0; x < q.n2; ++x) {
        require(std::isfinite(q.row(b, g)[x]), non_finite, "learned_q", "learned_q[", b, "][", g,
                "][", x, "] is not finite");
      }
    }
  }
  require(c.budget.kind != Budget::Kind::adaptive, invalid_argument, "budget",
          "learned takes a fixed or a top-p budget, not adaptive");
}

void check_args(const SelectArgs& a, const SelectorConfig& c) {
  using enum ErrorCode;
  c.mapping.validate();
  a.cache.validate();
  const auto& s = a.summaries;
  require(s.min && s.max && s.mean && s.m2 && s.count && s.max_vnorm, invalid_argument, "summaries",
          "every summary array is needed");
  require(s.num_pages == a.cache.num_pages && s.num_kv_heads == a.cache.num_kv_heads &&
              s.head_dim == a.cache.head_dim,
          shape_mismatch, "summaries", "shape differs from the cache's");
  require(a.q.data != nullptr, invalid_argument, "q", "null query");
  require(a.q.n0 == a.cache.table.batch(), shape_mismatch, "q", "has ", a.q.n0,
          " sequences, the page table ", a.cache.table.batch());
  require(a.q.n2 == a.cache.head_dim, shape_mismatch, "q", "head_dim ", a.q.n2,
          " differs from the cache's ", a.cache.head_dim);
  require(a.q.n1 >= a.cache.num_kv_heads && a.q.n1 % a.cache.num_kv_heads == 0, shape_mismatch, "q",
          a.q.n1, " heads is not a multiple of the kv heads ", a.cache.num_kv_heads);
  for (int b = 0; b < a.q.n0; ++b) {
    for (int h = 0; h < a.q.n1; ++h) {
      for (int x = 0; x < a.q.n2; ++x) {
        require(std::isfinite(a.q.row(b, h)[x]), non_finite, "q", "q[", b, "][", h, "][", x,
                "] is not finite");
      }
    }
  }
  require(std::isfinite(a.scale) && a.scale >= 0, invalid_argument, "scale",
          "must be finite and >= 0 (0: 1/sqrt(d)), got ", a.scale);
  require(c.sink_pages >= 0, invalid_argument, "sink_pages", "must be >= 0, got ", c.sink_pages);
  require(c.window_tokens >= 0, invalid_argument, "window_tokens", "must be >= 0, got ",
          c.window_tokens);
  require(c.budget.tokens >= 0, invalid_argument, "budget", "tokens must be >= 0, got ",
          c.budget.tokens);
  require(c.budget.p > 0 && c.budget.p <= 1, invalid_argument, "budget",
          "p must be in (0, 1], got ", c.budget.p);
  require(c.seed_pages >= 0, invalid_argument, "seed_pages", "must be >= 0");
  require(std::isfinite(c.tau_margin), invalid_argument, "tau_margin", "must be finite");
  const bool needs_entmax = c.method == Method::entmax_support || c.method == Method::gaussian_tau;
  require(!needs_entmax || c.mapping.is_entmax(), invalid_argument, "method", to_string(c.method),
          " serves entmax attention only");
  require(c.method != Method::sink_recent || c.budget.kind != Budget::Kind::top_p, invalid_argument,
          "budget", "sink_recent has no mass estimate for a top-p budget");
  require(c.method == Method::dense || c.budget.kind != Budget::Kind::fixed || c.budget.tokens > 0,
          invalid_argument, "budget", "a fixed budget needs tokens > 0");
  require(!c.oracle_tokens || c.method == Method::oracle, invalid_argument, "oracle_tokens",
          "token granularity is the oracle's only");
  require(c.budget.min_tokens >= 0, invalid_argument, "budget", "min_tokens must be >= 0, got ",
          c.budget.min_tokens);
  require(c.budget.min_tokens == 0 || c.budget.kind == Budget::Kind::top_p, invalid_argument,
          "budget", "min_tokens (K_min) applies to top-p budgets only");
  require(c.budget.tokens == 0 || c.budget.min_tokens <= c.budget.tokens, invalid_argument,
          "budget", "min_tokens ", c.budget.min_tokens, " exceeds the cap ", c.budget.tokens);
  if (c.method == Method::learned) check_learned(a, c);
  if (c.method == Method::two_stage) {
    const kv::PageCodesView& pc = a.page_codes;
    require(!pc.empty(), invalid_argument, "page_codes",
            "Method::two_stage needs the cache's page codes (CacheConfig::page_codes)");
    require(pc.num_pages == a.cache.num_pages && pc.num_kv_heads == a.cache.num_kv_heads &&
                pc.head_dim == a.cache.head_dim && pc.page_size == a.cache.page_size,
            shape_mismatch, "page_codes", "shape differs from the cache's");
    require(c.candidate_factor >= 1, invalid_argument, "candidate_factor", "must be >= 1, got ",
            c.candidate_factor);
    require(c.budget.kind == Budget::Kind::fixed, invalid_argument, "budget",
            "two_stage takes a fixed budget");
  }
  if (c.method == Method::top_p && c.mass_source == MassSource::quant_keys) {
    const kv::SelectorKeysView& k = a.selector_keys;
    require(!k.empty(), invalid_argument, "selector_keys",
            "MassSource::quant_keys needs the cache's selector keys");
    require(k.format == kv::KeyFormat::bf16 || k.scales != nullptr, invalid_argument,
            "selector_keys", "the ", kv::to_string(k.format), " selector keys have no scales");
    kv::check_key_dim(k.format, k.head_dim, "selector_keys");
    require(k.num_pages == a.cache.num_pages && k.num_kv_heads == a.cache.num_kv_heads &&
                k.head_dim == a.cache.head_dim && k.page_size == a.cache.page_size,
            shape_mismatch, "selector_keys", "shape differs from the cache's");
  }
}

}  // namespace

void extend_kept(const SelectionView& sel, const kv::PageTable& table, int page_size,
                 const SelectorConfig& c, SelectionStorage& out) {
  using enum ErrorCode;
  require(sel.batch == table.batch(), shape_mismatch, "selection", "batch ", sel.batch,
          " differs from the page table's ", table.batch());
  require(page_size > 0, invalid_argument, "page_size", "must be > 0, got ", page_size);
  const bool tokens = sel.unit == SelectionView::Unit::token;
  std::vector<std::vector<std::int32_t>> lists;
  std::size_t widest = 0;
  for (int b = 0; b < sel.batch; ++b) {
    Group G;
    G.b = b;
    G.page_size = page_size;
    G.pages = table.num_pages(b);
    G.length = table.length(b, page_size);
    G.n = tokens ? static_cast<int>(G.length) : G.pages;
    const Kept kept = kept_items(G, c, tokens);
    for (int h = 0; h < sel.num_kv_heads; ++h) {
      std::vector<std::int32_t> list;
      for (std::int64_t i = 0; i < std::min<std::int64_t>(kept.first_end, G.n); ++i) {
        list.push_back(static_cast<std::int32_t>(i));
      }
      for (std::int64_t i = std::max(kept.first_end, kept.last_begin); i < G.n; ++i) {
        list.push_back(static_cast<std::int32_t>(i));
      }
      for (const std::int32_t id : sel.list(b, h)) {
        require(id >= 0 && id < G.n, invalid_argument, "selection", "item ", id, " of [", b, "][",
                h, "] lies beyond the sequence's ", G.n);
        list.push_back(id);
      }
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
      widest = std::max(widest, list.size());
      lists.push_back(std::move(list));
    }
  }
  out.reset(sel.unit, sel.batch, sel.num_kv_heads, static_cast<int>(widest));
  for (int b = 0, i = 0; b < sel.batch; ++b) {
    for (int h = 0; h < sel.num_kv_heads; ++h, ++i) {
      const auto& list = lists[static_cast<std::size_t>(i)];
      std::copy(list.begin(), list.end(), out.slots(b, h).begin());
      out.count[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(list.size());
    }
  }
}

bool queries_within_cos(std::span<const float> q, std::span<const float> ref, int head_dim,
                        double min_cos) {
  require(
      q.size() == ref.size() && head_dim > 0 && q.size() % static_cast<std::size_t>(head_dim) == 0,
      ErrorCode::shape_mismatch, "q", "queries and reference differ in shape");
  if (min_cos <= -1) return true;
  const auto d = static_cast<std::size_t>(head_dim);
  for (std::size_t h = 0; h * d < q.size(); ++h) {
    double dot = 0, a = 0, b = 0;
    for (std::size_t x = h * d; x < (h + 1) * d; ++x) {
      dot += static_cast<double>(q[x]) * ref[x];
      a += static_cast<double>(q[x]) * q[x];
      b += static_cast<double>(ref[x]) * ref[x];
    }
    const double n = std::sqrt(a * b);
    const double cos = n > 0 ? dot / n : (a == b ? 1.0 : -1.0);
    if (cos < min_cos) return false;
  }
  return true;
}

void run_selector(const SelectArgs& args, const SelectorConfig& config, SelectOutput& out) {
  check_args(args, config);
  Context X{args, config, 0, 0, 0, 0, 0.0f, false, {}, {}, nullptr, nullptr, nullptr, nullptr};
  X.d = args.cache.head_dim;
  X.Hq = args.q.n1;
  X.Hkv = args.cache.num_kv_heads;
  X.gsize = X.Hq / X.Hkv;
  X.scale = args.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(X.d)) : args.scale;
  X.tokens = (config.method == Method::oracle && config.oracle_tokens) ||
             config.method == Method::two_stage;
  const Method method = config.method;
  if (method == Method::oracle) oracle_masses(X);
  if (method == Method::learned) learned_masses(X);

  const auto& t = args.cache.table;
  // Page-major scans first (each summary array read once, threads over chunks of pages),
  // into buffers kept by this thread across calls.
  thread_local std::vector<float> bounds, wmax;
  thread_local std::vector<double> mom_m, mom_v;
  const std::size_t nnz = t.indices.size();
  if (method == Method::quest || method == Method::top_p || method == Method::entmax_support ||
      method == Method::two_stage ||
      method == Method::gaussian_tau) {
    bounds.resize(nnz * X.Hq);
    const bool want_w = method == Method::entmax_support && !args.bounds_bf16;
    if (want_w) wmax.resize(nnz * X.Hkv);
    detail::all_page_bounds(args.bounds_bf16 ? nullptr : &args.summaries, args.bounds_bf16, t,
                            args.q, X.scale, bounds.data(), want_w ? wmax.data() : nullptr);
    X.bounds = bounds.data();
    X.wmax = want_w ? wmax.data() : nullptr;
  }
  const bool quant = method == Method::top_p && config.mass_source == MassSource::quant_keys;
  if ((method == Method::top_p && !quant) || method == Method::gaussian_tau) {
    mom_m.resize(nnz * X.Hq);
    mom_v.resize(nnz * X.Hq);
    detail::all_page_moments(args.summaries, t, args.q, X.scale, mom_m.data(), mom_v.data());
    X.m = mom_m.data();
    X.v = mom_v.data();
  }

  const int B = t.batch(), P = args.cache.page_size;
  thread_local std::vector<Group> groups;
  thread_local std::vector<int> caps, floors;
  groups.clear();
  caps.clear();
  floors.clear();
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
      G.csr = static_cast<std::size_t>(t.indptr[b]);
      const int k = static_cast<int>(kept_items(G, config, X.tokens).count(G.n));
      const int cap =
          method == Method::dense ? G.n : item_cap(G, config.budget, k, X.tokens, fill_to_cap);
      groups.push_back(G);
      caps.push_back(cap);
      floors.push_back(item_floor(G, config.budget, k, cap, X.tokens));
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
      (config.budget.kind == Budget::Kind::adaptive && method == Method::top_p)) {
    require(method != Method::dense && method != Method::sink_recent, ErrorCode::invalid_argument,
            "budget", "a top-p budget needs a mass estimate (not ", to_string(method), ")");
  }
  const std::vector<Group>& work = groups;
  const std::vector<int>& work_caps = caps;
  const std::vector<int>& work_floors = floors;
#pragma omp parallel for schedule(dynamic, 1) if (tasks > 1)
  for (int task = 0; task < tasks; ++task) {
    const Group& G = work[static_cast<std::size_t>(task)];
    Scratch& S = Scratch::get();
    const Kept k = kept_items(G, config, X.tokens);
    S.in.assign(static_cast<std::size_t>(G.n), 0);
    std::fill(S.in.begin(), S.in.begin() + k.first_end, 1);
    std::fill(S.in.begin() + k.last_begin, S.in.end(), 1);
    int count = static_cast<int>(k.count(G.n));
    double* est = out.estimate.data() + static_cast<std::size_t>(G.b) * X.Hq + G.h * X.gsize;
    select_group(X, G, S, count, work_caps[static_cast<std::size_t>(task)],
                 work_floors[static_cast<std::size_t>(task)], est,
                 out.certified[static_cast<std::size_t>(task)]);
    const std::span<std::int32_t> slots = out.selection.slots(G.b, G.h);
    int w = 0;
    for (int j = 0; j < G.n; ++j) {
      if (S.in[static_cast<std::size_t>(j)]) slots[w++] = j;
    }
    out.selection.count[static_cast<std::size_t>(task)] = w;
  }
}

}  // namespace masskv::select
