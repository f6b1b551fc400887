// prefill check (masskv_gpu_tests): cuda::prefill (dense and block-sparse causal prefill) and
// cuda::prefill_index (the mean-pooled block indexer) against the CPU f64 reference.
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "masskv/attn/prefill.hpp"
#include "masskv/cuda/prefill.hpp"
#include "masskv/error.hpp"
#include "checks.hpp"

using namespace masskv;

namespace {

// ---- check ---------------------------------------------------------------------------------
enum class Mode { dense, lists, indexer };

struct PCase {
  int len, nq, group, d, hkv, batch, page;
  DType dtype;
  kv::Layout layout;
  Mode mode;
  int q_block = 64, k_block = 64;
  int sel_heads = 1;      // lists: 1 (shared) or hkv; the indexer writes hkv
  int budget_blocks = 4;  // indexer
  bool out_f32 = true;
  Mapping mapping = Mapping::softmax();  // entmax: lse holds τ
  float q_amp = 3.f;  // q ~ U(-q_amp, q_amp); small: every z near 0, wide entmax supports
};

// Host inputs of a case, its selection (cuda::PrefillBlockSelection layout) and the reference.
struct PData {
  PCase c;
  int pool_pages = 0, total_q = 0, max_len = 0, max_q = 0;
  std::vector<std::uint16_t> k, v, q;
  std::vector<float> qf;  // q's values in f32 (exact) for the reference
  std::vector<std::int32_t> indptr, indices, last, q_indptr;
  std::vector<std::int32_t> qb_indptr, ids, count;
  int max_per_row = 0;
  std::vector<double> ref_o, ref_lse;
};

std::uint16_t to_half_bits(DType dt, float x) {
  return dt == DType::bf16 ? f32_to_bf16(x).bits : f32_to_f16(x).bits;
}
float from_half_bits(DType dt, std::uint16_t b) {
  return dt == DType::bf16 ? bf16_to_f32(bf16{b}) : f16_to_f32(f16{b});
}

kv::PagedKVView host_view(const PData& pd, const void* k, const void* v) {
  kv::PagedKVView view;
  view.k = k;
  view.v = v;
  view.dtype = pd.c.dtype;
  view.num_pages = pd.pool_pages;
  view.num_kv_heads = pd.c.hkv;
  view.page_size = pd.c.page;
  view.head_dim = pd.c.d;
  view.set_layout(pd.c.layout);
  return view;
}

int key_blocks(const PData& pd, int b) {
  const int len = (pd.indptr[b + 1] - pd.indptr[b] - 1) * pd.c.page + pd.last[b];
  return (len + pd.c.k_block - 1) / pd.c.k_block;
}

void build_inputs(PData& pd, std::uint64_t seed) {
  const PCase& c = pd.c;
  Rng rng(seed);
  pd.indptr.assign(1, 0);
  pd.q_indptr.assign(1, 0);
  pd.qb_indptr.assign(1, 0);
  int pages = 0;
  for (int b = 0; b < c.batch; ++b) {
    const int len = b == 0 ? c.len : 1 + rng.below(c.len);
    const int nq = b == 0 ? c.nq : 1 + rng.below(std::min(len, c.nq));
    const int np = (len + c.page - 1) / c.page;
    pages += np;
    pd.indptr.push_back(pages);
    pd.last.push_back(len - (np - 1) * c.page);
    pd.q_indptr.push_back(pd.q_indptr.back() + nq);
    pd.qb_indptr.push_back(pd.qb_indptr.back() + (nq + c.q_block - 1) / c.q_block);
    pd.max_len = std::max(pd.max_len, len);
    pd.max_q = std::max(pd.max_q, nq);
  }
  pd.total_q = pd.q_indptr.back();
  pd.pool_pages = pages + pages / 4 + 3;  // spare pages: ids are a random injection
  std::vector<std::int32_t> perm(pd.pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = pd.pool_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  pd.indices.assign(perm.begin(), perm.begin() + pages);
  const std::size_t elems = static_cast<std::size_t>(pd.pool_pages) * c.hkv * c.page * c.d;
  pd.k.resize(elems);
  pd.v.resize(elems);
  for (std::size_t i = 0; i < elems; ++i) {
    pd.k[i] = to_half_bits(c.dtype, rng.sym(2.f));
    pd.v[i] = to_half_bits(c.dtype, rng.sym(1.f));
  }
  const int hq = c.hkv * c.group;
  pd.q.resize(static_cast<std::size_t>(pd.total_q) * hq * c.d);
  pd.qf.resize(pd.q.size());
  for (std::size_t i = 0; i < pd.q.size(); ++i) {
    pd.q[i] = to_half_bits(c.dtype, rng.sym(c.q_amp));
    pd.qf[i] = from_half_bits(c.dtype, pd.q[i]);
  }
  if (c.mode != Mode::lists) return;
  // Random lists over every key block of the sequence (blocks after a query included: the
  // kernel must mask them); each block with probability 0.4; a tenth of the lists empty.
  const int rows = pd.qb_indptr.back();
  int max_kb = 0;
  for (int b = 0; b < c.batch; ++b) max_kb = std::max(max_kb, key_blocks(pd, b));
  pd.max_per_row = max_kb + 1;
  pd.ids.assign(static_cast<std::size_t>(rows) * c.sel_heads * pd.max_per_row, -1);
  pd.count.assign(static_cast<std::size_t>(rows) * c.sel_heads, 0);
  for (int b = 0; b < c.batch; ++b)
    for (int r = pd.qb_indptr[b]; r < pd.qb_indptr[b + 1]; ++r)
      for (int h = 0; h < c.sel_heads; ++h) {
        const std::size_t slot = static_cast<std::size_t>(r) * c.sel_heads + h;
        if (rng.uniform() < 0.1) continue;
        int n = 0;
        for (int j = 0; j < key_blocks(pd, b); ++j)
          if (rng.uniform() < 0.4) pd.ids[slot * pd.max_per_row + n++] = j;
        pd.count[slot] = n;
      }
}

// The f64 reference: attn::prefill_reference per kv head (its block mask has no head axis),
// on a view of that head's K/V and its group's q heads, with the head's lists as the mask.
void build_reference(PData& pd) {
  const PCase& c = pd.c;
  const int hq = c.hkv * c.group;
  pd.ref_o.assign(static_cast<std::size_t>(pd.total_q) * hq * c.d, 0.0);
  pd.ref_lse.assign(static_cast<std::size_t>(pd.total_q) * hq, 0.0);
  std::vector<double> o(static_cast<std::size_t>(pd.total_q) * c.group * c.d);
  std::vector<double> lse(static_cast<std::size_t>(pd.total_q) * c.group);
  std::vector<float> dummy(o.size());
  for (int h = 0; h < c.hkv; ++h) {
    kv::PagedKVView view = host_view(pd, pd.k.data(), pd.v.data());
    view.num_kv_heads = 1;
    view.k = pd.k.data() + h * view.stride_head;
    view.v = pd.v.data() + h * view.stride_head;
    view.table = {pd.indptr, pd.indices, pd.last};
    attn::PrefillArgs a;
    a.q = View3<const float>{pd.qf.data() + static_cast<std::size_t>(h) * c.group * c.d,
                             pd.total_q,
                             c.group,
                             c.d,
                             static_cast<std::int64_t>(hq) * c.d,
                             c.d};
    a.q_indptr = pd.q_indptr;
    a.cache = view;
    a.mapping = c.mapping;
    a.out = View3<float>::contiguous(dummy.data(), pd.total_q, c.group, c.d);
    std::vector<std::uint8_t> mask;
    std::vector<std::int64_t> offset;
    attn::BlockMask bm;
    if (c.mode != Mode::dense) {
      const int heads = static_cast<int>(pd.count.size()) / pd.qb_indptr.back();
      for (int b = 0; b < c.batch; ++b) {
        offset.push_back(static_cast<std::int64_t>(mask.size()));
        const int cols = key_blocks(pd, b);
        for (int r = pd.qb_indptr[b]; r < pd.qb_indptr[b + 1]; ++r) {
          const std::size_t slot = static_cast<std::size_t>(r) * heads + (heads == 1 ? 0 : h);
          std::vector<std::uint8_t> row(cols, 0);
          for (int i = 0; i < pd.count[slot]; ++i) row[pd.ids[slot * pd.max_per_row + i]] = 1;
          mask.insert(mask.end(), row.begin(), row.end());
        }
      }
      bm.q_block = c.q_block;
      bm.k_block = c.k_block;
      bm.mask = mask;
      bm.mask_offset = offset;
      a.block_mask = &bm;
    }
    attn::prefill_reference(a, o, lse);
    for (int row = 0; row < pd.total_q; ++row)
      for (int j = 0; j < c.group; ++j) {
        const std::size_t src = static_cast<std::size_t>(row) * c.group + j;
        const std::size_t dst = static_cast<std::size_t>(row) * hq + h * c.group + j;
        pd.ref_lse[dst] = lse[src];
        std::copy_n(o.begin() + src * c.d, c.d, pd.ref_o.begin() + dst * c.d);
      }
  }
}

struct PGpu {
  DevBuf<std::uint16_t> k, v, q;
  DevBuf<std::int32_t> indptr, indices, last, q_indptr, qb_indptr, ids, count;
  DevBuf<float> out, lse;
  cuda::PrefillBlockSelection sel;
  cuda::PrefillArgs args;
};

void setup_gpu(const PData& pd, PGpu& g) {
  const PCase& c = pd.c;
  g.k = to_device(pd.k);
  g.v = to_device(pd.v);
  g.q = to_device(pd.q);
  g.indptr = to_device(pd.indptr);
  g.indices = to_device(pd.indices);
  g.last = to_device(pd.last);
  g.q_indptr = to_device(pd.q_indptr);
  g.qb_indptr = to_device(pd.qb_indptr);
  const int hq = c.hkv * c.group;
  g.out = DevBuf<float>(static_cast<std::size_t>(pd.total_q) * hq * c.d);
  g.lse = DevBuf<float>(static_cast<std::size_t>(pd.total_q) * hq);
  cuda::PrefillArgs& a = g.args;
  a.q = View3<const std::uint16_t>::contiguous(g.q.p, pd.total_q, hq, c.d);
  a.q_indptr = {g.q_indptr.p, g.q_indptr.n};
  a.cache = host_view(pd, g.k.p, g.v.p);
  a.cache.table = {{g.indptr.p, g.indptr.n}, {g.indices.p, g.indices.n}, {g.last.p, g.last.n}};
  a.out = {g.out.p, c.out_f32 ? DType::f32 : c.dtype, static_cast<std::int64_t>(hq) * c.d, c.d};
  a.lse = {g.lse.p, g.lse.n};
  a.mapping = c.mapping;
}

void upload_selection(const PData& pd, PGpu& g) {
  g.ids = to_device(pd.ids);
  g.count = to_device(pd.count);
  g.sel = {pd.c.q_block,
           pd.c.k_block,
           static_cast<int>(pd.count.size()) / pd.qb_indptr.back(),
           pd.max_per_row,
           {g.qb_indptr.p, g.qb_indptr.n},
           {g.ids.p, g.ids.n},
           {g.count.p, g.count.n}};
  g.args.selection = &g.sel;
}

// Runs the GPU indexer and checks its lists against f64 scores of the same pooled means:
// counts = min(n, max(budget, kept)), ascending, kept blocks present, and no unselected block
// scores above a selected non-kept one by more than eps = 1e-4 * sum_c |qbar_c| |kbar_c|
// (f32 means and dots in another order than the host's). Fills pd's selection.
int run_indexer(PData& pd, PGpu& g, cuda::PrefillWorkspace& ws) {
  const PCase& c = pd.c;
  const int hq = c.hkv * c.group, rows = pd.qb_indptr.back();
  const int sinks = 1;
  pd.max_per_row =
      cuda::prefill_index_capacity(pd.max_len, c.q_block, c.k_block, c.budget_blocks, sinks);
  g.ids = DevBuf<std::int32_t>(static_cast<std::size_t>(rows) * c.hkv * pd.max_per_row);
  g.count = DevBuf<std::int32_t>(static_cast<std::size_t>(rows) * c.hkv);
  cuda::PrefillIndexArgs ia;
  ia.q = g.args.q;
  ia.q_indptr = g.args.q_indptr;
  ia.cache = g.args.cache;
  ia.q_block = c.q_block;
  ia.k_block = c.k_block;
  ia.budget_blocks = c.budget_blocks;
  ia.sink_blocks = sinks;
  ia.max_kv_len = pd.max_len;
  ia.q_block_indptr = {g.qb_indptr.p, g.qb_indptr.n};
  ia.max_per_row = pd.max_per_row;
  ia.ids = {g.ids.p, g.ids.n};
  ia.count = {g.count.p, g.count.n};
  cuda::PrefillLaunch launch = prefill_launch();
  launch.workspace = &ws;
  launch.max_q_per_seq = pd.max_q;
  cuda::prefill_index(ia, launch);
  pd.ids = g.ids.download();
  pd.count = g.count.download();

  int bad = 0;
  const int d = c.d;
  for (int b = 0; b < c.batch && bad == 0; ++b) {
    const int len = (pd.indptr[b + 1] - pd.indptr[b] - 1) * c.page + pd.last[b];
    const int nq = pd.q_indptr[b + 1] - pd.q_indptr[b], first_q = len - nq;
    const int nkb = key_blocks(pd, b);
    for (int h = 0; h < c.hkv; ++h) {
      // Key-block means (f64) of this head.
      const kv::PagedKVView view = host_view(pd, pd.k.data(), pd.v.data());
      std::vector<double> km(static_cast<std::size_t>(nkb) * d, 0.0);
      for (int pos = 0; pos < len; ++pos) {
        const int page = pd.indices[pd.indptr[b] + pos / c.page];
        const std::uint16_t* row = pd.k.data() + view.offset(page, h, pos % c.page);
        for (int ch = 0; ch < d; ++ch)
          km[static_cast<std::size_t>(pos / c.k_block) * d + ch] +=
              from_half_bits(c.dtype, row[ch]);
      }
      for (int j = 0; j < nkb; ++j) {
        const int n = std::min(len, (j + 1) * c.k_block) - j * c.k_block;
        for (int ch = 0; ch < d; ++ch) km[static_cast<std::size_t>(j) * d + ch] /= n;
      }
      for (int i = 0; i * c.q_block < nq; ++i) {
        std::vector<double> qm(d, 0.0);
        const int t1 = std::min(nq, (i + 1) * c.q_block);
        for (int t = i * c.q_block; t < t1; ++t)
          for (int j = 0; j < c.group; ++j)
            for (int ch = 0; ch < d; ++ch)
              qm[ch] +=
                  pd.qf[(static_cast<std::size_t>(pd.q_indptr[b] + t) * hq + h * c.group + j) * d +
                        ch];
        for (double& x : qm) x /= (t1 - i * c.q_block) * c.group;
        const int n = (first_q + t1 - 1) / c.k_block + 1;
        const int d0 = (first_q + i * c.q_block) / c.k_block;
        const int ks = std::min(sinks, n);
        const int kept = ks + (n - d0) - std::max(0, ks - d0);
        const int want = std::min(n, std::max(c.budget_blocks, kept));
        const std::size_t slot = static_cast<std::size_t>(pd.qb_indptr[b] + i) * c.hkv + h;
        const std::int32_t* list = pd.ids.data() + slot * pd.max_per_row;
        std::vector<char> in(n, 0);
        bool ok = pd.count[slot] == want;
        for (int x = 0; ok && x < want; ++x) {
          ok = list[x] >= 0 && list[x] < n && (x == 0 || list[x] > list[x - 1]);
          if (ok) in[list[x]] = 1;
        }
        for (int x = want; ok && x < pd.max_per_row; ++x) ok = list[x] == -1;
        double lo_sel = INFINITY, hi_out = -INFINITY, eps = 0;
        for (int j = 0; ok && j < n; ++j) {
          const bool is_kept = j < ks || j >= d0;
          if (is_kept && !in[j]) ok = false;
          double s = 0, mag = 0;
          for (int ch = 0; ch < d; ++ch) {
            s += qm[ch] * km[static_cast<std::size_t>(j) * d + ch];
            mag += std::fabs(qm[ch] * km[static_cast<std::size_t>(j) * d + ch]);
          }
          eps = std::max(eps, 1e-4 * mag);
          if (is_kept) continue;
          if (in[j])
            lo_sel = std::min(lo_sel, s);
          else
            hi_out = std::max(hi_out, s);
        }
        if (ok && hi_out > lo_sel + eps) ok = false;
        if (!ok) {
          std::printf(
              "  indexer FAIL b=%d kv head %d query block %d: count %d (want %d), best "
              "unselected %.6g vs worst selected %.6g\n",
              b, h, i, pd.count[slot], want, hi_out, lo_sel);
          ++bad;
          break;
        }
      }
    }
  }
  g.sel = {c.q_block,
           c.k_block,
           c.hkv,
           pd.max_per_row,
           {g.qb_indptr.p, g.qb_indptr.n},
           {g.ids.p, g.ids.n},
           {g.count.p, g.count.n}};
  g.args.selection = &g.sel;
  return bad;
}

struct PErr {
  double o = 0, lse = 0;
  long empty = 0;
  std::string why;
};

PErr compare(const PData& pd, const std::vector<float>& o, const std::vector<float>& lse) {
  PErr e;
  double num = 0, den = 0;
  for (std::size_t i = 0; i < pd.ref_o.size(); ++i) {
    if (!std::isfinite(o[i])) {
      e.why = "non-finite output (unwritten or NaN)";
      return e;
    }
    num = std::max(num, std::fabs(o[i] - pd.ref_o[i]));
    den = std::max(den, std::fabs(pd.ref_o[i]));
  }
  e.o = den > 0 ? num / den : num;
  const int d = pd.c.d;
  for (std::size_t i = 0; i < pd.ref_lse.size(); ++i) {
    if (!std::isfinite(pd.ref_lse[i])) {  // no keys: lse -inf (softmax), τ NaN (entmax)
      ++e.empty;
      bool zero = pd.c.mapping.is_entmax() ? std::isnan(lse[i]) : std::isinf(lse[i]) && lse[i] < 0;
      for (int c = 0; c < d; ++c) zero &= o[i * d + c] == 0.f;
      if (!zero) {
        e.why = "a query without keys must give o = 0, lse = -inf / tau = NaN";
        return e;
      }
      continue;
    }
    if (!std::isfinite(lse[i])) {
      e.why = "non-finite lse";
      return e;
    }
    e.lse = std::max(e.lse,
                     std::fabs(lse[i] - pd.ref_lse[i]) / std::max(1.0, std::fabs(pd.ref_lse[i])));
  }
  return e;
}

// Tolerances against the f64 reference on the same bf16/f16 inputs. P is rounded to the input
// type before P·V (unit roundoff 2^-8 bf16, 2^-11 f16), S and O accumulate in f32.
double tol_o(const PCase& c) {
  const double t = c.dtype == DType::bf16 ? 1e-2 : 2e-3;
  return c.out_f32 ? t : t + (c.dtype == DType::bf16 ? 4e-3 : 5e-4);  // + output rounding
}
constexpr double kTolLse = 1e-4;  // |lse - ref| / max(1, |ref|)

// Runs prefill on the set-up case twice (poisoned outputs) and compares with the reference and
// bit for bit between the runs.
PErr run_prefill(const PData& pd, PGpu& g, cuda::PrefillWorkspace& ws) {
  PErr e;
  const int hq = pd.c.hkv * pd.c.group;
  cuda::PrefillLaunch launch = prefill_launch();
  launch.workspace = &ws;
  launch.max_q_per_seq = pd.max_q;
  std::vector<float> first_o, first_lse;
  for (int run = 0; run < 2; ++run) {
    CK(cudaMemset(g.out.p, 0xff, g.out.n * sizeof(float)));  // poison: NaN everywhere
    CK(cudaMemset(g.lse.p, 0xff, g.lse.n * sizeof(float)));
    try {
      cuda::prefill(g.args, launch);
    } catch (const Error& err) {
      e.why = std::string("threw: ") + err.what();
      return e;
    }
    CK(cudaDeviceSynchronize());
    std::vector<float> o = g.out.download(), lse = g.lse.download();
    if (!pd.c.out_f32) {  // the 16-bit output sits in the first half of the buffer
      const auto* h = reinterpret_cast<const std::uint16_t*>(o.data());
      std::vector<float> f(static_cast<std::size_t>(pd.total_q) * hq * pd.c.d);
      for (std::size_t i = 0; i < f.size(); ++i) f[i] = from_half_bits(pd.c.dtype, h[i]);
      o = f;
    }
    if (run == 0) {
      e = compare(pd, o, lse);
      first_o = o;
      first_lse = lse;
    } else if (std::memcmp(o.data(), first_o.data(), o.size() * 4) != 0 ||
               std::memcmp(lse.data(), first_lse.data(), lse.size() * 4) != 0) {
      e.why = "rerun differs in bits";
    }
    if (!e.why.empty()) return e;
  }
  return e;
}

std::vector<PCase> prefill_cases() {
  std::vector<PCase> cs;
  int idx = 0;
  const struct {
    int len, nq;
  } sizes[] = {{1, 1}, {17, 17}, {64, 64}, {65, 65}, {200, 131}, {777, 777}, {1100, 300}};
  for (const auto& sz : sizes)
    for (int group : {1, 4, 8})
      for (int d : {64, 128}) {
        const DType dt = idx % 3 == 2 ? DType::f16 : DType::bf16;
        const kv::Layout lay = idx % 4 == 3 ? kv::Layout::NHD : kv::Layout::HND;
        const int page = idx % 2 ? 16 : 64;
        const int hkv = group == 8 ? 1 : 2;
        const int batch = sz.len < 100 && idx % 2 ? 3 : 1;
        for (Mode mode : {Mode::dense, Mode::lists, Mode::indexer}) {
          PCase c{sz.len, sz.nq, group, d, hkv, batch, page, dt, lay, mode};
          c.q_block = mode == Mode::lists && idx % 5 == 1 ? 128 : 64;
          c.k_block = mode == Mode::lists && idx % 3 == 1 ? 128 : 64;
          c.sel_heads = idx % 2 ? hkv : 1;
          c.budget_blocks = 2 + idx % 5;
          c.out_f32 = idx % 7 != 4;
          cs.push_back(c);
        }
        ++idx;
      }
  // Odd groups: 2 and 3 q heads per kv head (2 and 1 heads per CTA).
  cs.push_back({300, 300, 2, 128, 2, 1, 16, DType::bf16, kv::Layout::HND, Mode::lists});
  cs.push_back({300, 250, 3, 64, 2, 2, 16, DType::f16, kv::Layout::NHD, Mode::dense});
  cs.push_back(
      {2000, 2000, 4, 128, 1, 1, 16, DType::bf16, kv::Layout::HND, Mode::indexer, 64, 64, 1, 8});
  // α-entmax (the exact multi-pass path): α 1.5, 2, 1.25, 1.7; dense, lists and indexer
  // lists; some with small q (every z near 0: τ <= 0, every key in the support).
  const double alphas[] = {1.5, 2.0, 1.25, 1.7};
  int e = 0;
  for (const auto& sz : {std::pair{17, 17}, {200, 131}, {777, 777}, {1100, 300}})
    for (int d : {64, 128})
      for (Mode mode : {Mode::dense, Mode::lists, Mode::indexer}) {
        PCase c{sz.first, sz.second, e % 2 ? 4 : 2, d, 2, sz.first < 100 ? 3 : 1,
                e % 2 ? 16 : 64, e % 3 == 2 ? DType::f16 : DType::bf16,
                e % 4 == 3 ? kv::Layout::NHD : kv::Layout::HND, mode};
        c.sel_heads = e % 2 ? 2 : 1;
        c.budget_blocks = 2 + e % 4;
        c.out_f32 = e % 5 != 4;
        c.mapping = Mapping::entmax(alphas[e % 4]);
        c.q_amp = e % 6 == 5 ? 0.01f : 3.f;
        cs.push_back(c);
        ++e;
      }
  return cs;
}

const char* mode_name(Mode m) {
  return m == Mode::dense ? "dense" : m == Mode::lists ? "lists" : "indexer";
}

// Expects `f` to throw masskv::Error naming `argument`.
bool expect_throw(const char* name, const char* argument, const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    const bool ok = e.argument() == argument;
    std::printf("  error case %-36s -> Error(%s) \"%s\" %s\n", name, e.argument().c_str(), e.what(),
                ok ? "ok" : "WRONG ARGUMENT");
    return ok;
  }
  std::printf("  error case %-36s -> no exception: FAIL\n", name);
  return false;
}

int error_cases(cuda::PrefillWorkspace& ws) {
  PData pd;
  pd.c = {300, 200, 4, 128, 2, 2, 16, DType::bf16, kv::Layout::HND, Mode::lists};
  build_inputs(pd, 99);
  const std::vector<std::int32_t> counts = pd.count;
  PGpu g;
  setup_gpu(pd, g);
  upload_selection(pd, g);
  cuda::PrefillLaunch launch = prefill_launch();
  launch.workspace = &ws;
  launch.max_q_per_seq = pd.max_q;
  bool ok = true;
  const auto run = [&] { cuda::prefill(g.args, launch); };
  std::vector<std::int32_t> bad = pd.ids;
  bad[0] = key_blocks(pd, 0);  // one past the sequence's key blocks
  pd.count[0] = std::max(pd.count[0], 1);
  g.count.upload(pd.count);
  g.ids.upload(bad);
  ok &= expect_throw("key block id past the sequence", "block_selection", run);
  bad = pd.ids;
  bad[0] = 1;
  bad[1] = 1;  // not strictly ascending
  pd.count[0] = std::max(pd.count[0], 2);
  g.count.upload(pd.count);
  g.ids.upload(bad);
  ok &= expect_throw("list not strictly ascending", "block_selection", run);
  bad[1] = 2;
  g.ids.upload(bad);
  std::vector<std::int32_t> bc = pd.count;
  bc[1] = pd.max_per_row + 1;
  g.count.upload(bc);
  ok &= expect_throw("count > max_per_row", "block_selection", run);
  g.count.upload(pd.count);
  std::vector<std::int32_t> bi = pd.indices;
  bi[3] = pd.pool_pages;
  g.indices.upload(bi);
  ok &= expect_throw("physical page id == num_pages", "indices", run);
  g.indices.upload(pd.indices);
  ok &= expect_throw("max_q_per_seq too small", "q_indptr", [&] {
    cuda::PrefillLaunch l = launch;
    l.max_q_per_seq = pd.max_q - 1;
    cuda::prefill(g.args, l);
  });
  ok &= expect_throw("q_block 32", "block_selection", [&] {
    cuda::PrefillBlockSelection s = g.sel;
    s.q_block = 32;
    cuda::PrefillArgs a = g.args;
    a.selection = &s;
    cuda::prefill(a, launch);
  });
  ok &= expect_throw("entmax alpha 2.5", "alpha", [&] {
    cuda::PrefillArgs a = g.args;
    a.mapping = Mapping::entmax(2.5);
    cuda::prefill(a, launch);
  });
  ok &= expect_throw("lse of the wrong size", "lse", [&] {
    cuda::PrefillArgs a = g.args;
    a.lse = a.lse.subspan(1);
    cuda::prefill(a, launch);
  });
  ok &= expect_throw("head_dim 256", "head_dim", [&] {
    cuda::PrefillArgs a = g.args;
    a.cache.head_dim = 256;
    cuda::prefill(a, launch);
  });
  ok &= expect_throw("f16 output for bf16 inputs", "out", [&] {
    cuda::PrefillArgs a = g.args;
    a.out.dtype = DType::f16;
    cuda::prefill(a, launch);
  });
  ok &= expect_throw("indexer budget_blocks 0", "budget_blocks", [&] {
    cuda::PrefillIndexArgs ia;
    ia.q = g.args.q;
    ia.q_indptr = g.args.q_indptr;
    ia.cache = g.args.cache;
    ia.max_kv_len = pd.max_len;
    cuda::prefill_index(ia, launch);
  });
  // The flag is clear after each error: a clean run on the original lists passes.
  pd.count = counts;
  g.ids.upload(pd.ids);
  g.count.upload(pd.count);
  build_reference(pd);
  const PErr e = run_prefill(pd, g, ws);
  const bool clean = e.why.empty() && e.o <= tol_o(pd.c) && e.lse <= kTolLse;
  std::printf("  clean run after errors: o_err=%.3e lse_err=%.3e %s\n", e.o, e.lse,
              clean ? "ok" : ("FAIL " + e.why).c_str());
  return ok && clean ? 0 : 1;
}

}  // namespace

int run_prefill_check() {
  const std::vector<PCase> cases = prefill_cases();
  std::printf(
      "prefill check: %zu cases (dense causal, random block lists, GPU indexer lists; softmax "
      "and entmax)\n",
              cases.size());
  std::printf(
      "tolerances: ||o-ref||inf/||ref||inf <= 1e-2 (bf16) / 2e-3 (f16) (+4e-3 / 5e-4 "
      "with 16-bit output), |lse-ref|/max(1,|ref|) (entmax: tau) <= %.0e; reference: f64 on "
      "the same bf16/f16 values (attn::prefill_reference); reruns bit-identical\n",
      kTolLse);
  cuda::PrefillWorkspace ws;
  int failures = 0;
  double worst_o[2] = {0, 0}, worst_lse = 0;
  long empty_rows = 0;
  const std::size_t chunk = 16;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t start = 0; start < cases.size(); start += chunk) {
    const std::size_t end = std::min(cases.size(), start + chunk);
    std::vector<PData> data(end - start);
    std::vector<PGpu> gpu(end - start);
#pragma omp parallel for schedule(dynamic, 1)
    for (std::size_t i = start; i < end; ++i) {
      data[i - start].c = cases[i];
      build_inputs(data[i - start], 2000 + i);
    }
    std::vector<int> index_bad(end - start, 0);
    for (std::size_t i = start; i < end; ++i) {
      PData& pd = data[i - start];
      setup_gpu(pd, gpu[i - start]);
      if (pd.c.mode == Mode::lists) upload_selection(pd, gpu[i - start]);
      if (pd.c.mode == Mode::indexer) {
        try {
          index_bad[i - start] = run_indexer(pd, gpu[i - start], ws);
        } catch (const Error& err) {
          std::printf("  indexer threw: %s\n", err.what());
          index_bad[i - start] = 1;
        }
      }
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (std::size_t i = start; i < end; ++i) build_reference(data[i - start]);
    for (std::size_t i = start; i < end; ++i) {
      const PData& pd = data[i - start];
      const PCase& c = pd.c;
      const PErr e = run_prefill(pd, gpu[i - start], ws);
      const bool ok = e.why.empty() && e.o <= tol_o(c) && e.lse <= kTolLse && !index_bad[i - start];
      const int dt = c.dtype == DType::bf16 ? 0 : 1;
      if (c.out_f32) worst_o[dt] = std::max(worst_o[dt], e.o);
      worst_lse = std::max(worst_lse, e.lse);
      empty_rows += e.empty;
      if (!ok) ++failures;
      char map_name[24];
      std::snprintf(map_name, sizeof map_name, c.mapping.is_entmax() ? "entmax %.2f" : "softmax",
                    c.mapping.alpha);
      std::printf(
          "  %-7s len=%5d nq=%5d B=%d G=%d Hkv=%d d=%3d %s %s page=%2d qb=%3d kb=%3d "
          "heads=%d budget=%d out=%s %s: o_err=%.2e lse_err=%.2e empty=%ld %s%s\n",
          mode_name(c.mode), c.len, c.nq, c.batch, c.group, c.hkv, c.d,
          c.dtype == DType::bf16 ? "bf16" : "f16 ", c.layout == kv::Layout::HND ? "HND" : "NHD",
          c.page, c.q_block, c.k_block, c.mode == Mode::lists ? c.sel_heads : c.hkv,
          c.budget_blocks, c.out_f32 ? "f32" : "16b", map_name, e.o, e.lse, e.empty,
          ok ? "ok" : "FAIL ",
          index_bad[i - start] ? "(indexer lists wrong)" : e.why.c_str());
    }
  }
  std::printf("prefill errors:\n");
  failures += error_cases(ws);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "PREFILL CHECK %s: %d failure(s); worst o (f32 out) bf16 %.2e, f16 %.2e; worst lse "
      "%.2e; %ld empty query rows checked; %.1f s\n",
      failures ? "FAILED" : "PASSED", failures, worst_o[0], worst_o[1], worst_lse, empty_rows,
      secs);
  return failures;
}
