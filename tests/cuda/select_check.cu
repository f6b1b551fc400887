// masskv_gpu_tests select: GPU Quest selection against the CPU selector (common/sel_case.cuh).
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
#include "sel_case.cuh"
#include "checks.hpp"

using namespace masskv;

int run_select_check() {
  const std::vector<SelCase> cases = select_cases();
  std::printf(
      "select check: %zu cases, GPU quest_select vs CPU select::quest_select "
      "(bounds_bf16 store, same policy)\n",
      cases.size());
  std::printf(
      "tolerance: none where the bounds have the same bits; otherwise only candidate "
      "pages with a bound within eps of the threshold may differ (see sel_case.cuh)\n");
  cuda::SelectWorkspace ws;
  SelStats st;
  const auto t0 = std::chrono::steady_clock::now();
  const int failures = run_cases("select", cases.size(), [&](std::size_t i) {
    SelData sd;
    sd.c = cases[i];
    build_sel_case(sd, 5000 + i);
    const select::BoundStoreView hv = sd.store.view();
    SelectionStorage cpu;
    select::quest_select(cpu_args(sd, hv), cpu);
    SelGpu g;
    setup_sel_gpu(sd, g);
    std::vector<std::int32_t> ids, cnt;
    std::vector<std::uint32_t> keys;
    // Alternate the planned chunk and a small explicit one (many CTAs per sequence).
    run_gpu_select(g, sd, ws, ids, cnt, keys, i % 2 ? 64 : 0);
    return compare_selection(sd, cpu, ids, cnt, g.max_per_head, keys, ws.keys_stride(), st,
                             i % 2 ? "cp64" : "auto");
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "select: %ld lists: %ld identical, %ld near-tie only; bounds bit-identical %ld/%ld "
      "pages (%.4f%%), worst |gpu-cpu| %.3f eps (%.1f s)\n",
      st.lists, st.identical, st.near_tie, st.bit_equal, st.pages,
      st.pages ? 100.0 * st.bit_equal / st.pages : 0.0, st.worst_bound, secs);
  std::printf("SELECT CHECK %s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
  return failures;
}
