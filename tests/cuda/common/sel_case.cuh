// masskv_gpu_bench's selection cases: shapes, host inputs (summaries, the bf16 bound store),
// device copies, the CPU comparison and its tolerance (select_check.cu, compact_check.cu,
// select_selftest.cu, profiles.cu).
#pragma once

#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "gpu_util.cuh"
#include "hier_case.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "select/kept.hpp"

using namespace masskv;

namespace {

// ---- GPU Quest selection: check against the CPU selector, self-test -------------------------
// The CPU reference is select::quest_select on the same outward-rounded bf16 bound store
// (select::BoundStore). The GPU kernel evaluates the bound in the order of the CPU's AVX2
// kernel, so on an AVX2 host the bounds are expected to have the same bits and the lists to be
// identical. Tolerance, only where bounds differ in bits (a non-AVX2 host, MASSKV_ISA=scalar,
// or a compiler contracting differently): two f32 evaluations of the same bound in different
// summation orders differ by at most eps = scale * (2(2d+4) 2^-24 * max_i ||q_i||_1 * W +
// 8 * 2^-24 * |bound|) (the forward-error bound the CPU already adds as slack, page_bound.cpp);
// pages whose bounds lie within eps of the k-th (threshold) bound may then rank either way.
// So a list may differ from the CPU's only in candidate pages whose CPU bound is within eps of
// the threshold; counts, kept pages (sinks, window, last page) and everything else must match.

struct SelCase {
  int batch, hq, hkv, d, page, len;
  select::TopkPolicy pol;
  float scale = 0;
  int tie_mode = 0;  // 0 random, 1 four distinct page patterns (exact ties), 2 all pages equal
};

struct SelData {
  SelCase c;
  int pool_pages = 0;
  std::vector<std::int32_t> indptr, indices, last;
  std::vector<float> smin, smax, q;
  select::BoundStore store;
  int max_pages = 0;
};

// The f32 min/max summaries of a case's pool, as the CPU stores read them.
inline kv::SummariesView summaries_of(const SelData& sd) {
  kv::SummariesView sv;
  sv.min = sd.smin.data();
  sv.max = sd.smax.data();
  sv.num_pages = sd.pool_pages;
  sv.num_kv_heads = sd.c.hkv;
  sv.head_dim = sd.c.d;
  return sv;
}

inline void build_sel_case(SelData& sd, std::uint64_t seed) {
  const SelCase& c = sd.c;
  Rng rng(seed);
  sd.indptr.assign(1, 0);
  int total = 0;
  for (int b = 0; b < c.batch; ++b) {
    const int len = b == 0 ? c.len : 1 + rng.below(c.len);
    const int np = (len + c.page - 1) / c.page;
    total += np;
    sd.indptr.push_back(total);
    sd.last.push_back(len - (np - 1) * c.page);
    sd.max_pages = std::max(sd.max_pages, np);
  }
  sd.pool_pages = total + total / 4 + 3;
  std::vector<std::int32_t> perm(sd.pool_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = sd.pool_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  sd.indices.assign(perm.begin(), perm.begin() + total);
  const std::size_t per_page = static_cast<std::size_t>(c.hkv) * c.d;
  sd.smin.resize(static_cast<std::size_t>(sd.pool_pages) * per_page);
  sd.smax.resize(sd.smin.size());
  const int patterns = c.tie_mode == 1 ? 4 : 1;
  std::vector<float> pat_lo(patterns * per_page), pat_hi(pat_lo.size());
  for (std::size_t i = 0; i < pat_lo.size(); ++i) {
    const float ctr = rng.sym(1.5f), r = static_cast<float>(rng.uniform());
    pat_lo[i] = ctr - r;
    pat_hi[i] = ctr + r;
  }
  for (int pg = 0; pg < sd.pool_pages; ++pg) {
    const int pat = c.tie_mode ? rng.below(patterns) : 0;
    for (std::size_t i = 0; i < per_page; ++i) {
      const std::size_t o = static_cast<std::size_t>(pg) * per_page + i;
      if (c.tie_mode) {
        sd.smin[o] = pat_lo[pat * per_page + i];
        sd.smax[o] = pat_hi[pat * per_page + i];
      } else {
        // Keys in [-2, 2] with a per-page spread: min <= max, values not bf16-exact (the store
        // rounds them outward).
        const float ctr = rng.sym(1.5f), r = static_cast<float>(rng.uniform() * 0.8);
        sd.smin[o] = ctr - r;
        sd.smax[o] = ctr + r;
      }
    }
  }
  sd.store = select::BoundStore(summaries_of(sd));
  sd.q.resize(static_cast<std::size_t>(c.batch) * c.hq * c.d);
  for (float& x : sd.q) x = rng.sym(3.f);
}

// Device copies of a case's store, table and q, and the GPU selection's outputs.
struct SelGpu {
  DevBuf<std::uint16_t> mn, mx;
  DevBuf<std::int32_t> indptr, indices, last, ids, count;
  DevBuf<float> q;
  cuda::QuestSelectArgs args;
  int max_per_head = 0;
};

inline void setup_sel_gpu(const SelData& sd, SelGpu& g) {
  const SelCase& c = sd.c;
  const select::BoundStoreView hv = sd.store.view();
  const std::size_t n = static_cast<std::size_t>(hv.num_pages) * hv.num_kv_heads * hv.head_dim;
  g.mn = DevBuf<std::uint16_t>(n);
  g.mx = DevBuf<std::uint16_t>(n);
  g.mn.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
  g.mx.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
  g.indptr = to_device(sd.indptr);
  g.indices = to_device(sd.indices);
  g.last = to_device(sd.last);
  g.q = to_device(sd.q);
  g.max_per_head = cuda::select_capacity(sd.max_pages, c.page, c.pol);
  g.ids = DevBuf<std::int32_t>(static_cast<std::size_t>(c.batch) * c.hkv * g.max_per_head);
  g.count = DevBuf<std::int32_t>(static_cast<std::size_t>(c.batch) * c.hkv);
  cuda::QuestSelectArgs& a = g.args;
  a.q = View3<const float>::contiguous(g.q.p, c.batch, c.hq, c.d);
  a.table = {{g.indptr.p, g.indptr.n}, {g.indices.p, g.indices.n}, {g.last.p, g.last.n}};
  a.page_size = c.page;
  a.bounds = hv;
  a.bounds.min = reinterpret_cast<const bf16*>(g.mn.p);
  a.bounds.max = reinterpret_cast<const bf16*>(g.mx.p);
  a.bounds.wmax = nullptr;
  a.scale = c.scale;
  a.policy = c.pol;
  a.max_per_head = g.max_per_head;
  a.ids = {g.ids.p, g.ids.n};
  a.count = {g.count.p, g.count.n};
}

inline select::QuestArgs cpu_args(const SelData& sd, const select::BoundStoreView& hv) {
  select::QuestArgs qa;
  qa.q = View3<const float>::contiguous(sd.q.data(), sd.c.batch, sd.c.hq, sd.c.d);
  qa.table = {sd.indptr, sd.indices, sd.last};
  qa.page_size = sd.c.page;
  qa.bounds_bf16 = &hv;
  qa.scale = sd.c.scale;
  qa.policy = sd.c.pol;
  return qa;
}

struct SelStats {
  long lists = 0, identical = 0, near_tie = 0, pages = 0, bit_equal = 0;
  double worst_bound = 0;  // max |gpu - cpu| / eps over pages
};

// Compares one case; returns the failures (printed).
inline int compare_selection(const SelData& sd, const SelectionStorage& cpu,
                      const std::vector<std::int32_t>& gids, const std::vector<std::int32_t>& gcnt,
                      int gmax, const std::vector<std::uint32_t>& keys, int kstride, SelStats& st,
                      const char* tag) {
  const SelCase& c = sd.c;
  const select::BoundStoreView hv = sd.store.view();
  const int g = c.hq / c.hkv;
  const float scale = c.scale == 0 ? 1.0f / std::sqrt(static_cast<float>(c.d)) : c.scale;
  const double f = 2.0 * (2 * c.d + 4) * 0x1p-24;
  int failures = 0;
  auto fail_msg = [&](int b, int h, const std::string& why) {
    if (failures++ < 5)
      std::printf(
          "FAIL select %s B=%d Hq=%d Hkv=%d d=%d page=%d len=%d budget=%d sinks=%d "
          "window=%d tie=%d: b=%d h=%d: %s\n",
          tag, c.batch, c.hq, c.hkv, c.d, c.page, c.len, c.pol.budget_pages, c.pol.sink_pages,
          c.pol.window_tokens, c.tie_mode, b, h, why.c_str());
  };
  std::vector<float> U;
  for (int b = 0; b < c.batch; ++b) {
    const int n = sd.indptr[b + 1] - sd.indptr[b];
    const std::span<const std::int32_t> phys(sd.indices.data() + sd.indptr[b],
                                             static_cast<std::size_t>(n));
    for (int h = 0; h < c.hkv; ++h) {
      ++st.lists;
      // CPU bounds of the group, aggregated by max over its q heads as topk_one does.
      U.resize(static_cast<std::size_t>(g) * n);
      const float* q0 = sd.q.data() + (static_cast<std::size_t>(b) * c.hq + h * g) * c.d;
      select::page_upper_bounds(hv, phys, h, q0, g, c.d, scale, U);
      std::vector<float> agg(static_cast<std::size_t>(n));
      double l1max = 0, wmax = 0;
      for (int i = 0; i < g; ++i) {
        double l1 = 0;
        for (int x = 0; x < c.d; ++x) l1 += std::fabs(q0[i * c.d + x]);
        l1max = std::max(l1max, l1);
      }
      for (int j = 0; j < n; ++j) {
        float m = U[j];
        for (int i = 1; i < g; ++i) m = U[i * n + j] > m ? U[i * n + j] : m;
        agg[j] = m;
        wmax = std::max(
            wmax, static_cast<double>(hv.wmax[static_cast<std::size_t>(phys[j]) * c.hkv + h]));
      }
      double maxabs = 0;
      for (float x : agg) maxabs = std::max(maxabs, std::fabs(static_cast<double>(x)));
      const double eps = scale * (f * l1max * wmax + 8 * 0x1p-24 * maxabs);
      bool bits_equal = true;
      for (int j = 0; j < n; ++j) {
        const std::uint32_t k = keys[(static_cast<std::size_t>(b) * c.hkv + h) * kstride + j];
        const float gb = cuda::key_to_bound(k);
        ++st.pages;
        if (k == cuda::bound_to_key(agg[j])) {
          ++st.bit_equal;
        } else {
          bits_equal = false;
          const double e = std::fabs(static_cast<double>(gb) - agg[j]) / eps;
          st.worst_bound = std::max(st.worst_bound, e);
          if (!(e <= 1.0)) {
            char buf[160];
            std::snprintf(buf, sizeof buf, "page %d bound gpu %.9g cpu %.9g (|diff| = %.2f eps)", j,
                          gb, agg[j], e);
            fail_msg(b, h, buf);
            break;
          }
        }
      }
      // Lists.
      const int cc = cpu.count[b * c.hkv + h], gc = gcnt[b * c.hkv + h];
      const std::int32_t* gl = gids.data() + (static_cast<std::size_t>(b) * c.hkv + h) * gmax;
      const std::span<const std::int32_t> cl = cpu.view().list(b, h);
      if (cc != gc) {
        fail_msg(b, h, "count gpu " + std::to_string(gc) + " cpu " + std::to_string(cc));
        continue;
      }
      bool valid = gc <= gmax;
      for (int i = 0; valid && i < gc; ++i)
        valid = gl[i] >= 0 && gl[i] < n && (i == 0 || gl[i] > gl[i - 1]);
      for (int i = gc; valid && i < gmax; ++i) valid = gl[i] == -1;
      if (!valid) {
        fail_msg(b, h, "gpu list not ascending in [0, n) with -1 padding");
        continue;
      }
      if (std::equal(cl.begin(), cl.end(), gl)) {
        ++st.identical;
        continue;
      }
      if (bits_equal) {
        fail_msg(b, h, "lists differ although every bound has the same bits (top-k bug)");
        continue;
      }
      // Near-tie tolerance: differing pages must be candidates with bounds within eps of the
      // threshold (the smallest bound among the CPU's selected candidates).
      std::vector<std::uint8_t> in_c(static_cast<std::size_t>(n), 0), in_g(in_c.size(), 0);
      for (std::int32_t j : cl) in_c[j] = 1;
      for (int i = 0; i < gc; ++i) in_g[gl[i]] = 1;
      const std::int64_t length = static_cast<std::int64_t>(n - 1) * c.page + sd.last[b];
      const select::KeptRanges<int> kept =
          select::kept_pages(n, length, c.page, c.pol.sink_pages, c.pol.window_tokens);
      const int sinks = kept.first_end, window = kept.last_begin;
      double thr = INFINITY;
      for (int j = sinks; j < window; ++j)
        if (in_c[j]) thr = std::min(thr, static_cast<double>(agg[j]));
      bool ok = true;
      for (int j = 0; j < n && ok; ++j) {
        if (in_c[j] == in_g[j]) continue;
        ok = j >= sinks && j < window && std::fabs(agg[j] - thr) <= eps;
        if (!ok) {
          char buf[200];
          std::snprintf(buf, sizeof buf,
                        "page %d %s: bound %.9g vs threshold %.9g (eps %.3g) is not a near-tie", j,
                        in_c[j] ? "only on the CPU" : "only on the GPU", agg[j], thr, eps);
          fail_msg(b, h, buf);
        }
      }
      if (ok) ++st.near_tie;
    }
  }
  return failures;
}

// Runs the GPU selection of a set-up case and downloads ids, counts and keys.
inline void run_gpu_select(SelGpu& g, const SelData& sd, cuda::SelectWorkspace& ws,
                    std::vector<std::int32_t>& ids, std::vector<std::int32_t>& cnt,
                    std::vector<std::uint32_t>& keys, int chunk_pages = 0) {
  CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));  // poison
  CK(cudaMemset(g.count.p, 0x7f, g.count.n * sizeof(std::int32_t)));
  cuda::SelectLaunch l = select_launch();
  l.workspace = &ws;
  l.max_pages_per_seq = sd.max_pages;
  l.chunk_pages = chunk_pages;
  cuda::quest_select(g.args, l);
  ids = g.ids.download();
  cnt = g.count.download();
  const auto k = ws.page_keys();
  keys.resize(k.size());
  CK(cudaMemcpy(keys.data(), k.data(), k.size() * sizeof(std::uint32_t), cudaMemcpyDeviceToHost));
}

inline std::vector<SelCase> select_cases() {
  std::vector<SelCase> cases;
  const int groups[][2] = {{4, 4}, {8, 2}, {12, 4}, {32, 8}, {16, 2}, {28, 4}, {32, 2}};
  const int lens[] = {1, 15, 17, 100, 1000, 4097, 20000, 65537, 131073};
  const int pages[] = {16, 1, 8, 32, 64, 16, 4};  // the CPU cache takes powers of two
  const int budgets[] = {0, 1, 5, 16, 64, 256, 100000};
  const int sinks[] = {0, 1, 4, 1};
  const int windows[] = {0, 1, 64, 1000, 0};
  const int batches[] = {1, 3, 8, 1};
  for (int idx = 0; idx < 84; ++idx) {
    SelCase c{};
    const int gi = idx % 7;
    c.hq = groups[gi][0];
    c.hkv = groups[gi][1];
    c.d = (idx / 7) % 2 ? 128 : 64;
    c.len = lens[(idx * 5 + idx / 9) % 9];
    c.page = pages[(idx * 3 + idx / 7) % 7];
    if (c.page < 8 && c.len > 20000) c.page = 16;  // keep the pool (and the CPU) affordable
    c.batch = batches[(idx / 3) % 4];
    if (c.len > 65536 && c.batch > 3) c.batch = 3;
    // Keep the host summaries under ~40M floats per array.
    while (c.batch > 1 &&
           static_cast<double>(c.batch) * ((c.len + c.page - 1) / c.page) * c.hkv * c.d > 3e7)
      c.batch = 1;
    c.pol.budget_pages = budgets[(idx / 2 + idx * 5) % 7];
    c.pol.sink_pages = sinks[idx % 4];
    c.pol.window_tokens = windows[(idx / 2) % 5];
    c.scale = idx % 10 == 3 ? 1.0f : 0.f;
    c.tie_mode = idx % 12 == 5 ? 1 : idx % 17 == 8 ? 2 : 0;
    cases.push_back(c);
  }
  // Hand-picked edges: budget >= pages, budget 0, sinks covering the sequence, window covering
  // it, exact ties with a large budget, head_dim 256, one page.
  cases.push_back({1, 32, 8, 128, 16, 4097, {1000, 1, 0}, 0, 0});
  cases.push_back({2, 32, 8, 128, 16, 4097, {0, 0, 0}, 0, 0});
  cases.push_back({2, 8, 2, 64, 16, 100, {3, 10, 0}, 0, 0});
  cases.push_back({2, 8, 2, 64, 16, 100, {3, 0, 5000}, 0, 0});
  cases.push_back({4, 16, 4, 128, 16, 30000, {100, 2, 256}, 0, 2});
  cases.push_back({4, 16, 4, 128, 16, 30000, {700, 1, 16}, 0, 1});
  cases.push_back({2, 16, 2, 256, 16, 5000, {32, 1, 64}, 0, 0});
  cases.push_back({3, 4, 1, 64, 64, 1, {4, 1, 0}, 0, 0});
  cases.push_back({1, 32, 8, 128, 16, 1 << 20, {512, 1, 64}, 0, 0});  // 1M tokens, 65536 pages
  // Groups 2, 6 and 5 (the scoring kernel's q-head batches of 4: a batch of 2 and of 1 after 4),
  // and candidates spread over all eight slices of the top-k cluster, with ties across slices.
  cases.push_back({1, 16, 8, 128, 16, 200000, {4096, 1, 64}, 0, 1});
  cases.push_back({2, 24, 4, 64, 16, 70000, {1000, 4, 1000}, 0, 2});
  cases.push_back({1, 10, 2, 256, 16, 40000, {300, 1, 64}, 0, 0});
  cases.push_back({2, 16, 8, 128, 1, 33, {5, 0, 0}, 0, 0});
  // 9 x 8 = 72 (sequence, kv head) pairs: the top-k runs one CTA per pair (no cluster) on 132 SMs.
  cases.push_back({9, 32, 8, 128, 16, 3000, {64, 1, 64}, 0, 1});
  return cases;
}

// The cases whose summary store holds at most max_values values (the checks against scalar CPU
// references keep to ~2e7).
inline std::vector<SelCase> select_cases_up_to(double max_values) {
  std::vector<SelCase> cases;
  for (const SelCase& c : select_cases()) {
    const double values =
        static_cast<double>(c.batch) * ((c.len + c.page - 1) / c.page) * c.hkv * c.d;
    if (values <= max_values) cases.push_back(c);
  }
  return cases;
}

// Runs body(i) (returns its failures) for cases 0..n-1; a case that throws (host or device) is
// one failure and the others still run; a progress line every 16 cases.
template <class F>
int run_cases(const char* what, std::size_t n, F&& body) {
  int failures = 0;
  for (std::size_t i = 0; i < n; ++i) {
    try {
      failures += body(i);
    } catch (const Error& e) {
      std::printf("FAIL %s case %zu threw: %s\n", what, i, e.what());
      failures += 1;
    }
    if (i % 16 == 15 || i + 1 == n) {
      std::printf("  %s cases ..%zu done (%d failures so far)\n", what, i, failures);
      std::fflush(stdout);
    }
  }
  return failures;
}

}  // namespace
