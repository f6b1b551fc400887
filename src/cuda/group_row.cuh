// One channel of a group's row in the group store of hierarchical selection (select::GroupStore:
// the min / max over the group's pages of the bf16 bound store). Shared by update_groups'
// kernel (select_groups.cu) and the append kernel's refresh of each sequence's last group
// (append.cu), so both write the bits the CPU's GroupStore has.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace masskv::cuda::detail {

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t x) {
  return __uint_as_float(static_cast<unsigned>(x) << 16);
}

// Channel c of kv head h over the pages pages[j0, j1) of a page store mn / mx ([page][head][d]
// bf16 bits, pool_pages pages): lo / hi as std::min / std::max fold them (the first of equal
// values stays: -0 vs +0 as the CPU). Min and max of bf16 values are bf16 values: the bits are
// copied. Returns false at a page id outside [0, pool_pages) (lo / hi not to be written).
__device__ __forceinline__ bool group_row(const std::int32_t* pages, int j0, int j1,
                                          int pool_pages, int num_kv_heads, int head_dim, int h,
                                          int c, const std::uint16_t* mn, const std::uint16_t* mx,
                                          std::uint16_t& lo_bits, std::uint16_t& hi_bits) {
  float lo = INFINITY, hi = -INFINITY;
  lo_bits = 0x7f80u;  // +inf
  hi_bits = 0xff80u;  // -inf
  for (int j = j0; j < j1; ++j) {
    const int phys = pages[j];
    if (phys < 0 || phys >= pool_pages) return false;
    const std::int64_t o = (static_cast<std::int64_t>(phys) * num_kv_heads + h) * head_dim + c;
    const std::uint16_t a = mn[o], z = mx[o];
    const float fa = bf16_bits_to_float(a), fz = bf16_bits_to_float(z);
    if (fa < lo) {
      lo = fa;
      lo_bits = a;
    }
    if (hi < fz) {
      hi = fz;
      hi_bits = z;
    }
  }
  return true;
}

}  // namespace masskv::cuda::detail
