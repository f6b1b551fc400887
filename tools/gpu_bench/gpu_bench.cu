// masskv_gpu_bench: checks every CUDA decode kernel against the CPU f64 reference on a grid of
// shapes, then benchmarks dense and sparse decode against a read-only bandwidth kernel.
// Plain printf only: the GPU machine has none of the Debian C++ libraries.
//   masskv_gpu_bench check            grid check: decode, select-selftest, select (exit 1 on any
//                                     failure)
//   masskv_gpu_bench decode-check     the decode part of check alone (softmax and entmax)
//   masskv_gpu_bench profile          a few decode launches of one shape, for ncu
//   masskv_gpu_bench profile-select   Quest scoring, top-k and hierarchical selection alone at
//                                     128K and 1M (plain and graph times)
//   masskv_gpu_bench profile-hier [N] N hierarchical selections per profile-select shape, for ncu
//   masskv_gpu_bench profile-gauss    hierarchical selection with and without Gaussian-tau, for ncu
//   masskv_gpu_bench profile-phases   a sparse step's kernels phase by phase (timer stamps)
//   masskv_gpu_bench select-selftest  GPU Quest selection: ties, edges, errors, graphs, end to end
//   masskv_gpu_bench select-check     GPU Quest selection vs the CPU selector on ~90 shapes
//   masskv_gpu_bench select-compact-check  8-bit and hierarchical GPU selection vs their CPU
//                                     references, bit for bit (also part of check)
//   masskv_gpu_bench bench OUT.json   benchmark (B=1, Hq=32, Hkv=8, d=128, bf16, page 16)
//   masskv_gpu_bench prefill-check    CUDA prefill (dense, block lists, GPU indexer) vs the f64
//                                     reference (also part of check)
//   masskv_gpu_bench prefill-bench OUT.json  prefill at 8K/32K/128K (B=1, Hq=32, Hkv=8, d=128)
//   masskv_gpu_bench append-check     cuda::append vs the CPU cache + bound store, bit for bit
//                                     (also part of check), and its time per step
//   masskv_gpu_bench decode-token-check  decode over token selections vs attn::decode (f64 ref)
//   masskv_gpu_bench two-stage-check  two-stage GPU selection vs select::run_selector, identical
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

#include "append_check.hpp"
#include "extend_check.hpp"
#include "bench_util.cuh"
#include "hier_case.cuh"
#include "masskv/attn/decode.hpp"
#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/decode.hpp"
#include "masskv/cuda/select.hpp"
#include "masskv/error.hpp"
#include "masskv/select/compact_bounds.hpp"
#include "masskv/select/page_bound.hpp"
#include "phases.hpp"
#include "prefill_bench.hpp"
#include "select/kept.hpp"
#include "two_stage_check.hpp"
#include "gpu_bench.hpp"

using namespace masskv;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "check";
  const char* const modes[] = {
      "check",          "decode-check",  "select-selftest", "select-check",
      "select-compact-check", "profile", "profile-select",  "profile-hier [N]",
      "profile-gauss",  "profile-phases", "bench OUT.json", "prefill-check",
      "prefill-bench OUT.json", "append-check", "extend-check", "decode-token-check",
      "two-stage-check", "profile-two-stage"};
  const auto known = [&] {
    for (const std::string_view m : modes)
      if (m.substr(0, m.find(' ')) == mode) return true;
    return false;
  };
  if (!known()) {
    std::fprintf(stderr, "usage: %s", argv[0]);
    for (const char* m : modes) std::fprintf(stderr, "%s %s", m == modes[0] ? "" : " |", m);
    std::fprintf(stderr, "\n");
    return 2;
  }
  try {
    cuda::set_cuda_paths(env_cuda_paths());
    // Which paths the mode runs (include/masskv/cuda/arch.hpp), first in each log.
    std::printf("masskv_gpu_bench %s: %s paths\n", mode.c_str(),
                cuda::hopper_paths() ? "Hopper (sm_90)" : "sm_80");
    if (mode == "check") {
      const int decode_rc = run_check();
      const int selftest = run_select_selftest();
      const int select = run_select_check();
      const int prefill = run_prefill_check();
      const int append = run_append_check();
      const int extend = run_extend_check();
      // Last: the newest kernels (a sticky CUDA error would fail every later section).
      const int compact = run_compact_check();
      const bool bad =
          decode_rc || selftest || select || compact || prefill || append || extend;
      std::printf(
          "ALL CHECKS %s (decode %s, select-selftest %d, select %d, select-compact %d, prefill "
          "%d, append %d, extend_kept %d failure(s))\n",
          bad ? "FAILED" : "PASSED", decode_rc ? "FAILED" : "passed", selftest, select, compact,
          prefill, append, extend);
      return bad ? 1 : 0;
    }
    if (mode == "decode-check") return run_check();
    if (mode == "profile") return run_profile();
    if (mode == "profile-select") return run_profile_select();
    if (mode == "profile-hier") return run_profile_select(argc > 2 ? std::atoi(argv[2]) : 3);
    if (mode == "select-selftest") return run_select_selftest() ? 1 : 0;
    if (mode == "select-check") return run_select_check() ? 1 : 0;
    if (mode == "select-compact-check") return run_compact_check() ? 1 : 0;
    if (mode == "profile-gauss") return run_profile_gauss();
    if (mode == "profile-phases") return run_profile_phases();
    if (mode == "bench") return run_bench(argc > 2 ? argv[2] : "bench_ours.json");
    if (mode == "prefill-check") return run_prefill_check() ? 1 : 0;
    if (mode == "append-check") return run_append_check() ? 1 : 0;
    if (mode == "extend-check") return run_extend_check() ? 1 : 0;
    if (mode == "decode-token-check") return run_decode_token_check() ? 1 : 0;
    if (mode == "two-stage-check") return run_two_stage_check() ? 1 : 0;
    if (mode == "profile-two-stage") return run_profile_two_stage();
    if (mode == "prefill-bench")
      return run_prefill_bench(argc > 2 ? argv[2] : "bench_prefill.json");
  } catch (const Error& e) {
    std::fprintf(stderr, "masskv::Error: %s\n", e.what());
    return 3;
  }
  return 2;  // not reached: every known mode returns above
}
