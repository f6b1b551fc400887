// The device form of tests/dummy_scorer.cpp's "oldest_first" (a page's rank is minus its index
// in the sequence: oldest first), written to select_score.cuh's scorer contract the way the
// library writes its page bound (src/cuda/select_page_bound.cuh). It stages nothing and reads
// no summary: the scan hands it each page's index. Its own translation unit: the kernels'
// header brings cooperative_groups.h, whose namespace `cuda` the test headers' `using namespace
// masskv` would make ambiguous. scorer_check.cu runs it through the GPU
// hierarchical selection (separate launches, both page scans, the fused kernel) and compares
// the lists with the CPU selector's run of the CPU form.
#include <cstddef>

#include "cuda/select_common.cuh"
#include "cuda/select_hier.cuh"
#include "cuda/select_score.cuh"

namespace oldest_first {

using masskv::cuda::select_impl::SelParams;

struct Device {
  static constexpr int kStages = 1, kStageBytes = 0, kWarpBytes = 0;
  static std::size_t query_bytes(int) { return 0; }
  __device__ __forceinline__ static void begin_query(const SelParams&, unsigned char*, int, int) {}
  __device__ __forceinline__ static void split_query(const SelParams&, unsigned char*) {
    __syncthreads();
  }
  __device__ __forceinline__ static void finish_query(const SelParams&, unsigned char*) {
    __syncthreads();
  }
  __device__ __forceinline__ static void issue_tile(const SelParams&, unsigned char*, int, int,
                                                    int) {}
  __device__ __forceinline__ static float page_rank(const SelParams&, const unsigned char*, const unsigned char*,
                                    int, int page, int, int, bool) {
    return -static_cast<float>(page);  // exact below 2^24 pages
  }
};

}  // namespace oldest_first

// The table entry: the same scorer for groups (a group's index ranks it) and pages.
masskv::cuda::select_impl::HierScorer oldest_first_hier() {
  using namespace masskv::cuda::select_impl;
  const ScanKernels k = scan_kernels<oldest_first::Device>();
  return {k, k, fused_kernel<oldest_first::Device, oldest_first::Device>()};
}
