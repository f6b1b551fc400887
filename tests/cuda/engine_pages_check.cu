// masskv_gpu_tests engine-pages: cuda::engine_pages against kv::engine_pages, entry for entry
// (padded lists, counts, CSR indptr / indices / last_page_len), on random selections of random
// page tables (common/engine_case.hpp: shuffled physical pages, page sizes 1 and 16, up to 20000
// pages a sequence so the union's bitmap spans many words), per kv head and head union, with and
// without the CSR form; replayed from a CUDA graph; a bad list flags "selection" and is left
// empty while the others stay right, a list too long flags "max_per_list".
#include <cuda_runtime.h>

#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "checks.hpp"
#include "engine_case.hpp"
#include "gpu_util.cuh"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/engine_pages.hpp"

using namespace masskv;

namespace {

struct HostOut {
  std::vector<std::int32_t> ids, count, indptr, indices, last;
};

// The device side of one case and its outputs (poisoned before each run).
struct GpuCase {
  DevBuf<std::int32_t> indptr, indices, last, sel_ids, sel_count;
  DevBuf<std::int32_t> ids, count, csr_indptr, csr_indices, csr_last;
  int lists = 0, max_per_list = 0;

  GpuCase(const test::EngineData& d, int lists_, int max_per_list_)
      : indptr(to_device(d.table.indptr)), indices(to_device(d.table.indices)),
        last(to_device(d.table.last_page_len)), sel_ids(to_device(d.selection.ids)),
        sel_count(to_device(d.selection.count)),
        ids(static_cast<std::size_t>(lists_) * max_per_list_), count(lists_),
        csr_indptr(lists_ + 1), csr_indices(static_cast<std::size_t>(lists_) * max_per_list_),
        csr_last(lists_), lists(lists_), max_per_list(max_per_list_) {}

  void poison() {
    for (DevBuf<std::int32_t>* b : {&ids, &count, &csr_indptr, &csr_indices, &csr_last})
      CK(cudaMemset(b->p, 0x5a, std::max<std::size_t>(b->n, 1) * sizeof(std::int32_t)));
  }
  cuda::EnginePagesArgs args(const test::EngineData& d, int page_size, kv::EngineLists mode,
                             bool csr) const {
    cuda::EnginePagesArgs a;
    a.selection = {SelectionView::Unit::page, d.selection.batch, d.selection.num_kv_heads,
                   d.selection.max_per_head, {sel_ids.p, sel_ids.n}, {sel_count.p, sel_count.n}};
    a.table = {{indptr.p, indptr.n}, {indices.p, indices.n}, {last.p, last.n}};
    a.page_size = page_size;
    a.lists = mode;
    a.out.max_per_list = max_per_list;
    a.out.ids = {ids.p, ids.n};
    a.out.count = {count.p, count.n};
    if (csr) {
      a.out.indptr = {csr_indptr.p, csr_indptr.n};
      a.out.indices = {csr_indices.p, csr_indices.n};
      a.out.last_page_len = {csr_last.p, csr_last.n};
    }
    return a;
  }
  HostOut download(bool csr) const {
    HostOut h{ids.download(), count.download(), {}, {}, {}};
    if (csr) {
      h.indptr = csr_indptr.download();
      h.indices = csr_indices.download();
      h.last = csr_last.download();
    }
    return h;
  }
};

// The CPU's arrays for the same case.
HostOut cpu_out(const test::EngineData& d, int page_size, kv::EngineLists mode, bool csr,
                int lists, int max_per_list) {
  HostOut h;
  h.ids.assign(static_cast<std::size_t>(lists) * max_per_list, 0);
  h.count.assign(lists, 0);
  kv::EnginePagesOut o;
  o.max_per_list = max_per_list;
  o.ids = h.ids;
  o.count = h.count;
  if (csr) {
    h.indptr.assign(lists + 1, 0);
    h.indices.assign(h.ids.size(), 0);
    h.last.assign(lists, 0);
    o.indptr = h.indptr;
    o.indices = h.indices;
    o.last_page_len = h.last;
  }
  kv::engine_pages(d.selection.view(), d.table.table(), page_size, mode, o);
  return h;
}

bool same(const HostOut& a, const HostOut& b) {
  return a.ids == b.ids && a.count == b.count && a.indptr == b.indptr &&
         a.indices == b.indices && a.last == b.last;
}

int max_pages_of(const test::EngineData& d) {
  int m = 1;
  for (int b = 0; b < d.selection.batch; ++b)
    m = std::max(m, d.table.indptr[b + 1] - d.table.indptr[b]);
  return m;
}

}  // namespace

int run_engine_pages_check() {
  int failures = 0, cases = 0;
  std::mt19937_64 rng(31);
  cuda::SelectWorkspace ws;
  const test::EngineCase grid[] = {
      {1, 1, 16, 8, 0.3},   {3, 2, 16, 40, 0.1},    {7, 8, 16, 300, 0.05},
      {2, 4, 1, 20000, 0.01}, {16, 8, 16, 2000, 0.02}, {5, 3, 1, 64, 0.9},
      {4, 1, 16, 1, 0.0},   {2, 8, 16, 5000, 0.0},
  };
  for (const test::EngineCase& c : grid)
    for (const kv::EngineLists mode : {kv::EngineLists::per_kv_head, kv::EngineLists::head_union})
      for (const bool csr : {false, true}) {
        const test::EngineData d = test::make_engine_data(c, rng, /*empty_sequences=*/true);
        const int L = kv::engine_list_count(mode, c.batch, c.kv_heads);
        const int cap = c.max_pages + 3;
        GpuCase g(d, L, cap);
        g.poison();
        cuda::SelectLaunch l;
        l.workspace = &ws;
        l.max_pages_per_seq = max_pages_of(d);
        cuda::engine_pages(g.args(d, c.page_size, mode, csr), l);
        const HostOut want = cpu_out(d, c.page_size, mode, csr, L, cap);
        ++cases;
        if (!same(g.download(csr), want)) {
          ++failures;
          std::printf("FAIL engine-pages B=%d Hkv=%d page=%d pages<=%d density=%g %s%s\n",
                      c.batch, c.kv_heads, c.page_size, c.max_pages, c.density,
                      mode == kv::EngineLists::head_union ? "head_union" : "per_kv_head",
                      csr ? " +csr" : "");
        }
        // Replayed from a CUDA graph (no host sync inside: the flag is read after).
        g.poison();
        cudaStream_t st;
        CK(cudaStreamCreate(&st));
        l.stream = st;
        l.check_errors = false;
        cudaGraph_t graph;
        cudaGraphExec_t exec;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        cuda::engine_pages(g.args(d, c.page_size, mode, csr), l);
        CK(cudaStreamEndCapture(st, &graph));
        CK(cudaGraphInstantiate(&exec, graph, 0));
        CK(cudaGraphLaunch(exec, st));
        CK(cudaStreamSynchronize(st));
        ws.check(st);
        if (!same(g.download(csr), want)) {
          ++failures;
          std::printf("FAIL engine-pages (graph replay) B=%d Hkv=%d page=%d %s\n", c.batch,
                      c.kv_heads, c.page_size,
                      mode == kv::EngineLists::head_union ? "head_union" : "per_kv_head");
        }
        CK(cudaGraphExecDestroy(exec));
        CK(cudaGraphDestroy(graph));
        CK(cudaStreamDestroy(st));
      }

  // Bad input: sequence 1's first kv head's list made descending, and lists too short.
  const auto expect_flag = [&](const char* what, const char* argument, auto&& run) {
    try {
      run();
      ++failures;
      std::printf("FAIL engine-pages %s: no error\n", what);
    } catch (const Error& e) {
      if (e.argument() != argument) {
        ++failures;
        std::printf("FAIL engine-pages %s: error names %s, not %s\n", what,
                    std::string(e.argument()).c_str(), argument);
      }
    }
  };
  {
    test::EngineData d = test::make_engine_data({3, 2, 16, 30, 0.5}, rng);
    const int L = 3 * 2;
    GpuCase good(d, L, 33);
    cuda::SelectLaunch l;
    l.workspace = &ws;
    l.max_pages_per_seq = max_pages_of(d);
    const HostOut want = cpu_out(d, 16, kv::EngineLists::per_kv_head, true, L, 33);
    test::EngineData bad = d;
    const std::size_t list = static_cast<std::size_t>(1) * 2 + 0;
    bad.selection.count[list] = 2;
    bad.selection.ids[list * bad.selection.max_per_head] = 5;
    bad.selection.ids[list * bad.selection.max_per_head + 1] = 4;
    GpuCase g(bad, L, 33);
    expect_flag("descending list", "selection", [&] {
      cuda::engine_pages(g.args(bad, 16, kv::EngineLists::per_kv_head, true), l);
    });
    // The other lists are right; the bad one is empty.
    const HostOut got = g.download(true);
    for (int i = 0; i < L; ++i) {
      const bool is_bad = static_cast<std::size_t>(i) == list;
      const int want_count = is_bad ? 0 : want.count[i];
      bool ok = got.count[i] == want_count;
      for (int s = 0; s < 33 && ok && !is_bad; ++s)
        ok = got.ids[static_cast<std::size_t>(i) * 33 + s] == want.ids[static_cast<std::size_t>(i) * 33 + s];
      if (!ok) {
        ++failures;
        std::printf("FAIL engine-pages: list %d after a bad list elsewhere\n", i);
      }
    }
    GpuCase shortlists(d, 3, 1);
    expect_flag("lists too short", "max_per_list", [&] {
      cuda::engine_pages(shortlists.args(d, 16, kv::EngineLists::head_union, true), l);
    });
    expect_flag("no workspace", "workspace", [&] {
      cuda::SelectLaunch none;
      none.max_pages_per_seq = 30;
      cuda::engine_pages(good.args(d, 16, kv::EngineLists::per_kv_head, true), none);
    });
    expect_flag("wrong output size", "ids", [&] {
      cuda::engine_pages(good.args(d, 16, kv::EngineLists::head_union, true), l);
    });
  }
  std::printf("engine-pages check %s: %d failure(s), %d cases (each also from a CUDA graph)\n",
              failures ? "FAILED" : "passed", failures, cases);
  return failures;
}
