// masskv_gpu_tests scorer: a scorer added from outside the library reaches the GPU through its
// device form alone (issue 29's scorer contract; docs/design.md §3, "Adding a scorer"). The
// test scorer oldest_first (CPU form tests/dummy_scorer.cpp, registered as the library
// registers its own; device form oldest_first.cu, one table entry) runs through
// select::run_selector (rule top_k of Method::quest) and through the GPU hierarchical
// selection (select_impl::hier_select_with: the separate launches with both page scans, and the
// fused kernel where the device has it). With cover >= 1 the chosen groups hold every page the
// flat rule takes (the oldest groups hold the oldest pages), so every list must equal the CPU's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "checks.hpp"
#include "compact_stores.cuh"
#include "cuda/select_common.cuh"
#include "gpu_util.cuh"
#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/selector.hpp"
#include "sel_case.cuh"
#include "select/scorer.hpp"

namespace masskv::select::detail {
extern const Scorer scorer_oldest_first;  // tests/dummy_scorer.cpp
}  // namespace masskv::select::detail
masskv::cuda::select_impl::HierScorer oldest_first_hier();  // oldest_first.cu

using namespace masskv;

namespace {

// The CPU selector's lists for case sd with scorer oldest_first. The scorer reads no key: the
// cache view's pool is never read (one element stands for it).
SelectionStorage cpu_oldest_first(const SelData& sd) {
  static const bool once = (select::detail::register_scorer(select::detail::scorer_oldest_first), true);
  (void)once;
  const SelCase& c = sd.c;
  static const std::uint16_t pool[1] = {0};
  select::SelectArgs a;
  a.q = View3<const float>::contiguous(sd.q.data(), c.batch, c.hq, c.d);
  a.cache.k = pool;
  a.cache.v = pool;
  a.cache.dtype = DType::bf16;
  a.cache.num_pages = sd.pool_pages;
  a.cache.num_kv_heads = c.hkv;
  a.cache.page_size = c.page;
  a.cache.head_dim = c.d;
  a.cache.set_layout(kv::Layout::HND);
  a.cache.table = {sd.indptr, sd.indices, sd.last};
  a.summaries = summaries_of(sd);  // min and max real; the others unread
  a.summaries.mean = a.summaries.m2 = a.summaries.max_vnorm = sd.smin.data();
  static const std::int32_t count[1] = {0};
  a.summaries.count = count;
  select::SelectorConfig cfg;
  cfg.method = select::Method::quest;  // rule top_k
  cfg.scorer = "oldest_first";
  cfg.sink_pages = c.pol.sink_pages;
  cfg.window_tokens = c.pol.window_tokens;
  cfg.budget.tokens = static_cast<std::int64_t>(c.pol.budget_pages) * c.page;
  select::SelectOutput out;
  select::run_selector(a, cfg, out);
  return std::move(out.selection);
}

}  // namespace

int run_scorer_check() {
  std::vector<SelCase> cases;
  for (const SelCase& c : select_cases_up_to(2e7))
    if (c.pol.budget_pages > 0) cases.push_back(c);  // the CPU's fixed budget needs > 0
  std::printf(
      "scorer check: %zu cases, the test scorer oldest_first through its device form on the GPU "
      "hierarchical path (separate: mask and list scans; fused) vs select::run_selector with its "
      "CPU form; lists must be identical\n",
      cases.size());
  const auto sc = oldest_first_hier();
  cuda::SelectWorkspace ws;
  long lists = 0, fused_served = 0;
  const double covers[] = {1.0, 2.0, 8.0};
  const int failures = run_cases("scorer", cases.size(), [&](std::size_t i) {
    int f = 0;
    SelData sd;
    sd.c = cases[i];
    build_sel_case(sd, 9000 + i);
    const SelCase& c = sd.c;
    const SelectionStorage cpu = cpu_oldest_first(sd);
    const SelectionView want = cpu.view();
    SelGpu g;
    setup_sel_gpu(sd, g);
    const kv::PageTable table{sd.indptr, sd.indices, sd.last};
    const select::BoundStoreView hv = sd.store.view();
    const select::GroupStore groups(hv, table, 16);
    const GroupGpu gg = upload_groups(groups);
    const cuda::HierSelectArgs h = hier_args(g.args, gg, covers[i % 3]);
    using L = cuda::SelectLaunch;
    struct Variant {
      const char* name;
      L::HierScan scan;
      L::HierKernel kernel;
    };
    const Variant variants[] = {{"mask", L::HierScan::mask, L::HierKernel::separate},
                                {"list", L::HierScan::list, L::HierKernel::separate},
                                {"fused", L::HierScan::automatic, L::HierKernel::fused}};
    for (const Variant& v : variants) {
      if (v.kernel == L::HierKernel::fused && !cuda::hopper_paths()) continue;
      cuda::SelectLaunch l = select_launch();
      l.workspace = &ws;
      l.max_pages_per_seq = sd.max_pages;
      l.hier_scan = v.scan;
      l.hier_kernel = v.kernel;
      CK(cudaMemset(g.ids.p, 0x7f, g.ids.n * sizeof(std::int32_t)));
      CK(cudaMemset(g.count.p, 0xff, g.count.n * sizeof(std::int32_t)));  // -1 unless written
      cuda::select_impl::hier_select_with(h, l, sc);
      CK(cudaDeviceSynchronize());
      fused_served += ws.last_hier_fused();
      const std::vector<std::int32_t> ids = g.ids.download(), cnt = g.count.download();
      for (int b = 0; b < c.batch; ++b) {
        for (int hh = 0; hh < c.hkv; ++hh) {
          const std::size_t slot = static_cast<std::size_t>(b) * c.hkv + hh;
          const auto w = want.list(b, hh);
          const int n = std::clamp(cnt[slot], 0, g.max_per_head);  // a bad count fails below
          std::vector<std::int32_t> got(ids.begin() + slot * g.max_per_head,
                                        ids.begin() + slot * g.max_per_head + n);
          if (n != cnt[slot]) got.push_back(cnt[slot]);
          ++lists;
          if (got != std::vector<std::int32_t>(w.begin(), w.end())) {
            if (f < 3)
              std::printf("FAIL scorer %s case %zu b %d h %d: %zu pages, CPU %zu\n", v.name, i, b,
                          hh, got.size(), w.size());
            ++f;
          }
        }
      }
    }
    return f;
  });
  std::printf("scorer check: %ld lists compared, the fused kernel served %ld calls; %s\n", lists,
              fused_served, failures == 0 ? "all identical" : "FAILED");
  return failures;
}
