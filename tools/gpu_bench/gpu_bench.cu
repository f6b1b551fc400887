// masskv_gpu_bench: the GPU benchmarks and profiles (the correctness checks are
// tests/cuda, masskv_gpu_tests). Plain printf only: the GPU machine has none of the Debian C++
// libraries. The tuning switches of env_select_launch / env_prefill_launch (gpu_util.cuh) set
// every mode's launches.
//   masskv_gpu_bench bench OUT.json   benchmark (B=1, Hq=32, Hkv=8, d=128, bf16, page 16)
//   masskv_gpu_bench prefill-bench OUT.json  prefill at 8K/32K/128K (B=1, Hq=32, Hkv=8, d=128)
//   masskv_gpu_bench profile          a few decode launches of one shape, for ncu
//   masskv_gpu_bench profile-select   Quest scoring, top-k and hierarchical selection alone at
//                                     128K and 1M (plain and graph times)
//   masskv_gpu_bench profile-hier [N] N hierarchical selections per profile-select shape, for ncu
//   masskv_gpu_bench profile-gauss    hierarchical selection with and without Gaussian-tau, for ncu
//   masskv_gpu_bench profile-phases   a sparse step's kernels phase by phase (timer stamps)
//   masskv_gpu_bench profile-two-stage  token_codes' select at the bench's shape, one and two
//                                     passes
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "gpu_bench.hpp"
#include "gpu_util.cuh"
#include "masskv/cuda/arch.hpp"
#include "masskv/error.hpp"
#include "phases.hpp"
#include "prefill_bench.hpp"
#include "two_stage_bench.hpp"

using namespace masskv;

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  const char* const modes[] = {"bench OUT.json",  "prefill-bench OUT.json", "profile",
                               "profile-select",  "profile-hier [N]",       "profile-gauss",
                               "profile-phases",  "profile-two-stage"};
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
    select_launch() = env_select_launch();
    prefill_launch() = env_prefill_launch();
    // Which paths the mode runs (include/masskv/cuda/arch.hpp), first in each log.
    std::printf("masskv_gpu_bench %s: %s paths\n", mode.c_str(),
                cuda::hopper_paths() ? "Hopper (sm_90)" : "sm_80");
    if (mode == "profile") return run_profile();
    if (mode == "profile-select") return run_profile_select();
    if (mode == "profile-hier") return run_profile_select(argc > 2 ? std::atoi(argv[2]) : 3);
    if (mode == "profile-gauss") return run_profile_gauss();
    if (mode == "profile-phases") return run_profile_phases();
    if (mode == "bench") return run_bench(argc > 2 ? argv[2] : "bench_ours.json");
    if (mode == "profile-two-stage") return run_profile_two_stage();
    if (mode == "prefill-bench")
      return run_prefill_bench(argc > 2 ? argv[2] : "bench_prefill.json");
  } catch (const Error& e) {
    std::fprintf(stderr, "masskv::Error: %s\n", e.what());
    return 3;
  }
  return 2;  // not reached: every known mode returns above
}
