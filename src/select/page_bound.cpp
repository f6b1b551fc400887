// Quest page bounds (docs/design.md §2.3), the outward-rounded bf16 bound store (§2.2) and the
// top-k page selection with sinks and a local window (§3).
#include "masskv/select/page_bound.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <utility>

#include "core/cpu_features.hpp"
#include "masskv/error.hpp"
#include "select/page_scan.hpp"
#include "select/quest_kernels.hpp"
#include "select/topk_rank.hpp"

namespace masskv::select {

namespace {

inline float load(float x) { return x; }
inline float load(std::uint16_t x) { return std::bit_cast<float>(std::uint32_t{x} << 16); }

// Lanes of independent partial sums: fixed, so the summation order (and the result bits)
// never depend on the machine, and wide enough for the compiler to keep them in vectors.
constexpr int kLanes = 8;

template <class T>
void sums_portable(const T* mn, const T* mx, std::int64_t page_stride, const std::int32_t* pages,
                   int n, int d, const float* qpos, const float* qneg, int nh, float* sums,
                   float* w) {
  for (int j = 0; j < n; ++j) {
    const T* lo = mn + pages[j] * page_stride;
    const T* hi = mx + pages[j] * page_stride;
    float wl[kLanes] = {};
    for (int c = 0; c < d; ++c) {
      const float a = std::fabs(load(lo[c])), b = std::fabs(load(hi[c]));
      const float x = a > b ? a : b;
      wl[c % kLanes] = x > wl[c % kLanes] ? x : wl[c % kLanes];
    }
    float wmax = 0;
    for (float x : wl) wmax = x > wmax ? x : wmax;
    w[j] = wmax;
    for (int h = 0; h < nh; ++h) {
      const float* qp = qpos + static_cast<std::int64_t>(h) * d;
      const float* qn = qneg + static_cast<std::int64_t>(h) * d;
      float s[kLanes] = {};
      int c = 0;
      for (; c + kLanes <= d; c += kLanes) {
        for (int l = 0; l < kLanes; ++l) {
          s[l] += qp[c + l] * load(hi[c + l]) + qn[c + l] * load(lo[c + l]);
        }
      }
      for (int l = 0; c < d; ++c, ++l) s[l] += qp[c] * load(hi[c]) + qn[c] * load(lo[c]);
      float S = 0;
      for (float x : s) S += x;
      sums[static_cast<std::int64_t>(h) * n + j] = S;
    }
  }
}

const std::uint16_t* bits(const bf16* p) { return reinterpret_cast<const std::uint16_t*>(p); }

void sums_dispatch(const float* mn, const float* mx, std::int64_t page_stride,
                   const std::int32_t* pages, int n, int d, const float* qpos, const float* qneg,
                   int nh, float* sums, float* w) {
  if (d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    detail::quest_sums_avx2_f32(mn, mx, page_stride, pages, n, d, qpos, qneg, nh, sums, w);
  } else {
    detail::quest_sums_portable_f32(mn, mx, page_stride, pages, n, d, qpos, qneg, nh, sums, w);
  }
}
void sums_dispatch(const bf16* mn, const bf16* mx, std::int64_t page_stride,
                   const std::int32_t* pages, int n, int d, const float* qpos, const float* qneg,
                   int nh, float* sums, float* w) {
  if (d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    detail::quest_sums_avx2_bf16(bits(mn), bits(mx), page_stride, pages, n, d, qpos, qneg, nh, sums,
                                 w);
  } else {
    detail::quest_sums_portable_bf16(bits(mn), bits(mx), page_stride, pages, n, d, qpos, qneg, nh,
                                     sums, w);
  }
}

// Pages the fused scan prefetches ahead (must match kAhead of quest_kernels_avx2.cpp).
constexpr int kPrefetchPages = 8;

// The query side of the bound, split once per query: q+ = max(q, 0), q- = min(q, 0) so that
// sum_c max(q_c m_c, q_c M_c) = q+·M + q-·m, and ||q||_1 for the rounding slack below.
struct SplitQuery {
  std::vector<float> norm;  // [num_q]

  const float* pos() const { return aligned(); }
  const float* neg() const { return aligned() + qd_; }

  void assign(const float* q, int num_q, std::int64_t q_stride, int d) {
    qd_ = static_cast<std::size_t>(num_q) * d;
    // 64-byte aligned rows: the kernels' 32-byte loads then never straddle cache lines.
    storage_.resize(2 * qd_ + 16);
    norm.resize(static_cast<std::size_t>(num_q));
    float* p = aligned();
    float* n = p + qd_;
    for (int h = 0; h < num_q; ++h) {
      float l1 = 0;
      for (int c = 0; c < d; ++c) {
        const float x = q[h * q_stride + c];
        p[static_cast<std::size_t>(h) * d + c] = x > 0 ? x : 0.0f;
        n[static_cast<std::size_t>(h) * d + c] = x < 0 ? x : 0.0f;
        l1 += std::fabs(x);
      }
      norm[static_cast<std::size_t>(h)] = l1;
    }
  }

 private:
  float* aligned() const {
    const auto addr = reinterpret_cast<std::uintptr_t>(storage_.data());
    return const_cast<float*>(storage_.data()) + ((64 - addr % 64) % 64) / sizeof(float);
  }
  std::vector<float> storage_;
  std::size_t qd_ = 0;
};

// Bounds of heads [h0, h0 + num_q) of `sq` for `n` pages of one kv head (docs/design.md §2.3);
// min/max of physical page p start at mn + p * page_stride; row i of out (stride ldo) gets
// head h0 + i. sums (num_q * n floats, may equal out when ldo == n) and w (n floats) are
// scratch. No checks: callers validated. Each page's value
// depends on that page alone, so any way of cutting the page list gives the same bits.
//
// Rigour: the sums are dot products of 2d terms, half of them exact zeros, whose exact
// value is sum_c t_c with |t_c| <= |q_c| * W, W = max_c max(|m_c|, |M_c|). Any summation
// order (with or without FMA) is within (2d)u/(1-2du) * ||q||_1 * W of it (u = 2^-24). We add
// twice that, 2(2d+4)u * ||q||_1 * W, which also covers the rounding of ||q||_1, of the slack
// and of the product with scale; FLT_MIN covers underflowed products. So
// out >= scale * q·k exactly for every key of the page.
// One bound from its sum and slack terms; the one expression both the per-head path and the
// fused scan of quest_select use, so their results have the same bits.
inline float finish_bound(float sum, float fq, float w, float scale) {
  return scale * (sum + fq * w + std::numeric_limits<float>::min());
}

template <class T>
void bounds_of_pages(const T* mn, const T* mx, std::int64_t page_stride, const std::int32_t* pages,
                     int n, int d, const SplitQuery& sq, int h0, int num_q, float scale, float* out,
                     std::int64_t ldo, float* sums, float* w) {
  const std::size_t q0 = static_cast<std::size_t>(h0) * d;
  sums_dispatch(mn, mx, page_stride, pages, n, d, sq.pos() + q0, sq.neg() + q0, num_q, sums, w);
  const float f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
  for (int h = 0; h < num_q; ++h) {
    const float fq = f * sq.norm[static_cast<std::size_t>(h0 + h)];
    const float* src = sums + static_cast<std::int64_t>(h) * n;
    float* row = out + static_cast<std::int64_t>(h) * ldo;
    for (int j = 0; j < n; ++j) {
      row[j] = finish_bound(src[j], fq, w[j], scale);
    }
  }
}

template <class T>
void bounds_rows(const T* mn, const T* mx, std::int64_t page_stride, const std::int32_t* pages,
                 int n, int d, const float* q, int num_q, std::int64_t q_stride, float scale,
                 float* out) {
  SplitQuery sq;
  sq.assign(q, num_q, q_stride, d);
  std::vector<float> w(static_cast<std::size_t>(n));
  bounds_of_pages(mn, mx, page_stride, pages, n, d, sq, 0, num_q, scale, out, n, out, w.data());
}

// The fused scan of quest_select (layout in quest_kernels.hpp) for `n` pages of the pool
// [page][nkv][d]: q heads h*g .. h*g+g-1 of `sq` go with kv head h. Pages up to prefetch_n
// are prefetched. The portable path runs the per-head kernel one page at a time.
template <class T>
void scan_portable(const T* mn, const T* mx, const std::int32_t* pages, int n, int nkv, int d,
                   const SplitQuery& sq, int g, float* sums, float* w, float* tmp) {
  const std::int64_t stride = static_cast<std::int64_t>(nkv) * d;
  for (int j = 0; j < n; ++j) {
    for (int h = 0; h < nkv; ++h) {
      const std::size_t q0 = static_cast<std::size_t>(h) * g * d;
      sums_portable(mn + static_cast<std::int64_t>(h) * d, mx + static_cast<std::int64_t>(h) * d,
                    stride, pages + j, 1, d, sq.pos() + q0, sq.neg() + q0, g, tmp,
                    w + static_cast<std::int64_t>(h) * n + j);
      for (int i = 0; i < g; ++i) sums[static_cast<std::int64_t>(h * g + i) * n + j] = tmp[i];
    }
  }
}

void scan_pages(const kv::SummariesView& s, const std::int32_t* pages, int n, int prefetch_n,
                const SplitQuery& sq, int g, float* sums, float* w, float* tmp) {
  const int d = s.head_dim;
  if (d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    detail::quest_scan_avx2_f32(s.min, s.max, pages, n, prefetch_n, s.num_kv_heads, d, sq.pos(),
                                sq.neg(), g, sums, w);
  } else {
    scan_portable(s.min, s.max, pages, n, s.num_kv_heads, d, sq, g, sums, w, tmp);
  }
}

void scan_pages(const BoundStoreView& s, const std::int32_t* pages, int n, int prefetch_n,
                const SplitQuery& sq, int g, float* sums, float* w, float* tmp) {
  const int d = s.head_dim;
  if (d % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    detail::quest_scan_avx2_bf16(bits(s.min), bits(s.max), pages, n, prefetch_n, s.num_kv_heads, d,
                                 sq.pos(), sq.neg(), g, s.wmax, sums, w);
  } else {
    scan_portable(bits(s.min), bits(s.max), pages, n, s.num_kv_heads, d, sq, g, sums, w, tmp);
  }
}

void check_bound_args(int num_pages_pool, int num_kv_heads, int head_dim,
                      std::span<const std::int32_t> pages, int kv_head, const float* q, int num_q,
                      std::int64_t q_stride, float scale, std::span<float> out) {
  using enum ErrorCode;
  require(kv_head >= 0 && kv_head < num_kv_heads, out_of_range, "kv_head", kv_head,
          " is outside [0, num_kv_heads = ", num_kv_heads, ")");
  require(num_q >= 1, invalid_argument, "num_q", "must be >= 1, got ", num_q);
  require(q != nullptr, invalid_argument, "q", "null query");
  require(num_q == 1 || q_stride >= head_dim, shape_mismatch, "q", "q_stride ", q_stride,
          " is smaller than head_dim ", head_dim);
  require(std::isfinite(scale) && scale > 0, invalid_argument, "scale",
          "must be finite and > 0, got ", scale);
  require(out.size() == static_cast<std::size_t>(num_q) * pages.size(), shape_mismatch, "out",
          "has ", out.size(), " values, expected num_q * pages = ", num_q * pages.size());
  for (int i = 0; i < num_q; ++i) {
    for (int c = 0; c < head_dim; ++c) {
      const float x = q[i * q_stride + c];
      require(std::isfinite(x), non_finite, "q", "q[", i, "][", c, "] = ", x, " is not finite");
    }
  }
  for (std::size_t j = 0; j < pages.size(); ++j) {
    require(pages[j] >= 0 && pages[j] < num_pages_pool, out_of_range, "pages", "pages[", j,
            "] = ", pages[j], " is outside [0, num_pages = ", num_pages_pool, ")");
  }
}

void check_policy(const TopkPolicy& p) {
  using enum ErrorCode;
  require(p.budget_pages >= 0, invalid_argument, "budget_pages", "must be >= 0, got ",
          p.budget_pages);
  require(p.sink_pages >= 0, invalid_argument, "sink_pages", "must be >= 0, got ", p.sink_pages);
  require(p.window_tokens >= 0, invalid_argument, "window_tokens", "must be >= 0, got ",
          p.window_tokens);
}

// Top-k of one (sequence, kv head), no checks; `keys` is scratch of n entries.
int topk_one(const float* bounds, int num_q, int n, std::int64_t length, int page_size,
             const TopkPolicy& policy, std::int32_t* out, int out_size,
             std::vector<std::uint64_t>& keys) {
  const detail::TopkSplit split = detail::topk_split(n, length, page_size, policy);
  keys.clear();
  if (split.need > 0) {
    for (int j = split.sinks; j < split.window; ++j) {
      float m = bounds[j];
      for (int i = 1; i < num_q; ++i) {
        const float x = bounds[static_cast<std::int64_t>(i) * n + j];
        m = x > m ? x : m;
      }
      keys.push_back(detail::topk_key(m, j));
    }
  }
  return detail::write_topk(split, n, keys, out, out_size);
}

void check_bounds_finite(std::span<const float> bounds) {
  for (std::size_t i = 0; i < bounds.size(); ++i) {
    require(!std::isnan(bounds[i]), ErrorCode::non_finite, "bounds", "bounds[", i, "] is NaN");
  }
}

}  // namespace

namespace detail {

void quest_sums_portable_f32(const float* mn, const float* mx, std::int64_t page_stride,
                             const std::int32_t* pages, int n, int d, const float* qpos,
                             const float* qneg, int nh, float* sums, float* w) {
  sums_portable(mn, mx, page_stride, pages, n, d, qpos, qneg, nh, sums, w);
}
void quest_sums_portable_bf16(const std::uint16_t* mn, const std::uint16_t* mx,
                              std::int64_t page_stride, const std::int32_t* pages, int n, int d,
                              const float* qpos, const float* qneg, int nh, float* sums, float* w) {
  sums_portable(mn, mx, page_stride, pages, n, d, qpos, qneg, nh, sums, w);
}

}  // namespace detail

// Rounds page p outward to bf16 and records its W per kv head (max is exact, so the kernels'
// own W of the same bf16 values has the same bits).
void BoundStore::round_page(const kv::SummariesView& s, std::int32_t page) {
  for (int h = 0; h < num_kv_heads_; ++h) {
    const std::size_t base =
        (static_cast<std::size_t>(page) * num_kv_heads_ + h) * static_cast<std::size_t>(head_dim_);
    float w = 0;
    for (std::size_t i = base; i < base + static_cast<std::size_t>(head_dim_); ++i) {
      min_[i] = f32_to_bf16_down(s.min[i]);
      max_[i] = f32_to_bf16_up(s.max[i]);
      const float a = std::fabs(bf16_to_f32(min_[i])), b = std::fabs(bf16_to_f32(max_[i]));
      const float x = a > b ? a : b;
      w = x > w ? x : w;
    }
    wmax_[static_cast<std::size_t>(page) * num_kv_heads_ + h] = w;
  }
}

BoundStore::BoundStore(const kv::SummariesView& s)
    : num_pages_(s.num_pages), num_kv_heads_(s.num_kv_heads), head_dim_(s.head_dim) {
  require(s.min != nullptr && s.max != nullptr, ErrorCode::invalid_argument, "s",
          "summaries without min/max");
  const std::size_t n = static_cast<std::size_t>(num_pages_) * num_kv_heads_ * head_dim_;
  min_.resize(n);
  max_.resize(n);
  wmax_.resize(static_cast<std::size_t>(num_pages_) * num_kv_heads_);
  for (std::int32_t p = 0; p < num_pages_; ++p) round_page(s, p);
}

void BoundStore::update(const kv::SummariesView& s, std::span<const std::int32_t> pages) {
  require(s.num_pages == num_pages_ && s.num_kv_heads == num_kv_heads_ && s.head_dim == head_dim_,
          ErrorCode::shape_mismatch, "s", "summaries shape [", s.num_pages, "][", s.num_kv_heads,
          "][", s.head_dim, "] differs from the store's [", num_pages_, "][", num_kv_heads_, "][",
          head_dim_, "]");
  for (std::size_t j = 0; j < pages.size(); ++j) {
    require(pages[j] >= 0 && pages[j] < num_pages_, ErrorCode::out_of_range, "pages", "pages[", j,
            "] = ", pages[j], " is outside [0, num_pages = ", num_pages_, ")");
  }
  for (std::int32_t p : pages) round_page(s, p);
}

BoundStoreView BoundStore::view() const {
  return {min_.data(), max_.data(), num_pages_, num_kv_heads_, head_dim_, wmax_.data()};
}

double BoundStore::bytes_per_token(int page_size) const {
  require(page_size > 0, ErrorCode::invalid_argument, "page_size", "must be > 0, got ", page_size);
  return (2.0 * 2.0 * num_kv_heads_ * head_dim_ + 4.0 * num_kv_heads_) / page_size;
}

void page_upper_bounds(const kv::SummariesView& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out) {
  check_bound_args(s.num_pages, s.num_kv_heads, s.head_dim, pages, kv_head, q, num_q, q_stride,
                   scale, out);
  const std::int64_t head_off = static_cast<std::int64_t>(kv_head) * s.head_dim;
  bounds_rows(s.min + head_off, s.max + head_off,
              static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim, pages.data(),
              static_cast<int>(pages.size()), s.head_dim, q, num_q, q_stride, scale, out.data());
}

void page_upper_bounds(const BoundStoreView& s, std::span<const std::int32_t> pages, int kv_head,
                       const float* q, int num_q, std::int64_t q_stride, float scale,
                       std::span<float> out) {
  check_bound_args(s.num_pages, s.num_kv_heads, s.head_dim, pages, kv_head, q, num_q, q_stride,
                   scale, out);
  const std::int64_t head_off = static_cast<std::int64_t>(kv_head) * s.head_dim;
  bounds_rows(s.min + head_off, s.max + head_off,
              static_cast<std::int64_t>(s.num_kv_heads) * s.head_dim, pages.data(),
              static_cast<int>(pages.size()), s.head_dim, q, num_q, q_stride, scale, out.data());
}

int topk_selected_pages(int num_pages, std::int64_t length, int page_size,
                        const TopkPolicy& policy) {
  check_policy(policy);
  if (num_pages <= 0) return 0;
  return detail::topk_split(num_pages, length, page_size, policy).total;
}

int select_topk_pages(std::span<const float> bounds, int num_q, int num_pages, int last_page_len,
                      int page_size, const TopkPolicy& policy, std::span<std::int32_t> out) {
  using enum ErrorCode;
  check_policy(policy);
  require(num_q >= 1, invalid_argument, "num_q", "must be >= 1, got ", num_q);
  require(num_pages >= 1, invalid_argument, "num_pages", "must be >= 1, got ", num_pages);
  require(page_size >= 1, invalid_argument, "page_size", "must be >= 1, got ", page_size);
  require(last_page_len >= 1 && last_page_len <= page_size, invalid_argument, "last_page_len",
          last_page_len, " is outside [1, page_size = ", page_size, "]");
  require(bounds.size() == static_cast<std::size_t>(num_q) * num_pages, shape_mismatch, "bounds",
          "has ", bounds.size(), " values, expected num_q * num_pages = ", num_q * num_pages);
  check_bounds_finite(bounds);
  const std::int64_t length = static_cast<std::int64_t>(num_pages - 1) * page_size + last_page_len;
  const int total = topk_selected_pages(num_pages, length, page_size, policy);
  require(out.size() >= static_cast<std::size_t>(total), shape_mismatch, "out", "has ", out.size(),
          " slots, the selection holds ", total);
  std::vector<std::uint64_t> keys;
  keys.reserve(static_cast<std::size_t>(num_pages));
  return topk_one(bounds.data(), num_q, num_pages, length, page_size, policy, out.data(),
                  static_cast<int>(out.size()), keys);
}

namespace {

void check_batch_heads(int num_kv_heads, int num_q_heads) {
  using enum ErrorCode;
  require(num_kv_heads >= 1, invalid_argument, "num_kv_heads", "must be >= 1, got ", num_kv_heads);
  require(num_q_heads >= num_kv_heads && num_q_heads % num_kv_heads == 0, shape_mismatch,
          "num_q_heads", num_q_heads, " is not a multiple of num_kv_heads = ", num_kv_heads);
}

// Page table checks shared by the batch entry points (the geometry is the caller's).
void check_table(const kv::PageTable& t, int page_size, int num_pages_pool) {
  kv::PagedKVView v;
  v.k = v.v = &v;  // only the table is checked here
  v.num_pages = num_pages_pool;
  v.num_kv_heads = 1;
  v.head_dim = 1;
  v.page_size = page_size;
  v.set_layout(kv::Layout::HND);
  v.table = t;
  v.validate();
}

int max_selected(const kv::PageTable& t, int page_size, const TopkPolicy& policy) {
  int m = 0;
  for (int b = 0; b < t.batch(); ++b) {
    m = std::max(m, topk_selected_pages(t.num_pages(b), t.length(b, page_size), page_size, policy));
  }
  return m;
}

}  // namespace

void select_topk_pages(std::span<const float> bounds, const kv::PageTable& table, int page_size,
                       int num_kv_heads, int num_q_heads, const TopkPolicy& policy,
                       SelectionStorage& out) {
  check_policy(policy);
  check_batch_heads(num_kv_heads, num_q_heads);
  check_table(table, page_size, std::numeric_limits<std::int32_t>::max());
  const int B = table.batch();
  const std::size_t nnz = table.indices.size();
  require(bounds.size() == nnz * num_q_heads, ErrorCode::shape_mismatch, "bounds", "has ",
          bounds.size(), " values, expected pages * num_q_heads = ", nnz * num_q_heads);
  check_bounds_finite(bounds);
  out.reset(SelectionView::Unit::page, B, num_kv_heads, max_selected(table, page_size, policy));
  const int g = num_q_heads / num_kv_heads;
  std::vector<std::uint64_t> keys;
  for (int b = 0; b < B; ++b) {
    const int n = table.num_pages(b);
    for (int h = 0; h < num_kv_heads; ++h) {
      const float* rows = bounds.data() + static_cast<std::size_t>(table.indptr[b]) * num_q_heads +
                          static_cast<std::size_t>(h) * g * n;
      const std::span<std::int32_t> slots = out.slots(b, h);
      out.count[b * num_kv_heads + h] =
          topk_one(rows, g, n, table.length(b, page_size), page_size, policy, slots.data(),
                   static_cast<int>(slots.size()), keys);
    }
  }
}

namespace detail {

void all_page_bounds(const kv::SummariesView* summaries, const BoundStoreView* bounds_bf16,
                     const kv::PageTable& table, const View3<const float>& q, float scale,
                     float* bounds, float* w_out) {
  const int B = table.batch(), Hq = q.n1;
  const int Hkv = summaries ? summaries->num_kv_heads : bounds_bf16->num_kv_heads;
  const int d = summaries ? summaries->head_dim : bounds_bf16->head_dim;
  const int g = Hq / Hkv;
  // Pages are scanned in chunks; inside a chunk, page by page and every kv head of a page in
  // turn: with the [page][head][d] summary layout that reads each array sequentially (a
  // per-head scan strides H*d apart and ran at a third of the bandwidth).
  constexpr int kChunk = 32;
  thread_local std::vector<std::pair<int, int>> chunks;  // (sequence, first logical page)
  chunks.clear();
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < table.num_pages(b); j += kChunk) chunks.emplace_back(b, j);
  }
  const std::vector<std::pair<int, int>>& work = chunks;
  const int num_chunks = static_cast<int>(work.size());
  const float f = 2.0f * static_cast<float>(2 * d + 4) * 0x1p-24f;
#pragma omp parallel if (num_chunks > 1)
  {
    thread_local SplitQuery sq;
    thread_local std::vector<float> sums, w, tmp;
    sums.resize(static_cast<std::size_t>(Hq) * kChunk);
    w.resize(static_cast<std::size_t>(Hkv) * kChunk);
    tmp.resize(static_cast<std::size_t>(g));
    int split_b = -1;
#pragma omp for schedule(static)
    for (int t = 0; t < num_chunks; ++t) {
      const auto [b, j0] = work[static_cast<std::size_t>(t)];
      if (b != split_b) {  // q rows of a sequence are [Hq][d] with stride q.s1
        sq.assign(q.row(b, 0), Hq, q.s1, d);
        split_b = b;
      }
      const int nb = table.num_pages(b);
      const int n = std::min(kChunk, nb - j0);
      // Prefetch runs a few pages ahead, into the sequence's next chunk too.
      const int prefetch_n = std::min(n + kPrefetchPages, nb - j0);
      const std::int32_t* pages = table.indices.data() + table.indptr[b] + j0;
      if (summaries) {
        scan_pages(*summaries, pages, n, prefetch_n, sq, g, sums.data(), w.data(), tmp.data());
      } else {
        scan_pages(*bounds_bf16, pages, n, prefetch_n, sq, g, sums.data(), w.data(), tmp.data());
      }
      float* seq_bounds = bounds + static_cast<std::size_t>(table.indptr[b]) * Hq;
      for (int hq = 0; hq < Hq; ++hq) {
        const float fq = f * sq.norm[static_cast<std::size_t>(hq)];
        const float* src = sums.data() + static_cast<std::size_t>(hq) * n;
        const float* wh = w.data() + static_cast<std::size_t>(hq / g) * n;
        float* row = seq_bounds + static_cast<std::size_t>(hq) * nb + j0;
        for (int j = 0; j < n; ++j) row[j] = finish_bound(src[j], fq, wh[j], scale);
      }
      if (w_out) {
        for (int h = 0; h < Hkv; ++h) {
          for (int j = 0; j < n; ++j) {
            w_out[(static_cast<std::size_t>(table.indptr[b]) + j0 + j) * Hkv + h] =
                w[static_cast<std::size_t>(h) * n + j];
          }
        }
      }
    }
  }
}

}  // namespace detail

void quest_select(const QuestArgs& args, SelectionStorage& out) {
  using enum ErrorCode;
  require((args.summaries != nullptr) != (args.bounds_bf16 != nullptr), invalid_argument,
          "summaries", "give exactly one of summaries and bounds_bf16");
  const int pool_pages = args.summaries ? args.summaries->num_pages : args.bounds_bf16->num_pages;
  const int Hkv = args.summaries ? args.summaries->num_kv_heads : args.bounds_bf16->num_kv_heads;
  const int d = args.summaries ? args.summaries->head_dim : args.bounds_bf16->head_dim;
  require(args.summaries == nullptr || (args.summaries->min && args.summaries->max),
          invalid_argument, "summaries", "null min/max");
  require(args.bounds_bf16 == nullptr || (args.bounds_bf16->min && args.bounds_bf16->max),
          invalid_argument, "bounds_bf16", "null min/max");
  check_policy(args.policy);
  check_table(args.table, args.page_size, pool_pages);
  const View3<const float>& q = args.q;
  const int B = args.table.batch();
  require(q.data != nullptr, invalid_argument, "q", "null query");
  require(q.n0 == B, shape_mismatch, "q", "has ", q.n0, " sequences, the page table ", B);
  require(q.n2 == d, shape_mismatch, "q", "head_dim ", q.n2, " differs from the summaries' ", d);
  check_batch_heads(Hkv, q.n1);
  const float scale = args.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(d)) : args.scale;
  require(std::isfinite(scale) && scale > 0, invalid_argument, "scale",
          "must be finite and > 0, got ", args.scale);
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < q.n1; ++h) {
      const float* row = q.row(b, h);
      for (int c = 0; c < d; ++c) {
        require(std::isfinite(row[c]), non_finite, "q", "q[", b, "][", h, "][", c, "] = ", row[c],
                " is not finite");
      }
    }
  }

  out.reset(SelectionView::Unit::page, B, Hkv,
            max_selected(args.table, args.page_size, args.policy));
  const int g = q.n1 / Hkv, Hq = q.n1;
  // Bounds in the batch CSR order of select_topk_pages: [b][q head][logical page].
  std::vector<float> bounds(args.table.indices.size() * Hq);
  detail::all_page_bounds(args.summaries, args.bounds_bf16, args.table, q, scale, bounds.data(),
                          nullptr);
  const int tasks = B * Hkv;
  // Everything that can throw ran above: the parallel region only computes. Each output
  // value is computed by one task alone, so results do not depend on the thread count.
#pragma omp parallel if (tasks > 1)
  {
    std::vector<std::uint64_t> keys;
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int b = task / Hkv, h = task % Hkv;
      const int n = args.table.num_pages(b);
      const float* rows_bh = bounds.data() + static_cast<std::size_t>(args.table.indptr[b]) * Hq +
                             static_cast<std::size_t>(h) * g * n;
      const std::span<std::int32_t> slots = out.slots(b, h);
      out.count[task] =
          topk_one(rows_bh, g, n, args.table.length(b, args.page_size), args.page_size, args.policy,
                   slots.data(), static_cast<int>(slots.size()), keys);
    }
  }
}

}  // namespace masskv::select
