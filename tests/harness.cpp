#include "harness.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>

namespace masskv::test {

std::span<const ImplEntry> decode_impls() {
  static const ImplEntry impls[] = {
      {"scalar", attn::Impl::scalar}, {"simd", attn::Impl::simd}, {"fast", attn::Impl::fast}};
  return impls;
}

std::span<const ImplEntry> prefill_impls() {
  static const ImplEntry impls[] = {
      {"scalar", attn::Impl::scalar}, {"simd", attn::Impl::simd}, {"fast", attn::Impl::fast}};
  return impls;
}

Tolerance tolerance(DType) { return Tolerance{}; }

// ---- hand-built cache ---------------------------------------------------------------------

HandCache::HandCache(const KVConfig& config) : cfg_(config) {
  const int P = cfg_.page_size;
  indptr_.push_back(0);
  int total = 0;
  for (int len : cfg_.lengths) {
    const int pages = (len + P - 1) / P;
    total += pages;
    indptr_.push_back(total);
    last_.push_back(len - (pages - 1) * P);
  }
  pool_pages_ = total + 3;  // unused pages: kernels must not depend on pool order
  std::mt19937 rng(cfg_.seed);
  std::vector<std::int32_t> perm(pool_pages_);
  std::iota(perm.begin(), perm.end(), 0);
  if (cfg_.shuffle_pages) std::shuffle(perm.begin(), perm.end(), rng);
  indices_.assign(perm.begin(), perm.begin() + total);

  const std::size_t elems =
      static_cast<std::size_t>(pool_pages_) * cfg_.num_kv_heads * P * cfg_.head_dim;
  const std::size_t es = dtype_size(cfg_.dtype);
  k_.resize(elems * es);
  v_.resize(elems * es);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto fill = [&](std::vector<std::uint8_t>& buf, float offset) {
    for (std::size_t i = 0; i < elems; ++i) {
      const float x = normal(rng) + offset;
      visit_dtype(cfg_.dtype, [&](auto t) {
        using T = decltype(t);
        const T y = from_f32<T>(x);
        std::memcpy(buf.data() + i * es, &y, es);
      });
    }
  };
  fill(k_, 0.0f);
  fill(v_, cfg_.value_offset);
}

kv::PagedKVView HandCache::view() const {
  kv::PagedKVView v;
  v.k = k_.data();
  v.v = v_.data();
  v.dtype = cfg_.dtype;
  v.num_pages = pool_pages_;
  v.num_kv_heads = cfg_.num_kv_heads;
  v.page_size = cfg_.page_size;
  v.head_dim = cfg_.head_dim;
  const std::int64_t d = cfg_.head_dim, P = cfg_.page_size, H = cfg_.num_kv_heads;
  // Strides written by hand (not set_layout) so these tests do not depend on kv/.
  if (cfg_.layout == kv::Layout::HND) {
    v.stride_page = H * P * d;
    v.stride_head = P * d;
    v.stride_slot = d;
  } else {
    v.stride_page = P * H * d;
    v.stride_slot = H * d;
    v.stride_head = d;
  }
  v.table = {indptr_, indices_, last_};
  return v;
}

namespace {

OwnedSelection finish(std::vector<std::vector<std::int32_t>> lists, int batch, int heads,
                      SelectionView::Unit unit) {
  OwnedSelection s;
  std::size_t max_per = 0;
  for (auto& l : lists) max_per = std::max(max_per, l.size());
  max_per += 1;  // padding present even in the longest list
  s.ids.assign(lists.size() * max_per, -1);
  for (std::size_t i = 0; i < lists.size(); ++i) {
    std::copy(lists[i].begin(), lists[i].end(), s.ids.begin() + i * max_per);
    s.count.push_back(static_cast<std::int32_t>(lists[i].size()));
  }
  s.view.unit = unit;
  s.view.batch = batch;
  s.view.num_kv_heads = heads;
  s.view.max_per_head = static_cast<int>(max_per);
  s.view.ids = s.ids;
  s.view.count = s.count;
  return s;
}

}  // namespace

OwnedSelection random_selection(const HandCache& cache, SelectionView::Unit unit, double keep,
                                std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::bernoulli_distribution coin(keep);
  const auto& cfg = cache.config();
  const int batch = static_cast<int>(cfg.lengths.size());
  std::vector<std::vector<std::int32_t>> lists;
  for (int b = 0; b < batch; ++b) {
    for (int h = 0; h < cfg.num_kv_heads; ++h) {
      std::vector<std::int32_t> l;
      const int n = unit == SelectionView::Unit::page ? cache.num_pages(b) : cfg.lengths[b];
      for (int i = 0; i < n; ++i) {
        const bool last = unit == SelectionView::Unit::page && i + 1 == n;
        if (last || coin(rng)) l.push_back(i);
      }
      lists.push_back(std::move(l));
    }
  }
  return finish(std::move(lists), batch, cfg.num_kv_heads, unit);
}

OwnedSelection make_selection(const HandCache& cache, SelectionView::Unit unit,
                              const std::vector<std::vector<std::int32_t>>& per_seq) {
  const auto& cfg = cache.config();
  std::vector<std::vector<std::int32_t>> lists;
  for (const auto& l : per_seq) {
    for (int h = 0; h < cfg.num_kv_heads; ++h) lists.push_back(l);
  }
  return finish(std::move(lists), static_cast<int>(per_seq.size()), cfg.num_kv_heads, unit);
}

std::vector<double> token_scores(const HandCache& cache, int b, int h, const float* q,
                                 double scale) {
  const kv::PagedKVView view = cache.view();
  const int P = view.page_size, d = view.head_dim;
  std::vector<double> s(cache.config().lengths[b]);
  for (std::size_t t = 0; t < s.size(); ++t) {
    const std::int32_t page = view.table.page(b, static_cast<int>(t / P));
    double acc = 0;
    visit_dtype(view.dtype, [&](auto tag) {
      using T = decltype(tag);
      const T* k = view.key<T>(page, h, static_cast<int>(t % P));
      for (int c = 0; c < d; ++c) acc += static_cast<double>(q[c]) * to_f32(k[c]);
    });
    s[t] = scale * acc;
  }
  return s;
}

std::vector<float> random_q(std::int64_t rows, int heads, int d, float sd, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sd);
  std::vector<float> q(static_cast<std::size_t>(rows) * heads * d);
  for (float& x : q) x = normal(rng);
  return q;
}

// ---- comparison -----------------------------------------------------------------------------

Errors compare(std::span<const float> out, std::span<const double> ref_out,
               std::span<const float> stat, std::span<const double> ref_stat, int d) {
  Errors e;
  const std::size_t rows = ref_out.size() / d;
  for (std::size_t r = 0; r < rows; ++r) {
    double diff = 0, norm = 0;
    for (int c = 0; c < d; ++c) {
      diff = std::max(diff, std::abs(out[r * d + c] - ref_out[r * d + c]));
      norm = std::max(norm, std::abs(ref_out[r * d + c]));
      if (!std::isfinite(out[r * d + c])) diff = INFINITY;
    }
    e.out = std::max(e.out, norm > 0 ? diff / norm : diff);
  }
  for (std::size_t i = 0; i < ref_stat.size(); ++i) {
    const double a = stat[i], b = ref_stat[i];
    if (!std::isfinite(b)) {
      const bool same = (std::isnan(a) && std::isnan(b)) || a == b;
      if (!same) e.stat = INFINITY;
      continue;
    }
    e.stat = std::max(e.stat, std::abs(a - b) / std::max(1.0, std::abs(b)));
  }
  return e;
}

namespace {

std::string mapping_name(const Mapping& m) {
  std::ostringstream os;
  if (m.is_entmax()) {
    os << "entmax" << m.alpha;
  } else {
    os << "softmax";
  }
  return os.str();
}

std::string kv_name(const KVConfig& kv) {
  std::ostringstream os;
  os << "lengths=";
  for (int l : kv.lengths) os << l << ',';
  os << " Hkv=" << kv.num_kv_heads << " d=" << kv.head_dim << " P=" << kv.page_size << ' '
     << to_string(kv.dtype) << (kv.layout == kv::Layout::HND ? " HND" : " NHD");
  return os.str();
}

}  // namespace

std::string DecodeCase::describe() const {
  std::ostringstream os;
  os << kv_name(kv) << " Hq=" << num_q_heads << ' ' << mapping_name(mapping) << " sel="
     << (selection == 0   ? "dense"
         : selection == 1 ? "page"
                          : "token")
     << " chunk=" << chunk_pages << " q_sd=" << q_sd;
  return os.str();
}

std::string PrefillCase::describe() const {
  std::ostringstream os;
  os << kv_name(kv) << " nq=";
  for (int n : num_queries) os << n << ',';
  os << " Hq=" << num_q_heads << ' ' << mapping_name(mapping)
     << (block_sparse ? " block-sparse" : " dense") << " qb=" << q_block << " kb=" << k_block;
  return os.str();
}

namespace {

// The one comparison loop: runs every registered implementation (outputs poisoned first, so a
// path that writes nothing fails) and EXPECTs each within tolerance(dtype) of the reference.
template <class RunImpl>
Errors check_impls(std::span<const ImplEntry> impls, DType dtype, const std::string& what,
                   std::vector<float>& out, std::vector<float>& stat,
                   const std::vector<double>& ref_out, const std::vector<double>& ref_stat, int d,
                   RunImpl&& run) {
  const Tolerance tol = tolerance(dtype);
  Errors worst;
  for (const ImplEntry& impl : impls) {
    std::fill(out.begin(), out.end(), -7.0f);
    std::fill(stat.begin(), stat.end(), -7.0f);
    run(impl.impl);
    const Errors e = compare(out, ref_out, stat, ref_stat, d);
    EXPECT_LE(e.out, tol.out) << impl.name << ": " << what;
    EXPECT_LE(e.stat, tol.stat) << impl.name << ": " << what;
    worst.out = std::max(worst.out, e.out);
    worst.stat = std::max(worst.stat, e.stat);
  }
  return worst;
}

}  // namespace

Errors check_decode(const DecodeCase& c) {
  const HandCache cache(c.kv);
  const int B = static_cast<int>(c.kv.lengths.size()), Hq = c.num_q_heads, d = c.kv.head_dim;
  const std::vector<float> q = random_q(B, Hq, d, c.q_sd, c.kv.seed + 17);
  OwnedSelection sel;
  if (c.selection != 0) {
    sel = random_selection(
        cache, c.selection == 1 ? SelectionView::Unit::page : SelectionView::Unit::token, c.keep,
        c.kv.seed + 5);
  }
  std::vector<float> out(static_cast<std::size_t>(B) * Hq * d, -7.0f), stat(B * Hq, -7.0f);
  attn::DecodeArgs args;
  args.q = View3<const float>::contiguous(q.data(), B, Hq, d);
  args.cache = cache.view();
  args.mapping = c.mapping;
  args.selection = c.selection != 0 ? &sel.view : nullptr;
  args.out = View3<float>::contiguous(out.data(), B, Hq, d);
  args.lse_or_tau = stat;
  args.chunk_pages = c.chunk_pages;
  std::vector<double> ref_out(out.size()), ref_stat(stat.size());
  attn::decode_reference(args, ref_out, ref_stat);
  return check_impls(decode_impls(), c.kv.dtype, c.describe(), out, stat, ref_out, ref_stat, d,
                     [&](attn::Impl impl) {
                       args.impl = impl;
                       attn::decode(args);
                     });
}

}  // namespace masskv::test

namespace masskv::test {

Errors check_prefill(const PrefillCase& c) {
  const HandCache cache(c.kv);
  const int B = static_cast<int>(c.kv.lengths.size()), Hq = c.num_q_heads, d = c.kv.head_dim;
  std::vector<std::int32_t> q_indptr{0};
  for (int b = 0; b < B; ++b) q_indptr.push_back(q_indptr.back() + c.num_queries[b]);
  const int total = q_indptr.back();
  const std::vector<float> q = random_q(total, Hq, d, c.q_sd, c.kv.seed + 23);
  std::vector<std::uint8_t> mask_bits;
  std::vector<std::int64_t> mask_offset;
  attn::BlockMask mask;
  if (c.block_sparse) {
    std::mt19937 rng(c.kv.seed + 29);
    std::bernoulli_distribution coin(c.keep);
    for (int b = 0; b < B; ++b) {
      mask_offset.push_back(static_cast<std::int64_t>(mask_bits.size()));
      const int rows = (c.num_queries[b] + c.q_block - 1) / c.q_block;
      const int cols = (c.kv.lengths[b] + c.k_block - 1) / c.k_block;
      for (int i = 0; i < rows * cols; ++i) mask_bits.push_back(coin(rng) ? 1 : 0);
    }
    mask.q_block = c.q_block;
    mask.k_block = c.k_block;
    mask.mask = mask_bits;
    mask.mask_offset = mask_offset;
  }
  std::vector<float> out(static_cast<std::size_t>(total) * Hq * d, -7.0f),
      stat(static_cast<std::size_t>(total) * Hq, -7.0f);
  attn::PrefillArgs args;
  args.q = View3<const float>::contiguous(q.data(), total, Hq, d);
  args.q_indptr = q_indptr;
  args.cache = cache.view();
  args.mapping = c.mapping;
  args.block_mask = c.block_sparse ? &mask : nullptr;
  args.out = View3<float>::contiguous(out.data(), total, Hq, d);
  args.lse_or_tau = stat;
  std::vector<double> ref_out(out.size()), ref_stat(stat.size());
  attn::prefill_reference(args, ref_out, ref_stat);
  return check_impls(prefill_impls(), c.kv.dtype, c.describe(), out, stat, ref_out, ref_stat, d,
                     [&](attn::Impl impl) {
                       args.impl = impl;
                       attn::prefill(args);
                     });
}

}  // namespace masskv::test
