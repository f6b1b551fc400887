// 8-bit and hierarchical page summaries for the Quest bound (compact_bounds.hpp), evaluated
// in the GPU scoring kernel's order.
#include "masskv/select/compact_bounds.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "masskv/error.hpp"
#include "masskv/kv/page_codes.hpp"
#include "masskv/select/selector.hpp"
#include "select/page_scan.hpp"
#include "select/topk_rank.hpp"

namespace masskv::select {

namespace {

// The query side, split as the GPU kernel stages it: q+ = max(q, 0), q- = min(q, 0), and
// f·||q||_1 with ||q||_1 summed in channel order (f = 2(2d+4)·2^-24, page_bound.cpp).
struct GpuQuery {
  std::vector<float> pos, neg, fq;  // [num_q][d], [num_q][d], [num_q]
  void assign(const float* q, int num_q, std::int64_t q_stride, int d) {
    pos.assign(static_cast<std::size_t>(num_q) * d, 0.f);
    neg.assign(pos.size(), 0.f);
    fq.assign(static_cast<std::size_t>(num_q), 0.f);
    const float f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
    for (int i = 0; i < num_q; ++i) {
      float l1 = 0;
      for (int c = 0; c < d; ++c) {
        const float x = q[i * q_stride + c];
        pos[static_cast<std::size_t>(i) * d + c] = x > 0 ? x : 0.f;
        neg[static_cast<std::size_t>(i) * d + c] = x < 0 ? x : 0.f;
        l1 += std::fabs(x);
      }
      fq[static_cast<std::size_t>(i)] = f * l1;
    }
  }
};

// One bound from dequantised rows mn/mx (d floats) for q head i, in the GPU order: eight FMA
// chains per side, v_l = (q+·M)_l + (q-·m)_l, the AVX2 horizontal sum, then
// scale · ((S + fq·W) + FLT_MIN) with every operation rounded (no contraction: this file is
// compiled without -mfma, and std::fma is the only fused operation).
float bound_gpu_order(const float* mn, const float* mx, float w, int d, const GpuQuery& gq, int i,
                      float scale) {
  const float* qp = gq.pos.data() + static_cast<std::size_t>(i) * d;
  const float* qn = gq.neg.data() + static_cast<std::size_t>(i) * d;
  float ap[8] = {}, an[8] = {};
  for (int c = 0; c < d; ++c) {
    ap[c % 8] = std::fma(qp[c], mx[c], ap[c % 8]);
    an[c % 8] = std::fma(qn[c], mn[c], an[c % 8]);
  }
  float v[8];
  for (int l = 0; l < 8; ++l) v[l] = ap[l] + an[l];
  const float s = ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
  const float slack = gq.fq[static_cast<std::size_t>(i)] * w;
  return scale * ((s + slack) + std::numeric_limits<float>::min());
}

float row_w(const float* mn, const float* mx, int d) {
  float w = 0;
  for (int c = 0; c < d; ++c) {
    const float a = std::fabs(mn[c]), b = std::fabs(mx[c]);
    const float x = a > b ? a : b;
    w = x > w ? x : w;
  }
  return w;
}

void check_args(int num_pages, int num_kv_heads, int d, std::span<const std::int32_t> pages,
                int kv_head, const float* q, int num_q, float scale, std::span<float> out) {
  using enum ErrorCode;
  require(kv_head >= 0 && kv_head < num_kv_heads, out_of_range, "kv_head", kv_head,
          " is outside [0, ", num_kv_heads, ")");
  require(q != nullptr, invalid_argument, "q", "null query");
  require(num_q >= 1, invalid_argument, "num_q", "must be >= 1, got ", num_q);
  require(std::isfinite(scale) && scale > 0, invalid_argument, "scale", "must be finite and > 0");
  require(out.size() == static_cast<std::size_t>(num_q) * pages.size(), shape_mismatch, "out",
          "needs num_q * pages.size() values");
  require(d >= 1, invalid_argument, "head_dim", "must be >= 1");
  for (std::size_t j = 0; j < pages.size(); ++j)
    require(pages[j] >= 0 && pages[j] < num_pages, out_of_range, "pages", "pages[", j,
            "] = ", pages[j], " is outside [0, ", num_pages, ")");
}

// Rows of one (page, head) of either store, dequantised to floats.
void rows_of(const BoundStore8View& s, std::int32_t page, int h, float* mn, float* mx) {
  const std::int64_t o = s.at(page, h);
  const float* g = s.grid + 2 * (static_cast<std::int64_t>(page) * s.num_kv_heads + h);
  for (int c = 0; c < s.head_dim; ++c) {
    mn[c] = dequant8(s.min[o + c], g[0], g[1]);
    mx[c] = dequant8(s.max[o + c], g[0], g[1]);
  }
}
void rows_of(const BoundStoreView& s, std::int32_t page, int h, float* mn, float* mx) {
  const std::int64_t o = s.at(page, h);
  for (int c = 0; c < s.head_dim; ++c) {
    mn[c] = bf16_to_f32(s.min[o + c]);
    mx[c] = bf16_to_f32(s.max[o + c]);
  }
}

// Bounds of every page of `pages` for q heads [0, num_q) of gq (rows of out: stride n).
template <class Store>
void bounds_gpu_order(const Store& s, std::span<const std::int32_t> pages, int h,
                      const GpuQuery& gq, int num_q, float scale, float* out) {
  const int d = s.head_dim;
  const int n = static_cast<int>(pages.size());
  std::vector<float> mn(static_cast<std::size_t>(d)), mx(mn.size());
  for (int j = 0; j < n; ++j) {
    rows_of(s, pages[j], h, mn.data(), mx.data());
    const float w = row_w(mn.data(), mx.data(), d);
    for (int i = 0; i < num_q; ++i)
      out[static_cast<std::size_t>(i) * n + j] =
          bound_gpu_order(mn.data(), mx.data(), w, d, gq, i, scale);
  }
}

template <class Store>
void upper_bounds_impl(const Store& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out) {
  check_args(s.num_pages, s.num_kv_heads, s.head_dim, pages, kv_head, q, num_q, scale, out);
  GpuQuery gq;
  gq.assign(q, num_q, q_stride, s.head_dim);
  bounds_gpu_order(s, pages, kv_head, gq, num_q, scale, out.data());
}

// The group rank of page j: max over the group's q heads of its bounds (rows of stride n), in
// head order as topk_one.
std::uint32_t group_key(const float* rows, int g, int n, int j) {
  float m = rows[j];
  for (int i = 1; i < g; ++i)
    m = rows[static_cast<std::size_t>(i) * n + j] > m ? rows[static_cast<std::size_t>(i) * n + j]
                                                      : m;
  return detail::ordered_key(m);
}

// The entmax-aware group key of page j: max over the group's q heads (head order, as
// group_key) of entmax_rank; 0 (never taken by an adaptive rule) when `eligible_only` and the
// rank is not above -margin.
std::uint32_t entmax_key(const float* rows, int g, int n, int j, double am1, const double* tau,
                         bool eligible_only, float margin) {
  float m = entmax_rank(rows[j], am1, tau[0]);
  for (int i = 1; i < g; ++i) {
    const float r = entmax_rank(rows[static_cast<std::size_t>(i) * n + j], am1, tau[i]);
    m = r > m ? r : m;
  }
  if (eligible_only && !(m > -margin)) return 0u;
  return detail::ordered_key(m);
}

// The flat selection rule on 32-bit rank keys (candidates [sinks, window) by key, ties to the
// lower page id); returns the count. keyed_only: candidates of key 0 are never taken (the
// adaptive rule: fewer than the budget when fewer are keyed).
int select_by_keys(const std::uint32_t* keys, int n, std::int64_t length, int page_size,
                   const TopkPolicy& pol, std::int32_t* out, int out_size, bool keyed_only = false) {
  detail::TopkSplit split = detail::topk_split(n, length, page_size, pol);
  std::vector<std::uint64_t> cand;
  if (split.need > 0) {
    for (int j = split.sinks; j < split.window; ++j)
      if (!keyed_only || keys[j] != 0u)
        cand.push_back(static_cast<std::uint64_t>(keys[j]) << 32 |
                       (0xffffffffu - static_cast<std::uint32_t>(j)));
    if (keyed_only) split.need = std::min(split.need, static_cast<int>(cand.size()));
  }
  return detail::write_topk(split, n, cand, out, out_size);
}

int max_selected(const kv::PageTable& t, int page_size, const TopkPolicy& pol) {
  int m = 0;
  for (int b = 0; b < t.batch(); ++b)
    m = std::max(m, topk_selected_pages(t.num_pages(b), t.length(b, page_size), page_size, pol));
  return m;
}

void check_q(const View3<const float>& q, const kv::PageTable& table, int d, int hkv) {
  using enum ErrorCode;
  require(q.data != nullptr && q.n0 == table.batch() && q.n2 == d, shape_mismatch, "q",
          "must be [batch][q heads][head_dim] of the table and store");
  require(q.n1 >= hkv && q.n1 % hkv == 0, shape_mismatch, "q",
          "q heads must be a multiple of the kv heads");
  for (int b = 0; b < q.n0; ++b)
    for (int h = 0; h < q.n1; ++h)
      for (int c = 0; c < d; ++c)
        require(std::isfinite(q.row(b, h)[c]), non_finite, "q", "q[", b, "][", h, "][", c,
                "] is not finite");
}

}  // namespace

// ---- BoundStore8 ------------------------------------------------------------------------------

void BoundStore8::round_page(const kv::SummariesView& s, std::int32_t page) {
  const int d = head_dim_;
  for (int h = 0; h < num_kv_heads_; ++h) {
    const std::size_t base = (static_cast<std::size_t>(page) * num_kv_heads_ + h) * d;
    kv::round_range8(s.min + base, s.max + base, d, min_.data() + base, max_.data() + base,
                     grid_.data() + 2 * (static_cast<std::size_t>(page) * num_kv_heads_ + h));
  }
}

BoundStore8::BoundStore8(const kv::SummariesView& s)
    : num_pages_(s.num_pages), num_kv_heads_(s.num_kv_heads), head_dim_(s.head_dim) {
  require(s.min != nullptr && s.max != nullptr, ErrorCode::invalid_argument, "s",
          "summaries without min/max");
  const std::size_t n = static_cast<std::size_t>(num_pages_) * num_kv_heads_ * head_dim_;
  min_.resize(n);
  max_.resize(n);
  grid_.resize(2 * static_cast<std::size_t>(num_pages_) * num_kv_heads_);
  for (std::int32_t p = 0; p < num_pages_; ++p) round_page(s, p);
}

void BoundStore8::update(const kv::SummariesView& s, std::span<const std::int32_t> pages) {
  require(s.num_pages == num_pages_ && s.num_kv_heads == num_kv_heads_ && s.head_dim == head_dim_,
          ErrorCode::shape_mismatch, "s", "summaries differ in shape from the store's");
  for (std::size_t j = 0; j < pages.size(); ++j)
    require(pages[j] >= 0 && pages[j] < num_pages_, ErrorCode::out_of_range, "pages", "pages[", j,
            "] = ", pages[j], " is outside [0, ", num_pages_, ")");
  for (std::int32_t p : pages) round_page(s, p);
}

BoundStore8View BoundStore8::view() const {
  return {min_.data(), max_.data(), grid_.data(), num_pages_, num_kv_heads_, head_dim_};
}

double BoundStore8::bytes_per_token(int page_size) const {
  require(page_size > 0, ErrorCode::invalid_argument, "page_size", "must be > 0");
  return (2.0 * num_kv_heads_ * head_dim_ + 8.0 * num_kv_heads_) / page_size;
}

void page_upper_bounds(const BoundStore8View& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out) {
  require(s.min && s.max && s.grid, ErrorCode::invalid_argument, "s", "null codes or grid");
  upper_bounds_impl(s, pages, kv_head, q, num_q, q_stride, scale, out);
}

void page_upper_bounds_gpu_order(const BoundStoreView& s, std::span<const std::int32_t> pages,
                                 int kv_head, const float* q, int num_q, std::int64_t q_stride,
                                 float scale, std::span<float> out) {
  require(s.min && s.max, ErrorCode::invalid_argument, "s", "null min/max");
  upper_bounds_impl(s, pages, kv_head, q, num_q, q_stride, scale, out);
}

// ---- GroupStore -------------------------------------------------------------------------------

namespace {

// The table of groups of G consecutive logical pages of every sequence (GroupStore's and
// MomentStore's): sequence b's group i is slot indptr[b] + i, indices = 0, 1, 2, ...; returns
// the number of slots.
int group_table(const kv::PageTable& table, int group_pages, std::vector<std::int32_t>& indptr,
                std::vector<std::int32_t>& indices) {
  indptr.assign(1, 0);
  for (int b = 0; b < table.batch(); ++b)
    indptr.push_back(indptr.back() + (table.num_pages(b) + group_pages - 1) / group_pages);
  const int slots = indptr.back();
  indices.resize(static_cast<std::size_t>(slots));
  for (int i = 0; i < slots; ++i) indices[static_cast<std::size_t>(i)] = i;
  return slots;
}

}  // namespace

GroupStore::GroupStore(const BoundStoreView& pages, const kv::PageTable& table, int group_pages)
    : num_kv_heads_(pages.num_kv_heads), head_dim_(pages.head_dim), group_pages_(group_pages) {
  using enum ErrorCode;
  require(group_pages >= 1, invalid_argument, "group_pages", "must be >= 1, got ", group_pages);
  require(pages.min && pages.max, invalid_argument, "pages", "null min/max");
  const int B = table.batch();
  num_slots_ = group_table(table, group_pages, indptr_, indices_);
  const std::size_t row = static_cast<std::size_t>(num_kv_heads_) * head_dim_;
  min_.assign(static_cast<std::size_t>(num_slots_) * row, bf16{});
  max_.assign(min_.size(), bf16{});
  wmax_.assign(static_cast<std::size_t>(num_slots_) * num_kv_heads_, 0.f);
  for (int b = 0; b < B; ++b) {
    const int n = table.num_pages(b);
    for (int gi = 0; gi * group_pages < n; ++gi) {
      const std::size_t slot = static_cast<std::size_t>(indptr_[b] + gi);
      for (int h = 0; h < num_kv_heads_; ++h) {
        bf16* gm = min_.data() + slot * row + static_cast<std::size_t>(h) * head_dim_;
        bf16* gM = max_.data() + slot * row + static_cast<std::size_t>(h) * head_dim_;
        float w = 0;
        for (int c = 0; c < head_dim_; ++c) {
          float lo = std::numeric_limits<float>::infinity(), hi = -lo;
          for (int j = gi * group_pages; j < std::min(n, (gi + 1) * group_pages); ++j) {
            const std::int32_t p = table.page(b, j);
            require(p >= 0 && p < pages.num_pages, out_of_range, "table", "page id ", p,
                    " is outside the store");
            lo = std::min(lo, bf16_to_f32(pages.min[pages.at(p, h) + c]));
            hi = std::max(hi, bf16_to_f32(pages.max[pages.at(p, h) + c]));
          }
          // Min and max of bf16 values are bf16 values: exact.
          gm[c] = f32_to_bf16_down(lo);
          gM[c] = f32_to_bf16_up(hi);
          w = std::max(w, std::max(std::fabs(lo), std::fabs(hi)));
        }
        wmax_[slot * num_kv_heads_ + h] = w;
      }
    }
  }
}

BoundStoreView GroupStore::view() const {
  return {min_.data(), max_.data(), num_slots_, num_kv_heads_, head_dim_, wmax_.data()};
}

double GroupStore::bytes_per_token(int page_size) const {
  require(page_size > 0, ErrorCode::invalid_argument, "page_size", "must be > 0");
  return 4.0 * num_kv_heads_ * head_dim_ / (static_cast<double>(group_pages_) * page_size);
}

// ---- MomentStore ------------------------------------------------------------------------------

MomentStore::MomentStore(const kv::SummariesView& pages, const kv::PageTable& table,
                         int group_pages)
    : num_kv_heads_(pages.num_kv_heads), head_dim_(pages.head_dim), group_pages_(group_pages) {
  using enum ErrorCode;
  require(group_pages >= 1, invalid_argument, "group_pages", "must be >= 1, got ", group_pages);
  require(pages.mean && pages.m2 && pages.count, invalid_argument, "pages",
          "null mean, M2 or count");
  const int B = table.batch();
  num_slots_ = group_table(table, group_pages, indptr_, indices_);
  last_len_.assign(static_cast<std::size_t>(B), 1);
  const int d = head_dim_;
  const std::size_t row = static_cast<std::size_t>(num_kv_heads_) * d;
  mean_.assign(static_cast<std::size_t>(num_slots_) * row, 0.f);
  m2_.assign(mean_.size(), 0.f);
  count_.assign(static_cast<std::size_t>(num_slots_), 0);
  std::vector<double> mu(static_cast<std::size_t>(d)), m2(mu.size());
  for (int b = 0; b < B; ++b) {
    const int n = table.num_pages(b);
    for (int gi = 0; gi * group_pages < n; ++gi) {
      const std::size_t slot = static_cast<std::size_t>(indptr_[b] + gi);
      const int j0 = gi * group_pages, j1 = std::min(n, j0 + group_pages);
      long total = 0;
      for (int j = j0; j < j1; ++j) {
        const std::int32_t p = table.page(b, j);
        require(p >= 0 && p < pages.num_pages, out_of_range, "table", "page id ", p,
                " is outside the summaries");
        total += std::max(0, pages.count[p]);
      }
      count_[slot] = static_cast<std::int32_t>(total);
      if (total == 0) continue;
      for (int h = 0; h < num_kv_heads_; ++h) {
        std::fill(mu.begin(), mu.end(), 0.0);
        std::fill(m2.begin(), m2.end(), 0.0);
        for (int j = j0; j < j1; ++j) {
          const std::int32_t p = table.page(b, j);
          const double nj = std::max(0, pages.count[p]);
          for (int c = 0; c < d && nj > 0; ++c) mu[c] += nj * pages.mean[pages.at(p, h) + c];
        }
        for (int c = 0; c < d; ++c) mu[c] /= static_cast<double>(total);
        for (int j = j0; j < j1; ++j) {
          const std::int32_t p = table.page(b, j);
          const double nj = std::max(0, pages.count[p]);
          if (nj == 0) continue;
          for (int c = 0; c < d; ++c) {
            const double dev = pages.mean[pages.at(p, h) + c] - mu[c];
            m2[c] += std::max(0.0, static_cast<double>(pages.m2[pages.at(p, h) + c])) + nj * dev * dev;
          }
        }
        for (int c = 0; c < d; ++c) {
          mean_[slot * row + static_cast<std::size_t>(h) * d + c] = static_cast<float>(mu[c]);
          m2_[slot * row + static_cast<std::size_t>(h) * d + c] = static_cast<float>(m2[c]);
        }
      }
    }
  }
}

kv::SummariesView MomentStore::view() const {
  kv::SummariesView v;
  v.mean = mean_.data();
  v.m2 = m2_.data();
  v.count = count_.data();
  v.num_pages = num_slots_;
  v.num_kv_heads = num_kv_heads_;
  v.head_dim = head_dim_;
  return v;
}

double MomentStore::bytes_per_token(int page_size) const {
  require(page_size > 0, ErrorCode::invalid_argument, "page_size", "must be > 0");
  return 8.0 * num_kv_heads_ * head_dim_ / (static_cast<double>(group_pages_) * page_size);
}

void group_tau_hat(const MomentStore& store, const View3<const float>& q, float scale_arg,
                   double alpha, std::span<double> tau) {
  using enum ErrorCode;
  const kv::SummariesView s = store.view();
  const int B = static_cast<int>(store.indptr().size()) - 1, Hq = q.n1, d = s.head_dim;
  require(B >= 0 && q.data != nullptr && q.n0 == B && q.n2 == d && Hq % s.num_kv_heads == 0,
          shape_mismatch, "q", "must be [batch][q heads][head_dim] of the store");
  require(alpha > 1.0 && alpha <= 2.0, invalid_argument, "alpha", "must be in (1, 2], got ",
          alpha);
  require(tau.size() == static_cast<std::size_t>(B) * Hq, shape_mismatch, "tau",
          "needs batch * q heads values");
  const kv::PageTable groups = store.table();
  const double scale = scale_arg == 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : scale_arg;
  const std::size_t total = static_cast<std::size_t>(store.indptr().back()) * Hq;
  std::vector<double> m(total), v(total), n;
  detail::all_page_moments(s, groups, q, scale, m.data(), v.data());
  for (int b = 0; b < B; ++b) {
    const int ng = groups.num_pages(b);
    n.resize(static_cast<std::size_t>(ng));
    long tokens = 0;
    for (int i = 0; i < ng; ++i) {
      n[static_cast<std::size_t>(i)] = s.count[groups.page(b, i)];
      tokens += s.count[groups.page(b, i)];
    }
    for (int i = 0; i < Hq; ++i) {
      double& t = tau[static_cast<std::size_t>(b) * Hq + i];
      if (tokens == 0) {
        t = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      const std::size_t o = static_cast<std::size_t>(groups.indptr[b]) * Hq +
                            static_cast<std::size_t>(i) * ng;
      t = gaussian_tau_hat(std::span<const double>(m.data() + o, static_cast<std::size_t>(ng)),
                           std::span<const double>(v.data() + o, static_cast<std::size_t>(ng)), n,
                           alpha);
    }
  }
}

int hier_groups(int num_groups, int group_pages, int budget_pages, double cover) {
  require(cover > 0 && std::isfinite(cover), ErrorCode::invalid_argument, "cover",
          "must be finite and > 0, got ", cover);
  const double extra = std::ceil(cover * std::max(0, budget_pages) / group_pages);
  return static_cast<int>(std::min<double>(num_groups, 1.0 + extra));
}

// ---- selectors --------------------------------------------------------------------------------

void hier_select(const HierSelectArgs& a, SelectionStorage& out,
                 std::vector<std::uint32_t>* page_keys, int keys_stride) {
  using enum ErrorCode;
  require(a.pages != nullptr && a.groups != nullptr, invalid_argument, "pages",
          "needs the page store and its group store");
  const BoundStoreView& ps = *a.pages;
  const BoundStoreView gs = a.groups->view();
  const int Hkv = ps.num_kv_heads, d = ps.head_dim, B = a.table.batch();
  check_q(a.q, a.table, d, Hkv);
  require(static_cast<int>(a.groups->indptr().size()) == B + 1, shape_mismatch, "groups",
          "was built for another table");
  require(a.pages8 == nullptr || (a.pages8->min && a.pages8->max && a.pages8->grid &&
                                  a.pages8->num_pages == ps.num_pages &&
                                  a.pages8->num_kv_heads == Hkv && a.pages8->head_dim == d),
          shape_mismatch, "pages8", "must be the 8-bit store of the same pages");
  require(a.tau == nullptr || (a.alpha > 1.0 && a.alpha <= 2.0), invalid_argument, "alpha",
          "must be in (1, 2] for the entmax-aware rank, got ", a.alpha);
  require(a.tau == nullptr || std::isfinite(a.margin), invalid_argument, "margin",
          "must be finite");
  const int G = a.groups->group_pages();
  const int g = a.q.n1 / Hkv;
  const float scale = a.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : a.scale;
  out.reset(SelectionView::Unit::page, B, Hkv, max_selected(a.table, a.page_size, a.policy));
  if (page_keys) {
    int mp = 0;
    for (int b = 0; b < B; ++b) mp = std::max(mp, a.table.num_pages(b));
    if (keys_stride == 0) keys_stride = mp;
    require(keys_stride >= mp, invalid_argument, "keys_stride", "below the longest sequence");
    page_keys->assign(static_cast<std::size_t>(B) * Hkv * keys_stride, 0u);
  }
  GpuQuery gq;
  std::vector<float> gb, pb;
  std::vector<std::uint32_t> keys;
  std::vector<std::uint64_t> granks;
  for (int b = 0; b < B; ++b) {
    const int n = a.table.num_pages(b);
    if (n == 0) continue;
    const int ng = (n + G - 1) / G;
    const std::span<const std::int32_t> slots = a.groups->indices().subspan(
        static_cast<std::size_t>(a.groups->indptr()[b]), static_cast<std::size_t>(ng));
    const std::span<const std::int32_t> phys = a.table.indices.subspan(
        static_cast<std::size_t>(a.table.indptr[b]), static_cast<std::size_t>(n));
    const int m = hier_groups(ng, G, a.policy.budget_pages, a.cover);
    for (int h = 0; h < Hkv; ++h) {
      gq.assign(a.q.row(b, h * g), g, a.q.s1, d);
      gb.resize(static_cast<std::size_t>(g) * ng);
      bounds_gpu_order(gs, slots, h, gq, g, scale, gb.data());
      const double* tau = a.tau != nullptr ? a.tau + static_cast<std::size_t>(b) * a.q.n1 + h * g
                                            : nullptr;
      // Group and page keys: Quest's max bound, or the entmax-aware rank (groups are never
      // dropped by the adaptive rule: a group's rank bounds its pages').
      const auto key_of = [&](const float* rows, int cols, int j, bool page) {
        return tau == nullptr ? group_key(rows, g, cols, j)
                              : entmax_key(rows, g, cols, j, a.alpha - 1.0, tau,
                                           page && a.adaptive, a.margin);
      };
      // The last group and the best m - 1 others (ties to the lower group id).
      std::vector<std::uint8_t> chosen(static_cast<std::size_t>(ng), 0);
      chosen[static_cast<std::size_t>(ng - 1)] = 1;
      granks.clear();
      for (int i = 0; i + 1 < ng; ++i)
        granks.push_back(static_cast<std::uint64_t>(key_of(gb.data(), ng, i, false)) << 32 |
                         (0xffffffffu - static_cast<std::uint32_t>(i)));
      detail::keep_best(granks, static_cast<std::size_t>(m - 1));
      for (std::uint64_t k : granks) chosen[static_cast<std::size_t>(detail::topk_key_page(k))] = 1;
      // Page keys: scored pages of chosen groups, 0 elsewhere.
      std::vector<std::int32_t> sub, sub_j;
      for (int j = 0; j < n; ++j)
        if (chosen[static_cast<std::size_t>(j / G)]) {
          sub.push_back(phys[static_cast<std::size_t>(j)]);
          sub_j.push_back(j);
        }
      pb.resize(static_cast<std::size_t>(g) * sub.size());
      if (a.pages8 != nullptr) {
        bounds_gpu_order(*a.pages8, sub, h, gq, g, scale, pb.data());
      } else {
        bounds_gpu_order(ps, sub, h, gq, g, scale, pb.data());
      }
      keys.assign(static_cast<std::size_t>(n), 0u);
      for (std::size_t x = 0; x < sub.size(); ++x)
        keys[static_cast<std::size_t>(sub_j[x])] =
            key_of(pb.data(), static_cast<int>(sub.size()), static_cast<int>(x), true);
      const std::span<std::int32_t> sl = out.slots(b, h);
      out.count[b * Hkv + h] =
          select_by_keys(keys.data(), n, a.table.length(b, a.page_size), a.page_size, a.policy,
                         sl.data(), static_cast<int>(sl.size()), tau != nullptr && a.adaptive);
      if (page_keys)
        std::copy(keys.begin(), keys.end(),
                  page_keys->begin() + (static_cast<std::ptrdiff_t>(b) * Hkv + h) * keys_stride);
    }
  }
}

int top_p_by_masses(const double* mass, const std::uint8_t* candidate, int n, std::int64_t length,
                    int page_size, const TopkPolicy& pol, double p, std::int32_t* out,
                    int out_size) {
  detail::TopkSplit split = detail::topk_split(n, length, page_size, pol);
  // The kept pages' masses start the count, in page order (sinks, then the window pages).
  double held = 0;
  for (int j = 0; j < std::min(split.sinks, split.window); ++j) held += mass[j];
  for (int j = split.window; j < n; ++j) held += mass[j];
  std::vector<std::uint64_t> cand;
  if (split.need > 0) {
    for (int j = split.sinks; j < split.window; ++j)
      if (candidate[j])
        cand.push_back(detail::topk_key(static_cast<float>(mass[j]), j));
    std::sort(cand.begin(), cand.end(), std::greater<>());
  }
  std::size_t taken = 0;
  while (taken < cand.size() && static_cast<int>(taken) < split.need && held < p)
    held += mass[detail::topk_key_page(cand[taken++])];
  cand.resize(taken);
  split.need = static_cast<int>(taken);
  return detail::write_topk(split, n, cand, out, out_size);
}

void hier_top_p(const HierTopPArgs& a, SelectionStorage& out, std::vector<double>* masses,
                int keys_stride) {
  using enum ErrorCode;
  const HierSelectArgs& h = a.hier;
  require(h.tau == nullptr, invalid_argument, "tau", "top-p chooses groups by Quest's bounds");
  require(a.p > 0 && a.p <= 1, invalid_argument, "p", "must be in (0, 1], got ", a.p);
  require(a.moments != nullptr, invalid_argument, "moments", "the pooled moments are required");
  require(a.pages.mean && a.pages.m2 && a.pages.count && h.pages != nullptr &&
              a.pages.num_kv_heads == h.pages->num_kv_heads &&
              a.pages.head_dim == h.pages->head_dim && a.pages.num_pages >= h.pages->num_pages,
          invalid_argument, "pages", "needs the page summaries of the page store's pages");
  const int B = h.table.batch(), Hq = h.q.n1, Hkv = a.pages.num_kv_heads, d = a.pages.head_dim;
  require(static_cast<int>(a.moments->indptr().size()) == B + 1, shape_mismatch, "moments",
          "was built for another table");
  // The chosen groups' pages: those hier_select scores (key != 0).
  int mp = 0;
  for (int b = 0; b < B; ++b) mp = std::max(mp, h.table.num_pages(b));
  if (keys_stride == 0) keys_stride = mp;
  std::vector<std::uint32_t> keys;
  hier_select(h, out, &keys, keys_stride);
  const int g = Hq / Hkv;
  const double scale = h.scale == 0 ? 1.0 / std::sqrt(static_cast<double>(d)) : h.scale;
  // m, v of every page and every moment group, per q head (all_page_moments' layout).
  std::vector<double> pm(static_cast<std::size_t>(h.table.indptr[B]) * Hq), pv(pm.size());
  detail::all_page_moments(a.pages, h.table, h.q, scale, pm.data(), pv.data());
  const kv::SummariesView ms = a.moments->view();
  const kv::PageTable gt = a.moments->table();
  std::vector<double> gm(static_cast<std::size_t>(gt.indptr[B]) * Hq), gv(gm.size());
  detail::all_page_moments(ms, gt, h.q, scale, gm.data(), gv.data());
  if (masses) masses->assign(static_cast<std::size_t>(B) * Hkv * keys_stride, 0.0);
  std::vector<double> mass, terms, logz(static_cast<std::size_t>(g));
  std::vector<std::uint8_t> cand;
  for (int b = 0; b < B; ++b) {
    const int n = h.table.num_pages(b), ng = gt.num_pages(b);
    if (n == 0) continue;
    const detail::TopkSplit split = detail::topk_split(n, h.table.length(b, h.page_size),
                                                       h.page_size, h.policy);
    for (int kh = 0; kh < Hkv; ++kh) {
      // log Z per q head: log-sum-exp over the groups with tokens, in group order.
      for (int i = 0; i < g; ++i) {
        const std::size_t o = static_cast<std::size_t>(gt.indptr[b]) * Hq +
                              static_cast<std::size_t>(kh * g + i) * ng;
        terms.clear();
        for (int G = 0; G < ng; ++G)
          if (ms.count[gt.page(b, G)] > 0)
            terms.push_back(std::log(static_cast<double>(ms.count[gt.page(b, G)])) + gm[o + G] +
                            0.5 * gv[o + G]);
        double mx = -std::numeric_limits<double>::infinity(), sum = 0;
        for (double x : terms) mx = std::max(mx, x);
        for (double x : terms) sum += std::exp(x - mx);
        logz[static_cast<std::size_t>(i)] = mx + std::log(sum);
      }
      const std::uint32_t* k = keys.data() + (static_cast<std::size_t>(b) * Hkv + kh) * keys_stride;
      mass.assign(static_cast<std::size_t>(n), 0.0);
      cand.assign(static_cast<std::size_t>(n), 0);
      for (int j = 0; j < n; ++j) {
        const bool kept = j < std::min(split.sinks, split.window) || j >= split.window;
        const bool candidate = !kept && k[j] != 0u && split.need > 0;
        if (!kept && !candidate) continue;
        cand[static_cast<std::size_t>(j)] = candidate;
        const int cnt = a.pages.count[h.table.page(b, j)];
        if (cnt <= 0) continue;
        double agg = 0;
        for (int i = 0; i < g; ++i) {
          const std::size_t o = static_cast<std::size_t>(h.table.indptr[b]) * Hq +
                                static_cast<std::size_t>(kh * g + i) * n + j;
          agg += std::exp(std::log(static_cast<double>(cnt)) + pm[o] + 0.5 * pv[o] -
                          logz[static_cast<std::size_t>(i)]) /
                 g;
        }
        mass[static_cast<std::size_t>(j)] = agg;
      }
      if (masses)
        std::copy(mass.begin(), mass.end(),
                  masses->begin() + (static_cast<std::ptrdiff_t>(b) * Hkv + kh) * keys_stride);
      const std::span<std::int32_t> sl = out.slots(b, kh);
      out.count[b * Hkv + kh] =
          top_p_by_masses(mass.data(), cand.data(), n, h.table.length(b, h.page_size),
                          h.page_size, h.policy, a.p, sl.data(), static_cast<int>(sl.size()));
    }
  }
}

void quest_select8(const View3<const float>& q, const kv::PageTable& table, int page_size,
                   const BoundStore8View& store, float scale_arg, const TopkPolicy& policy,
                   SelectionStorage& out, std::vector<std::uint32_t>* page_keys, int keys_stride) {
  const int Hkv = store.num_kv_heads, d = store.head_dim, B = table.batch();
  check_q(q, table, d, Hkv);
  const int g = q.n1 / Hkv;
  const float scale = scale_arg == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : scale_arg;
  out.reset(SelectionView::Unit::page, B, Hkv, max_selected(table, page_size, policy));
  int mp = 0;
  for (int b = 0; b < B; ++b) mp = std::max(mp, table.num_pages(b));
  if (keys_stride == 0) keys_stride = mp;
  if (page_keys) page_keys->assign(static_cast<std::size_t>(B) * Hkv * keys_stride, 0u);
  GpuQuery gq;
  std::vector<float> pb;
  std::vector<std::uint32_t> keys;
  for (int b = 0; b < B; ++b) {
    const int n = table.num_pages(b);
    if (n == 0) continue;
    const std::span<const std::int32_t> phys = table.indices.subspan(
        static_cast<std::size_t>(table.indptr[b]), static_cast<std::size_t>(n));
    for (int h = 0; h < Hkv; ++h) {
      gq.assign(q.row(b, h * g), g, q.s1, d);
      pb.resize(static_cast<std::size_t>(g) * n);
      for (std::int32_t p : phys)
        require(p >= 0 && p < store.num_pages, ErrorCode::out_of_range, "table",
                "page id outside the store");
      bounds_gpu_order(store, phys, h, gq, g, scale, pb.data());
      keys.resize(static_cast<std::size_t>(n));
      for (int j = 0; j < n; ++j) keys[static_cast<std::size_t>(j)] = group_key(pb.data(), g, n, j);
      const std::span<std::int32_t> sl = out.slots(b, h);
      out.count[b * Hkv + h] = select_by_keys(keys.data(), n, table.length(b, page_size), page_size,
                                              policy, sl.data(), static_cast<int>(sl.size()));
      if (page_keys)
        std::copy(keys.begin(), keys.end(),
                  page_keys->begin() + (static_cast<std::ptrdiff_t>(b) * Hkv + h) * keys_stride);
    }
  }
}

std::size_t common_ids(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
  std::size_t both = 0;
  for (std::size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++both, ++i, ++j;
    }
  }
  return both;
}

SelectionAgreement compare_selections(const SelectionView& ref, const SelectionView& got) {
  require(ref.batch == got.batch && ref.num_kv_heads == got.num_kv_heads, ErrorCode::shape_mismatch,
          "got", "differs in shape from ref");
  SelectionAgreement r;
  long hit = 0, total = 0;
  for (int b = 0; b < ref.batch; ++b)
    for (int h = 0; h < ref.num_kv_heads; ++h) {
      const auto x = ref.list(b, h), y = got.list(b, h);
      ++r.lists;
      r.identical += std::equal(x.begin(), x.end(), y.begin(), y.end());
      total += static_cast<long>(x.size());
      hit += static_cast<long>(common_ids(x, y));
    }
  r.recall = total ? static_cast<double>(hit) / static_cast<double>(total) : 1.0;
  return r;
}

}  // namespace masskv::select
