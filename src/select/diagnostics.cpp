// Certificates, certified δ bounds and study measurements of a selection (docs/design.md §2.2,
// §2.5). Run-time quantities read only the selected keys and the page summaries; the study
// quantities read everything (f64, the dense pass).
#include "masskv/select/diagnostics.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "masskv/error.hpp"
#include "select/scores.hpp"

namespace masskv::select {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Rounding-up factor for bounds computed in f64 from f64 scores: their relative error is
// ~1e-15; 1e-9 leaves a wide margin and changes no reported digit.
constexpr double kUp = 1.0 + 1e-9;

double logsumexp(std::span<const double> x) {
  double m = -kInf;
  for (double v : x) m = std::max(m, v);
  if (m == -kInf) return -kInf;
  double s = 0;
  for (double v : x) s += std::exp(v - m);
  return m + std::log(s);
}

template <class T>
void add_values(const kv::PagedKVView& c, int b, int h, std::int64_t token, double w, double* o) {
  const T* v = c.value<T>(c.table.page(b, static_cast<int>(token / c.page_size)), h,
                          static_cast<int>(token % c.page_size));
  for (int x = 0; x < c.head_dim; ++x) o[x] += w * static_cast<double>(to_f32(v[x]));
}
void add_value(const kv::PagedKVView& c, int b, int h, std::int64_t token, double w, double* o) {
  switch (c.dtype) {
    case DType::f32:
      return add_values<float>(c, b, h, token, w, o);
    case DType::f16:
      return add_values<f16>(c, b, h, token, w, o);
    case DType::bf16:
      return add_values<bf16>(c, b, h, token, w, o);
  }
}

// p = map(s) in f64.
void apply_mapping(const Mapping& m, std::span<const double> s, std::vector<double>& p) {
  p.resize(s.size());
  if (s.empty()) return;
  if (m.is_entmax()) {
    entmax(s, m.alpha, std::span<double>(p));
  } else {
    softmax(s, std::span<double>(p));
  }
}

}  // namespace

double score_error_bound(int d, double scale, double q_l1, double w) {
  const double u = 0x1p-24;
  const double n = d + 4.0;
  return n * u / (1.0 - n * u) * scale * q_l1 * w;
}

double certificate_eps(double alpha, int d, double scale, double q_l1, double w) {
  return 2.0 * (alpha - 1.0) * score_error_bound(d, scale, q_l1, w);
}

void check_selection(const SelectionView& s, const kv::PageTable& table, int page_size,
                     int num_kv_heads) {
  using enum ErrorCode;
  require(s.batch == table.batch() && s.num_kv_heads == num_kv_heads, shape_mismatch, "selection",
          "shape [", s.batch, "][", s.num_kv_heads, "] differs from [", table.batch(), "][",
          num_kv_heads, "]");
  require(s.max_per_head >= 0, shape_mismatch, "selection", "negative max_per_head");
  const std::size_t lists = static_cast<std::size_t>(s.batch) * s.num_kv_heads;
  require(s.count.size() == lists && s.ids.size() == lists * s.max_per_head, shape_mismatch,
          "selection", "ids/count sizes do not match the shape");
  for (int b = 0; b < s.batch; ++b) {
    const std::int64_t limit =
        s.unit == SelectionView::Unit::page ? table.num_pages(b) : table.length(b, page_size);
    for (int h = 0; h < s.num_kv_heads; ++h) {
      const int cnt = s.count[b * s.num_kv_heads + h];
      require(cnt >= 0 && cnt <= s.max_per_head, out_of_range, "selection", "count ", cnt, " of (",
              b, ", ", h, ") is outside [0, ", s.max_per_head, "]");
      const std::size_t base = (static_cast<std::size_t>(b) * s.num_kv_heads + h) * s.max_per_head;
      for (int i = 0; i < s.max_per_head; ++i) {
        const std::int32_t id = s.ids[base + i];
        if (i >= cnt) {
          require(id == -1, invalid_argument, "selection", "slot ", i, " of (", b, ", ", h,
                  ") past the count is ", id, ", not -1");
          continue;
        }
        require(id >= 0 && id < limit, out_of_range, "selection", "id ", id, " of (", b, ", ", h,
                ") is outside [0, ", limit, ")");
        require(i == 0 || s.ids[base + i - 1] < id, invalid_argument, "selection", "ids of (", b,
                ", ", h, ") are not strictly ascending at slot ", i);
      }
    }
  }
}

void diagnose(const DiagnosticsArgs& a, std::vector<HeadDiagnostics>& out) {
  using enum ErrorCode;
  a.mapping.validate();
  a.cache.validate();
  require(a.selection != nullptr, invalid_argument, "selection", "null selection");
  const auto& sm = a.summaries;
  require(sm.min && sm.max && sm.max_vnorm, invalid_argument, "summaries",
          "min, max and max_vnorm are needed");
  require(sm.num_pages == a.cache.num_pages && sm.num_kv_heads == a.cache.num_kv_heads &&
              sm.head_dim == a.cache.head_dim,
          shape_mismatch, "summaries", "shape differs from the cache's");
  const auto& t = a.cache.table;
  const int B = t.batch(), Hkv = a.cache.num_kv_heads, d = a.cache.head_dim, P = a.cache.page_size;
  require(a.q.data && a.q.n0 == B && a.q.n2 == d && a.q.n1 % Hkv == 0 && a.q.n1 >= Hkv,
          shape_mismatch, "q", "must be [", B, "][a multiple of ", Hkv, "][", d, "]");
  check_selection(*a.selection, t, P, Hkv);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < a.q.n1; ++h) {
      for (int x = 0; x < d; ++x) {
        require(std::isfinite(a.q.row(b, h)[x]), non_finite, "q", "q[", b, "][", h, "][", x,
                "] is not finite");
      }
    }
  }
  require(std::isfinite(a.scale) && a.scale >= 0, invalid_argument, "scale",
          "must be finite and >= 0");
  const float scale = a.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : a.scale;
  const int Hq = a.q.n1, g = Hq / Hkv;
  const bool entmax_map = a.mapping.is_entmax();
  const double alpha = a.mapping.alpha, r = entmax_map ? 1.0 / (alpha - 1.0) : 1.0;
  out.assign(static_cast<std::size_t>(B) * Hq, HeadDiagnostics{});
  const SelectionView& sel = *a.selection;
  const int tasks = B * Hkv;

  // Everything that can throw ran above.
#pragma omp parallel if (tasks > 1)
  {
    std::vector<float> U;
    std::vector<std::int32_t> pages, all_pages;
    std::vector<int> sel_cnt;
    std::vector<std::uint8_t> tok_sel;
    std::vector<double> sS, sAll, p, pS, lw, o, oh;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / Hkv, h = task % Hkv;
      const int np = t.num_pages(b);
      const std::int64_t L = t.length(b, P);
      const auto phys =
          t.indices.subspan(static_cast<std::size_t>(t.indptr[b]), static_cast<std::size_t>(np));
      const auto ids = sel.list(b, h);
      // Selected tokens per page; a page counts as selected only when all its tokens are.
      sel_cnt.assign(static_cast<std::size_t>(np), 0);
      tok_sel.assign(static_cast<std::size_t>(L), 0);
      for (std::int32_t id : ids) {
        if (sel.unit == SelectionView::Unit::page) {
          const int len = t.page_len(b, id, P);
          sel_cnt[id] = len;
          std::fill_n(tok_sel.begin() + static_cast<std::ptrdiff_t>(id) * P, len, 1);
        } else {
          ++sel_cnt[id / P];
          tok_sel[id] = 1;
        }
      }
      U.resize(static_cast<std::size_t>(g) * np);
      const float* q0 = a.q.row(b, h * g);
      if (a.bounds_bf16) {
        page_upper_bounds(*a.bounds_bf16, phys, h, q0, g, a.q.s1, scale, U);
      } else {
        page_upper_bounds(sm, phys, h, q0, g, a.q.s1, scale, U);
      }
      double w = 0, vS = 0, vU = 0;
      for (int j = 0; j < np; ++j) {
        const std::int64_t at = sm.at(phys[j], h);
        for (int x = 0; x < d; ++x) {
          w = std::max({w, std::fabs(static_cast<double>(sm.min[at + x])),
                        std::fabs(static_cast<double>(sm.max[at + x]))});
        }
        const double vn = sm.max_vnorm[static_cast<std::int64_t>(phys[j]) * Hkv + h];
        if (sel_cnt[j] > 0) vS = std::max(vS, vn);
        if (sel_cnt[j] < t.page_len(b, j, P)) vU = std::max(vU, vn);
      }
      if (a.study) {
        all_pages.resize(static_cast<std::size_t>(np));
        std::iota(all_pages.begin(), all_pages.end(), 0);
      }
      for (int i = 0; i < g; ++i) {
        const int qh = h * g + i;
        const float* q = a.q.row(b, qh);
        HeadDiagnostics& D = out[static_cast<std::size_t>(b) * Hq + qh];
        sS.clear();
        detail::append_scores(a.cache, b, h, q, scale, sel.unit, ids, sS);
        D.selected_tokens = static_cast<std::int64_t>(sS.size());
        D.total_tokens = L;
        const float* Ui = U.data() + static_cast<std::size_t>(i) * np;
        double maxU = -kInf;
        bool any_unselected = false;
        for (int j = 0; j < np; ++j) {
          if (sel_cnt[j] < t.page_len(b, j, P)) {
            any_unselected = true;
            maxU = std::max(maxU, static_cast<double>(Ui[j]));
          }
        }
        double ql1 = 0;
        for (int x = 0; x < d; ++x) ql1 += std::fabs(static_cast<double>(q[x]));
        if (sS.empty()) {
          D.certified = !any_unselected;
          D.margin = -kInf;
          D.tau_lo = D.tau_or_lse = entmax_map ? kNaN : -kInf;
          D.delta_bound = 1;
        } else if (!entmax_map) {
          // §2.5 softmax: δ <= X / (Z_S + X) = sigmoid(lse_X − lse_S), X = Σ n_j e^{U_j}.
          D.tau_or_lse = logsumexp(sS);
          lw.clear();
          for (int j = 0; j < np; ++j) {
            const int nj = t.page_len(b, j, P) - sel_cnt[j];
            if (nj > 0) lw.push_back(std::log(static_cast<double>(nj)) + Ui[j]);
          }
          const double lseX = logsumexp(lw);
          D.delta_bound =
              lseX == -kInf ? 0.0 : std::min(1.0, kUp / (1.0 + std::exp(D.tau_or_lse - lseX)));
          D.certified = !any_unselected;
          D.margin = any_unselected ? D.tau_or_lse - lseX : kInf;
          D.tau_lo = D.eps = kNaN;
        } else {
          // §2.2 certificate; §2.5 entmax bound Σ n_j [(α−1)U_j − τ_lo(S)]_+^{1/(α−1)}.
          const EntmaxThreshold th = entmax_threshold(std::span<const double>(sS), alpha);
          D.tau_or_lse = th.tau;
          D.tau_lo = th.tau_lo;
          D.eps = certificate_eps(alpha, d, scale, ql1, w);
          D.margin = any_unselected ? th.tau_lo - D.eps - (alpha - 1.0) * maxU : kInf;
          D.certified = D.margin >= 0;
          double bound = 0;
          if (!D.certified) {
            for (int j = 0; j < np; ++j) {
              const int nj = t.page_len(b, j, P) - sel_cnt[j];
              const double e = (alpha - 1.0) * Ui[j] - th.tau_lo;
              if (nj > 0 && e > 0) bound += nj * std::pow(e, r);
            }
          }
          D.delta_bound = std::min(1.0, bound * kUp);
        }
        D.error_bound = D.delta_bound * (vS + vU) * (1.0 + 1e-6);
        if (!a.study) continue;

        // Study: the dense f64 pass.
        sAll.clear();
        detail::append_scores(a.cache, b, h, q, scale, SelectionView::Unit::page, all_pages, sAll);
        apply_mapping(a.mapping, sAll, p);
        apply_mapping(a.mapping, sS, pS);
        double delta = 0;
        for (std::int64_t k = 0; k < L; ++k) delta += tok_sel[k] ? 0.0 : p[k];
        D.delta = delta;
        // Recall of the support (entmax) or of the smallest 90%-mass set (softmax).
        std::int64_t need = 0, got = 0;
        if (entmax_map) {
          for (std::int64_t k = 0; k < L; ++k) {
            if (p[k] > 0) {
              ++need;
              got += tok_sel[k];
            }
          }
        } else {
          std::vector<std::int64_t> order(static_cast<std::size_t>(L));
          std::iota(order.begin(), order.end(), 0);
          std::sort(order.begin(), order.end(), [&](std::int64_t x, std::int64_t y) {
            return p[x] > p[y] || (p[x] == p[y] && x < y);
          });
          double cum = 0;
          for (std::int64_t k : order) {
            if (cum >= 0.9) break;
            cum += p[k];
            ++need;
            got += tok_sel[k];
          }
        }
        D.support = need;
        D.recall = need ? static_cast<double>(got) / static_cast<double>(need) : 1.0;
        o.assign(static_cast<std::size_t>(d), 0.0);
        oh.assign(static_cast<std::size_t>(d), 0.0);
        for (std::int64_t k = 0; k < L; ++k) {
          if (p[k] != 0) add_value(a.cache, b, h, k, p[k], o.data());
        }
        std::size_t si = 0;
        for (std::int64_t k = 0; k < L; ++k) {
          if (!tok_sel[k]) continue;
          // Selected tokens in ascending order match the score order of sS (ids ascending).
          if (pS[si] != 0) add_value(a.cache, b, h, k, pS[si], oh.data());
          ++si;
        }
        double e2 = 0, o2 = 0;
        for (int x = 0; x < d; ++x) {
          e2 += (o[x] - oh[x]) * (o[x] - oh[x]);
          o2 += o[x] * o[x];
        }
        D.abs_error = std::sqrt(e2);
        D.rel_error = o2 > 0 ? D.abs_error / std::sqrt(o2) : D.abs_error;
        const double vmax = std::max(vS, vU);
        D.bounds_held = D.delta <= D.delta_bound + 1e-12 &&
                        D.abs_error <= D.error_bound + 1e-9 * std::max(1.0, vmax) &&
                        (!D.certified || D.abs_error <= 1e-9 * std::max(1.0, std::sqrt(o2)));
      }
    }
  }
}

}  // namespace masskv::select
