// Training-free selectors (docs/design.md §2.2–§2.4, §2.7, §3): run_selector validates the
// arguments, picks the method's scorer and rule (registry.cpp; the contract is
// select/scorer.hpp), runs the batch-wide scans they ask for, and makes each group's selection
// (one sequence, one kv head, select/group.hpp) from its always-kept items with the rule, one
// task per group. Also the selection's upkeep between selections (extend_kept, the query
// test).
#include <algorithm>
#include <cmath>
#include <limits>

#include "masskv/error.hpp"
#include "masskv/select/selector.hpp"
#include "select/group.hpp"
#include "select/page_scan.hpp"
#include "select/scorer.hpp"

namespace masskv::select {

std::string_view to_string(Method m) { return detail::method_name(m); }

Method parse_method(std::string_view name, std::string_view argument) {
  Method m{};
  if (detail::method_of(name, m)) return m;
  fail(ErrorCode::invalid_argument, argument, "unknown selector '", name, "' (",
       detail::method_names(), ")");
}

namespace {

void check_args(const SelectArgs& a, const SelectorConfig& c, const detail::Selector& pick) {
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
  require(!pick.rule->entmax_only || c.mapping.is_entmax(), invalid_argument, "method",
          to_string(c.method), " serves entmax attention only");
  require(!pick.rule->uses_budget || c.budget.kind != Budget::Kind::fixed || c.budget.tokens > 0,
          invalid_argument, "budget", "a fixed budget needs tokens > 0");
  require(!c.oracle_tokens || c.method == Method::oracle, invalid_argument, "oracle_tokens",
          "token granularity is the oracle's only");
  require(!c.two_stage_pages || c.method == Method::two_stage, invalid_argument,
          "two_stage_pages", "whole pages by their best token apply to two_stage only");
  require(c.budget.min_tokens >= 0, invalid_argument, "budget", "min_tokens must be >= 0, got ",
          c.budget.min_tokens);
  require(c.budget.min_tokens == 0 || c.budget.kind == Budget::Kind::top_p, invalid_argument,
          "budget", "min_tokens (K_min) applies to top-p budgets only");
  require(c.budget.tokens == 0 || c.budget.min_tokens <= c.budget.tokens, invalid_argument,
          "budget", "min_tokens ", c.budget.min_tokens, " exceeds the cap ", c.budget.tokens);
  if (pick.scorer && pick.scorer->check) pick.scorer->check(a, c);
  if (pick.rule->check) pick.rule->check(a, c);
  detail::check_pair(pick, c);
}

// `out` holding `lists` ([batch][heads], each already ordered), as wide as the widest.
void store_lists(const std::vector<std::vector<std::int32_t>>& lists, SelectionView::Unit unit,
                 int batch, int heads, SelectionStorage& out) {
  std::size_t widest = 0;
  for (const auto& list : lists) widest = std::max(widest, list.size());
  out.reset(unit, batch, heads, static_cast<int>(widest));
  for (int b = 0, i = 0; b < batch; ++b) {
    for (int h = 0; h < heads; ++h, ++i) {
      const auto& list = lists[static_cast<std::size_t>(i)];
      std::copy(list.begin(), list.end(), out.slots(b, h).begin());
      out.count[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(list.size());
    }
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
  for (int b = 0; b < sel.batch; ++b) {
    detail::Group G;
    G.b = b;
    G.page_size = page_size;
    G.pages = table.num_pages(b);
    G.length = table.length(b, page_size);
    G.n = tokens ? static_cast<int>(G.length) : G.pages;
    const detail::Kept kept = detail::kept_items(G, c, tokens);
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
      lists.push_back(std::move(list));
    }
  }
  store_lists(lists, sel.unit, sel.batch, sel.num_kv_heads, out);
}

void union_selections(const SelectionView& a, const SelectionView& b, SelectionStorage& out) {
  require(a.unit == b.unit && a.batch == b.batch && a.num_kv_heads == b.num_kv_heads,
          ErrorCode::shape_mismatch, "selection", "a union of selections of different shapes (",
          a.batch, " x ", a.num_kv_heads, " and ", b.batch, " x ", b.num_kv_heads, ")");
  std::vector<std::vector<std::int32_t>> joined(static_cast<std::size_t>(a.batch) *
                                                a.num_kv_heads);
  for (int s = 0, i = 0; s < a.batch; ++s) {
    for (int h = 0; h < a.num_kv_heads; ++h, ++i) {
      auto& list = joined[static_cast<std::size_t>(i)];
      const auto la = a.list(s, h), lb = b.list(s, h);
      list.assign(la.begin(), la.end());
      list.insert(list.end(), lb.begin(), lb.end());
      std::sort(list.begin(), list.end());
      list.erase(std::unique(list.begin(), list.end()), list.end());
    }
  }
  store_lists(joined, a.unit, a.batch, a.num_kv_heads, out);
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
  using namespace detail;
  const Selector pick = selector_for(config);
  check_args(args, config, pick);
  Context X{args, config, pick.scorer, pick.rule};
  X.d = args.cache.head_dim;
  X.Hq = args.q.n1;
  X.Hkv = args.cache.num_kv_heads;
  X.gsize = X.Hq / X.Hkv;
  X.scale = args.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(X.d)) : args.scale;
  X.tokens = pick.scorer && pick.scorer->tokens && pick.scorer->tokens(config);
  if (pick.scorer && pick.scorer->prepare) pick.scorer->prepare(X);

  const auto& t = args.cache.table;
  // Page-major scans first (each summary array read once, threads over chunks of pages),
  // into buffers kept by this thread across calls.
  thread_local std::vector<float> bounds, wmax;
  thread_local std::vector<double> mom_m, mom_v;
  const std::size_t nnz = t.indices.size();
  const unsigned scans =
      (pick.scorer ? pick.scorer->scans : 0u) | (pick.rule->scans ? pick.rule->scans(args, config) : 0u);
  if (scans & (kBoundScan | kKeyMaxScan)) {
    bounds.resize(nnz * X.Hq);
    const bool want_w = (scans & kKeyMaxScan) && !args.bounds_bf16;
    if (want_w) wmax.resize(nnz * X.Hkv);
    all_page_bounds(args.bounds_bf16 ? nullptr : &args.summaries, args.bounds_bf16, t, args.q,
                    X.scale, bounds.data(), want_w ? wmax.data() : nullptr);
    X.bounds = bounds.data();
    X.wmax = want_w ? wmax.data() : nullptr;
  }
  if (scans & kMomentScan) {
    mom_m.resize(nnz * X.Hq);
    mom_v.resize(nnz * X.Hq);
    all_page_moments(args.summaries, t, args.q, X.scale, mom_m.data(), mom_v.data());
    X.m = mom_m.data();
    X.v = mom_v.data();
  }

  const int B = t.batch(), P = args.cache.page_size;
  thread_local std::vector<Group> groups;
  thread_local std::vector<Limits> limits;
  groups.clear();
  limits.clear();
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
          pick.rule->uses_budget ? item_cap(G, config.budget, k, X.tokens, fill_to_cap) : G.n;
      groups.push_back(G);
      limits.push_back({k, cap, item_floor(G, config.budget, k, cap, X.tokens)});
      max_cap = std::max(max_cap, cap);
    }
  }
  out.selection.reset(X.tokens ? SelectionView::Unit::token : SelectionView::Unit::page, B, X.Hkv,
                      max_cap);
  out.estimate.assign(static_cast<std::size_t>(B) * X.Hq, std::numeric_limits<double>::quiet_NaN());
  out.certified.assign(static_cast<std::size_t>(B) * X.Hkv, 0);
  out.code_pages.assign(static_cast<std::size_t>(B) * X.Hkv, -1);
  const int tasks = static_cast<int>(groups.size());
  const std::vector<Group>& work = groups;
  const std::vector<Limits>& work_limits = limits;
#pragma omp parallel for schedule(dynamic, 1) if (tasks > 1)
  for (int task = 0; task < tasks; ++task) {
    const Group& G = work[static_cast<std::size_t>(task)];
    Scratch& S = Scratch::get();
    const Kept k = kept_items(G, config, X.tokens);
    S.in.assign(static_cast<std::size_t>(G.n), 0);
    std::fill(S.in.begin(), S.in.begin() + k.first_end, 1);
    std::fill(S.in.begin() + k.last_begin, S.in.end(), 1);
    double* est = out.estimate.data() + static_cast<std::size_t>(G.b) * X.Hq + G.h * X.gsize;
    S.code_pages = -1;
    S.listed.clear();
    pick.rule->select(X, G, S, work_limits[static_cast<std::size_t>(task)], est,
                      out.certified[static_cast<std::size_t>(task)]);
    out.code_pages[static_cast<std::size_t>(task)] = S.code_pages;
    const std::span<std::int32_t> slots = out.selection.slots(G.b, G.h);
    int w = 0;
    for (int j = 0; j < G.n; ++j) {
      if (S.in[static_cast<std::size_t>(j)]) slots[w++] = j;
    }
    out.selection.count[static_cast<std::size_t>(task)] = w;
  }
}

}  // namespace masskv::select
