// Phase time stamps of a decode step's kernels, for profiling where a short step's time goes
// (masskv_gpu_bench profile-phases). At B = 1 a sparse step is latency-bound: a few µs of
// launches, dependent memory round trips and barriers per kernel, which per-kernel durations
// (ncu) do not show in the order they happen. With SelectLaunch::phase_stamps or
// DecodeLaunch::phase_stamps set, thread 0 of every CTA (the first kCtas of a grid) writes the
// device's %globaltimer (ns) at each phase of its kernel into a device array of kEntries
// uint64; the caller zeroes it before the step (0: not reached). Null (the default): nothing
// is written, one uniform branch per phase.
#pragma once

#include <cstddef>
#include <cstdint>

namespace masskv::cuda::stamps {

// Which kernel a stamp belongs to. The selection's scoring and top-k kernels stamp as the
// level they serve (hier_select's groups, or pages for it and quest_select).
enum Kernel : int {
  hier_fused = 0,  // hier_select in one kernel
  group_score,
  group_topk,
  page_score,
  page_topk,
  decode_chunks,  // softmax split-K chunk kernel on the tensor cores (decode_mma.cu)
  decode_merge,
  kKernels
};

// Phases: 0 = entry and kExit = exit of the kernel; in between (where the kernel has them):
//  hier_fused: 1 group tiles scored, 2 after the first cluster barrier, 3 group list ranked,
//    4 chosen pages scored, 5 after the second cluster barrier;
//  group_score, page_score (also their code inside hier_fused): 1 q staged, 2 q norms done,
//    3 warp 0's first tile landed, 4 its keys written;
//  decode_chunks, decode_merge, and the PDL-launched top-k kernels: 1 after the wait for the
//    predecessor grid; decode_chunks: 2 page list and q staged, 3 tiles streamed;
//  page_topk (hier_select's, also inside hier_fused): 2 candidates gathered, 3 radix done.
constexpr int kCtas = 4096, kPhases = 8, kExit = kPhases - 1;
constexpr std::size_t kEntries = std::size_t{kKernels} * kCtas * kPhases;

constexpr std::size_t index(int kernel, int cta, int phase) {
  return (static_cast<std::size_t>(kernel) * kCtas + static_cast<std::size_t>(cta)) * kPhases +
         static_cast<std::size_t>(phase);
}

}  // namespace masskv::cuda::stamps
