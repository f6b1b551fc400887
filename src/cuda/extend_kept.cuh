// A selection made at an earlier decode step brought up to the current lengths on the GPU
// (cuda::extend_kept, select::extend_kept's lists): for SessionOptions::reselect_every, the
// steps between two selections run this one small kernel instead of the selection chain.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace masskv::cuda::detail {

struct ExtendParams {
  const std::int32_t *indptr, *last_page_len;  // the device page table
  int nnz, page_size, max_pages;               // indices' size; max_pages_per_seq
  int num_kv_heads, sink_pages, window_tokens;
  const std::int32_t *ids_in, *count_in;  // the earlier selection [B][Hkv][max_in], [B][Hkv]
  int max_in;
  std::int32_t *ids, *count;  // the extended one [B][Hkv][max_per_head], [B][Hkv]
  int max_per_head;
  unsigned* err;
  unsigned bad_indptr, bad_last_len, bad_capacity, bad_selection;  // the caller's error bits
};

void launch_extend_kept(const ExtendParams& p, int batch, cudaStream_t stream);

}  // namespace masskv::cuda::detail
