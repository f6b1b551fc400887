// masskv_gpu_tests select-selftest: GPU Quest selection's ties, budget edges, determinism,
// errors, CUDA graphs, and select + decode end to end.
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
#include "decode_case.cuh"
#include "sel_case.cuh"
#include "checks.hpp"

using namespace masskv;

// Self-test: properties that do not lean on the CPU selector (ties, budget edges,
// determinism, errors through the flag and on the host, graph capture), then an end-to-end
// sparse decode on the GPU's own selection against the f64 reference on the CPU's.
int run_select_selftest() {
  std::printf("select-selftest\n");
  int failures = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("  %-62s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok) ++failures;
  };
  cuda::SelectWorkspace ws;
  // 1. All pages equal (tie_mode 2): the candidates taken are the lowest ids.
  {
    SelData sd;
    sd.c = {2, 8, 2, 64, 16, 1600, {10, 2, 32}, 0, 2};
    build_sel_case(sd, 11);
    SelGpu g;
    setup_sel_gpu(sd, g);
    std::vector<std::int32_t> ids, cnt;
    std::vector<std::uint32_t> keys;
    run_gpu_select(g, sd, ws, ids, cnt, keys);
    bool ok = true;
    for (int b = 0; b < 2; ++b)
      for (int h = 0; h < 2; ++h) {
        const int n = sd.indptr[b + 1] - sd.indptr[b];
        const std::int32_t* l = ids.data() + (b * 2 + h) * g.max_per_head;
        // Expected: sinks 0,1; then the lowest candidates; then the window pages.
        const int len = (n - 1) * 16 + sd.last[b];
        const int window = std::min(n - 1, std::max(0, len - 32) / 16);
        std::vector<std::int32_t> want;
        const int kept = 2 >= window ? n : 2 + (n - window);
        const int total = std::min(n, std::max(10, kept));
        for (int j = 0; j < std::min(2, window); ++j) want.push_back(j);
        for (int j = 2; j < 2 + (total - kept); ++j) want.push_back(j);
        for (int j = window; j < n; ++j) want.push_back(j);
        ok &= cnt[b * 2 + h] == static_cast<int>(want.size()) &&
              std::equal(want.begin(), want.end(), l);
      }
    expect(ok, "equal bounds: ties go to the lowest page ids");
  }
  // 2. Budget edges and determinism on a random case.
  {
    SelData sd;
    sd.c = {3, 32, 8, 128, 16, 20000, {64, 1, 64}, 0, 0};
    build_sel_case(sd, 12);
    SelGpu g;
    setup_sel_gpu(sd, g);
    std::vector<std::int32_t> ids, cnt, ids2, cnt2;
    std::vector<std::uint32_t> keys, keys2;
    run_gpu_select(g, sd, ws, ids, cnt, keys);
    bool same = true;
    for (int r = 0; r < 3; ++r) {
      run_gpu_select(g, sd, ws, ids2, cnt2, keys2, r == 1 ? 64 : r == 2 ? 192 : 0);
      same &= ids2 == ids && cnt2 == cnt && keys2 == keys;
    }
    expect(same, "same output bits on reruns and for chunk_pages auto/64/192");
    // The top candidates by key are exactly the non-kept selected pages.
    bool topk_ok = true;
    for (int b = 0; b < 3 && topk_ok; ++b) {
      const int n = sd.indptr[b + 1] - sd.indptr[b];
      const int len = (n - 1) * 16 + sd.last[b];
      const int window = std::min(n - 1, std::max(0, len - 64) / 16);
      for (int h = 0; h < 8 && topk_ok; ++h) {
        const std::uint32_t* k = keys.data() + (b * 8 + h) * static_cast<std::size_t>(sd.max_pages);
        std::vector<std::uint64_t> cand;
        for (int j = 1; j < window; ++j)
          cand.push_back(static_cast<std::uint64_t>(k[j]) << 32 | (0xffffffffu - j));
        std::sort(cand.begin(), cand.end(), std::greater<>());
        const int kept = 1 >= window ? n : 1 + (n - window);
        const int need = std::min(n, std::max(64, kept)) - kept;
        std::vector<std::int32_t> want;
        if (window > 0) want.push_back(0);  // the sink (when it is not a window page)
        const std::size_t first = want.size();
        for (int i = 0; i < need; ++i)
          want.push_back(static_cast<std::int32_t>(0xffffffffu - (cand[i] & 0xffffffffu)));
        std::sort(want.begin() + static_cast<std::ptrdiff_t>(first), want.end());
        for (int j = window; j < n; ++j) want.push_back(j);
        const std::int32_t* l = ids.data() + (b * 8 + h) * static_cast<std::size_t>(g.max_per_head);
        topk_ok = cnt[b * 8 + h] == static_cast<int>(want.size()) &&
                  std::equal(want.begin(), want.end(), l);
      }
    }
    expect(topk_ok, "selected = sink + top keys (full sort reference) + window");
    cuda::QuestSelectArgs a = g.args;
    a.policy.budget_pages = 1 << 20;
    a.max_per_head = 0;
    a.ids = {};
    // budget >= pages: every page.
    {
      const int cap = cuda::select_capacity(sd.max_pages, 16, a.policy);
      DevBuf<std::int32_t> big(static_cast<std::size_t>(3) * 8 * cap);
      a.max_per_head = cap;
      a.ids = {big.p, big.n};
      cuda::SelectLaunch l = select_launch();
      l.workspace = &ws;
      l.max_pages_per_seq = sd.max_pages;
      cuda::quest_select(a, l);
      const auto c2 = g.count.download();
      const auto i2 = big.download();
      bool all = true;
      for (int b = 0; b < 3; ++b)
        for (int h = 0; h < 8; ++h) {
          const int n = sd.indptr[b + 1] - sd.indptr[b];
          all &= c2[b * 8 + h] == n;
          for (int j = 0; j < n; ++j)
            all &= i2[(b * 8 + h) * static_cast<std::size_t>(cap) + j] == j;
        }
      expect(all, "budget >= pages selects every page");
    }
    // Errors: host-side arguments, then bad data through the device flag.
    cuda::SelectLaunch l = select_launch();
    l.workspace = &ws;
    l.max_pages_per_seq = sd.max_pages;
    auto throws = [&](const char* name, const char* argument, const std::function<void()>& f) {
      if (!expect_throw(name, argument, f)) ++failures;
    };
    throws("budget_pages -1", "budget_pages", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.policy.budget_pages = -1;
      cuda::quest_select(b2, l);
    });
    throws("head_dim 96", "head_dim", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.bounds.head_dim = 96;
      cuda::quest_select(b2, l);
    });
    throws("ids span of the wrong size", "ids", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.ids = b2.ids.subspan(1);
      cuda::quest_select(b2, l);
    });
    throws("max_pages_per_seq 0", "max_pages_per_seq", [&] {
      cuda::SelectLaunch l2 = l;
      l2.max_pages_per_seq = 0;
      cuda::quest_select(g.args, l2);
    });
    throws("max_pages_per_seq too small (device flag)", "indptr", [&] {
      cuda::SelectLaunch l2 = l;
      l2.max_pages_per_seq = sd.max_pages - 1;
      cuda::quest_select(g.args, l2);
    });
    throws("max_per_head too small (device flag)", "max_per_head", [&] {
      cuda::QuestSelectArgs b2 = g.args;
      b2.max_per_head = 3;
      b2.ids = b2.ids.subspan(0, static_cast<std::size_t>(3) * 8 * 3);
      cuda::quest_select(b2, l);
    });
    {
      std::vector<std::int32_t> bad = sd.indices;
      bad[7] = sd.pool_pages;
      g.indices.upload(bad);
      throws("physical page id == pool pages (device flag)", "indices",
             [&] { cuda::quest_select(g.args, l); });
      g.indices.upload(sd.indices);
      std::vector<std::int32_t> badp = sd.indptr;
      badp.back() += 1;  // one past indices.size()
      g.indptr.upload(badp);
      throws("indptr past indices.size() (device flag)", "indptr",
             [&] { cuda::quest_select(g.args, l); });
      g.indptr.upload(sd.indptr);
      std::vector<std::int32_t> badl = sd.last;
      badl[1] = 17;
      g.last.upload(badl);
      throws("last_page_len 17 > page 16 (device flag)", "last_page_len",
             [&] { cuda::quest_select(g.args, l); });
      g.last.upload(sd.last);
      std::vector<float> badq = sd.q;
      badq[5] = NAN;
      g.q.upload(badq);
      throws("NaN in q (device flag)", "q", [&] { cuda::quest_select(g.args, l); });
      g.q.upload(sd.q);
    }
    run_gpu_select(g, sd, ws, ids2, cnt2, keys2);
    expect(ids2 == ids && cnt2 == cnt, "clean run after the errors gives the same selection");

    // CUDA graph: capture select on a stream, replay, same result.
    {
      cudaStream_t st;
      CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      cuda::SelectLaunch lg = l;
      lg.stream = st;
      lg.check_errors = false;
      CK(cudaMemsetAsync(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t), st));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      cuda::quest_select(g.args, lg);
      CK(cudaStreamEndCapture(st, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, st));
      ws.check(st);
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
      CK(cudaStreamDestroy(st));
      expect(g.ids.download() == ids && g.count.download() == cnt,
             "CUDA graph replay gives the same selection");
    }
  }
  // 3. End to end: GPU selection -> GPU sparse decode vs the f64 reference on the CPU's
  // selection, with the summaries of the actual keys.
  for (int variant = 0; variant < 2; ++variant) {
    CaseData cd;
    cd.c = variant == 0 ? Case{5000, 4, 128, 3, 16, DType::bf16, kv::Layout::HND}
                        : Case{20000, 8, 64, 2, 16, DType::bf16, kv::Layout::NHD};
    build_case(cd, 77 + variant);
    const Case& c = cd.c;
    const std::size_t per_page = static_cast<std::size_t>(c.num_kv_heads) * c.d;
    std::vector<float> smin(static_cast<std::size_t>(cd.pool_pages) * per_page, 0.f);
    std::vector<float> smax(smin.size(), 0.f);
    int mp = 0;
    for (int b = 0; b < c.batch; ++b) {
      const int n = cd.indptr[b + 1] - cd.indptr[b];
      mp = std::max(mp, n);
      for (int j = 0; j < n; ++j) {
        const int phys = cd.indices[cd.indptr[b] + j];
        const int len = cd.view.table.page_len(b, j, c.page);
        for (int h = 0; h < c.num_kv_heads; ++h)
          for (int x = 0; x < c.d; ++x) {
            float lo = INFINITY, hi = -INFINITY;
            for (int s = 0; s < len; ++s) {
              const float kx = bf16_to_f32(cd.view.key<bf16>(phys, h, s)[x]);
              lo = std::min(lo, kx);
              hi = std::max(hi, kx);
            }
            smin[phys * per_page + h * c.d + x] = lo;
            smax[phys * per_page + h * c.d + x] = hi;
          }
      }
    }
    kv::SummariesView sv;
    sv.min = smin.data();
    sv.max = smax.data();
    sv.num_pages = cd.pool_pages;
    sv.num_kv_heads = c.num_kv_heads;
    sv.head_dim = c.d;
    const select::BoundStore store(sv);
    const select::BoundStoreView hv = store.view();
    const int hq = c.num_kv_heads * c.group;
    select::TopkPolicy pol;
    pol.budget_pages = 24;
    pol.sink_pages = 1;
    pol.window_tokens = 64;
    select::QuestArgs qa;
    qa.q = View3<const float>::contiguous(cd.q.data(), c.batch, hq, c.d);
    qa.table = {cd.indptr, cd.indices, cd.last};
    qa.page_size = c.page;
    qa.bounds_bf16 = &hv;
    qa.policy = pol;
    SelectionStorage cs;
    select::quest_select(qa, cs);
    std::vector<float> dummy(cd.q.size());
    attn::DecodeArgs ra;
    ra.q = qa.q;
    ra.cache = cd.view;
    ra.out = View3<float>::contiguous(dummy.data(), c.batch, hq, c.d);
    const SelectionView csv = cs.view();
    ra.selection = &csv;
    std::vector<double> ref(cd.q.size()), rlse(static_cast<std::size_t>(c.batch) * hq);
    attn::decode_reference(ra, ref, rlse);

    GpuCase gc;
    setup_gpu(cd, gc);
    const std::size_t n = static_cast<std::size_t>(cd.pool_pages) * per_page;
    DevBuf<std::uint16_t> dmn(n), dmx(n);
    dmn.upload(reinterpret_cast<const std::uint16_t*>(hv.min), n);
    dmx.upload(reinterpret_cast<const std::uint16_t*>(hv.max), n);
    const int cap = cuda::select_capacity(mp, c.page, pol);
    DevBuf<std::int32_t> ids(static_cast<std::size_t>(c.batch) * c.num_kv_heads * cap);
    DevBuf<std::int32_t> cnt(static_cast<std::size_t>(c.batch) * c.num_kv_heads);
    cuda::QuestSelectArgs sa;
    sa.q = gc.args.q;
    sa.table = gc.view.table;
    sa.page_size = c.page;
    sa.bounds = hv;
    sa.bounds.min = reinterpret_cast<const bf16*>(dmn.p);
    sa.bounds.max = reinterpret_cast<const bf16*>(dmx.p);
    sa.bounds.wmax = nullptr;
    sa.policy = pol;
    sa.max_per_head = cap;
    sa.ids = {ids.p, ids.n};
    sa.count = {cnt.p, cnt.n};
    cuda::SelectLaunch sl = select_launch();
    sl.workspace = &ws;
    sl.max_pages_per_seq = mp;
    bool same = false;
    Errors e;
    try {
      cuda::quest_select(sa, sl);
      const auto gi = ids.download();
      const auto gn = cnt.download();
      same = gn == cs.count;
      for (int b = 0; same && b < c.batch; ++b)
        for (int h = 0; same && h < c.num_kv_heads; ++h) {
          const auto l = csv.list(b, h);
          same = std::equal(l.begin(), l.end(), gi.begin() + (b * c.num_kv_heads + h) * cap);
        }
      const SelectionView gsv{
          SelectionView::Unit::page, c.batch, c.num_kv_heads, cap, {ids.p, ids.n}, {cnt.p, cnt.n}};
      attn::DecodeArgs da = gc.args;
      da.selection = &gsv;
      cuda::DecodeWorkspace dws;
      cuda::DecodeLaunch dl;
      dl.workspace = &dws;
      dl.max_pages_per_seq = mp;
      e = run_and_compare(gc, da, dl, ref, rlse);
    } catch (const Error& err) {
      e.ok = false;
      e.why = std::string("threw: ") + err.what();
    }
    const bool pass = same && e.ok && e.o <= kTolO && e.lse <= kTolLse;
    std::printf(
        "  end to end %s: GPU select %s CPU select, sparse decode o_err=%.3e "
        "lse_err=%.3e %s %s\n",
        variant == 0 ? "G=4 d=128 HND" : "G=8 d=64 NHD ", same ? "==" : "!=", e.o, e.lse,
        e.why.c_str(), pass ? "ok" : "FAIL");
    if (!pass) ++failures;
  }
  std::printf("SELECT SELFTEST %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures;
}
