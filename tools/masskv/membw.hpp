// A STREAM-like read-bandwidth probe, run in the same process as the kernels it is compared
// with, so ratios are measured side by side.
#pragma once

#include <cstddef>

namespace masskv::cli {

struct ReadBandwidth {
  double gb_per_s = 0;  // 1e9 bytes / s, median over repetitions
  std::size_t bytes = 0;
};

// Reads a buffer of `bytes` (allocated and filled once, reused across calls) with `threads`
// OpenMP threads, each summing its contiguous share with independent integer accumulators
// (integer sums vectorise without -ffast-math). Median of `reps` passes.
ReadBandwidth measure_read_bandwidth(std::size_t bytes, int threads, int reps);

}  // namespace masskv::cli
