#include "select/learned.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "masskv/error.hpp"
#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "select/group.hpp"
#include "select/vec_math.hpp"

namespace masskv::select::detail {

void check_learned_args(const SelectArgs& a) {
  using enum ErrorCode;
  const kv::KeyRowsView& k = a.learned_keys;
  require(!k.empty() && k.groups > 0 && k.dim > 0, invalid_argument, "learned_keys",
          "a learned selector's method needs the selector key rows of the cache's pool");
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
}

namespace {

// out[t] = ŝ_t for the n tokens of the pages `phys` (logical order, page_size each, the last
// one partial) of selector group `group`.
void learned_token_scores(const kv::KeyRowsView& keys, std::span<const std::int32_t> phys,
                          std::int64_t n, int group, const float* q, double* out) {
  const int P = keys.page_size;
  // A group's page is contiguous: one score_rows call per page.
  const auto stride = static_cast<std::int64_t>(keys.row_bytes());
  for (std::size_t j = 0; j < phys.size(); ++j) {
    const std::int64_t t0 = static_cast<std::int64_t>(j) * P;
    const int len = static_cast<int>(std::min<std::int64_t>(P, n - t0));
    if (len <= 0) break;
    kv::score_rows(keys.format, q, keys.row(phys[j], group, 0), stride, len, keys.dim, out + t0);
  }
}

// out[j] (j < pages of sequence b) = Σ_{t in page j} softmax(ŝ)_t for selector group `group`.
// `scores` is scratch.
void learned_page_masses(const kv::KeyRowsView& keys, const kv::PageTable& table, int b, int group,
                         const float* q, std::vector<double>& scores, double* out) {
  const int pages = table.num_pages(b), P = keys.page_size;
  const std::int64_t L = table.length(b, P);
  scores.resize(static_cast<std::size_t>(L));
  learned_token_scores(keys,
                       table.indices.subspan(static_cast<std::size_t>(table.indptr[b]),
                                             static_cast<std::size_t>(pages)),
                       L, group, q, scores.data());
  double mx = -std::numeric_limits<double>::infinity();
  for (const double s : scores) mx = std::max(mx, s);
  for (double& s : scores) s -= mx;
  exp_inplace(scores.data(), scores.size());
  double total = 0;
  for (int j = 0; j < pages; ++j) {
    const std::size_t from = static_cast<std::size_t>(j) * static_cast<std::size_t>(P);
    const std::size_t to = from + static_cast<std::size_t>(table.page_len(b, j, P));
    double m = 0;
    for (std::size_t t = from; t < to; ++t) m += scores[t];
    out[j] = m;
    total += m;
  }
  for (int j = 0; j < pages; ++j) out[j] /= total;
}

}  // namespace

void prepare_learned(Context& X, LearnedItems items) {
  const kv::PageTable& t = X.a.cache.table;
  const kv::KeyRowsView& keys = X.a.learned_keys;
  const int B = t.batch(), G = keys.groups, P = X.a.cache.page_size;
  const auto count = [&](int b) {  // items of sequence b
    return static_cast<std::size_t>(items == LearnedItems::page_masses ? t.num_pages(b)
                                                                       : t.length(b, P));
  };
  X.prepared.resize(static_cast<std::size_t>(B));
  for (int b = 0; b < B; ++b) {
    X.prepared[static_cast<std::size_t>(b)].resize(static_cast<std::size_t>(G) * count(b));
  }
  const int tasks = B * G;
#pragma omp parallel if (tasks > 1)
  {
    std::vector<double> scores;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / G, g = task % G;
      double* out =
          X.prepared[static_cast<std::size_t>(b)].data() + static_cast<std::size_t>(g) * count(b);
      const float* q = X.a.learned_q.row(b, g);
      if (items == LearnedItems::page_masses) {
        learned_page_masses(keys, t, b, g, q, scores, out);
      } else {
        learned_token_scores(keys,
                             t.indices.subspan(static_cast<std::size_t>(t.indptr[b]),
                                               static_cast<std::size_t>(t.num_pages(b))),
                             t.length(b, P), g, q, out);
      }
    }
  }
}

const double* learned_row(const Context& X, const Group& G) {
  const int group = X.a.learned_keys.groups == 1 ? 0 : G.h;
  return X.prepared[static_cast<std::size_t>(G.b)].data() +
         static_cast<std::size_t>(group) * static_cast<std::size_t>(G.n);
}

}  // namespace masskv::select::detail
