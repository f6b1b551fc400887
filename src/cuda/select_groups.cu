// Group summaries (select::GroupStore's bits) rebuilt on the device from the bf16 page store:
// group_update_kernel, run by cuda::update_groups (select.cu).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "group_row.cuh"
#include "select_common.cuh"

namespace masskv::cuda::select_impl {
namespace {

// grid (groups or 1, kv heads, batch), blockDim = head_dim (<= 256): thread c reduces channel
// c over the group's pages (detail::group_row).
__global__ void group_update_kernel(GroupParams p) {
  const int h = blockIdx.y, b = blockIdx.z, c = threadIdx.x;
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int gbegin = p.gindptr[b], gend = p.gindptr[b + 1];
  const int n = end - begin;
  const int ng = (n + p.group_pages - 1) / p.group_pages;
  if (n < 0 || begin < 0 || end > p.nnz || gbegin < 0 || gend > p.gnnz || gend - gbegin != ng) {
    if (c == 0 && blockIdx.x == 0) atomicOr(p.err, kBadIndptr);
    return;
  }
  const int gi = p.last_only ? ng - 1 : static_cast<int>(blockIdx.x);
  if (gi < 0 || gi >= ng) return;
  const int slot = p.gindices[gbegin + gi];
  if (slot < 0 || slot >= p.slots) {
    if (c == 0) atomicOr(p.err, kBadPhysical);
    return;
  }
  std::uint16_t lo_bits, hi_bits;
  if (!detail::group_row(p.indices + begin, gi * p.group_pages, min(n, (gi + 1) * p.group_pages),
                         p.pool_pages, p.num_kv_heads, p.head_dim, h, c, p.mn, p.mx, lo_bits,
                         hi_bits)) {
    if (c == 0) atomicOr(p.err, kBadPhysical);
    return;
  }
  const std::int64_t go = (static_cast<std::int64_t>(slot) * p.num_kv_heads + h) * p.head_dim + c;
  p.gmn[go] = lo_bits;
  p.gmx[go] = hi_bits;
}

}  // namespace

void launch_group_update(const GroupParams& p, dim3 grid, int threads, cudaStream_t stream) {
  group_update_kernel<<<grid, threads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "group update kernel launch");
}

}  // namespace masskv::cuda::select_impl
