// Synthetic KV caches for the attention benchmarks (bench_attn.cpp, bench_dist.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "masskv/kv/cache.hpp"
#include "progress.hpp"

namespace masskv::cli {

// Fills `cache` with `seqs` sequences of `length` tokens of random keys/values. Keys get a
// per-channel scale and offset so page bounds differ between pages, as real keys do.
std::vector<kv::SeqId> fill_cache(kv::PagedKVCache& cache, int seqs, std::int64_t length,
                                  std::uint64_t seed, Progress& progress);

}  // namespace masskv::cli
