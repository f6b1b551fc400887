// select::extend_kept on the GPU (extend_kept.cuh). One CTA per (sequence, kv head). The
// output is [0, s) ∪ (old ∩ [s, w)) ∪ [w, n) (extend_kept_math.hpp); the run old ∩ [s, w) is
// found by counting the old items below s and below w (no dependent search), and every output
// slot is then computed independently.
#include "device.cuh"
#include "extend_kept.cuh"
#include "extend_kept_math.hpp"

namespace masskv::cuda::detail {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) extend_kept_kernel(ExtendParams p) {
  const int b = blockIdx.y, h = blockIdx.x;
  const std::size_t pair = static_cast<std::size_t>(b) * p.num_kv_heads + h;
  const std::int32_t* in = p.ids_in + pair * p.max_in;
  std::int32_t* out = p.ids + pair * p.max_per_head;
  __shared__ int s_below_s, s_below_w, s_bad;
  if (threadIdx.x == 0) {
    s_below_s = 0;
    s_below_w = 0;
    s_bad = 0;
  }
  __syncthreads();

  // The sequence's shape (every thread reads the same few words).
  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int n = end - begin;
  unsigned bad = 0;
  if (begin < 0 || end < begin || end > p.nnz || n > p.max_pages) bad |= p.bad_indptr;
  const int last = n > 0 ? p.last_page_len[b] : 1;
  if (last < 1 || last > p.page_size) bad |= p.bad_last_len;
  const int count_in = p.count_in[pair];
  if (count_in < 0 || count_in > p.max_in) bad |= p.bad_selection;
  const KeptRange r = bad == 0 ? kept_range(n, last, p.page_size, p.sink_pages, p.window_tokens)
                                : KeptRange{};
  const int s = r.s, w = r.w;

  // Items below s and below w, and whether the old list is an ascending list of this
  // sequence's pages.
  int below_s = 0, below_w = 0;
  if (bad == 0) {
    for (int i = threadIdx.x; i < count_in; i += kThreads) {
      const int id = in[i];
      if (id < 0 || id >= n || (i + 1 < count_in && in[i + 1] <= id)) bad |= p.bad_selection;
      below_s += id < s;
      below_w += id < w;
    }
  }
  below_s = __reduce_add_sync(0xffffffffu, below_s);
  below_w = __reduce_add_sync(0xffffffffu, below_w);
  if ((threadIdx.x & 31) == 0) {
    atomicAdd(&s_below_s, below_s);
    atomicAdd(&s_below_w, below_w);
  }
  if (bad != 0) atomicOr(&s_bad, 1);
  if (bad != 0) atomicOr(p.err, bad);
  __syncthreads();

  const int mid = s_below_w - s_below_s;  // old items in [s, w)
  int total = s + mid + (n - w);
  if (s_bad == 0 && total > p.max_per_head) {
    if (threadIdx.x == 0) atomicOr(p.err, p.bad_capacity);
    total = -1;
  }
  if (s_bad != 0) total = -1;  // the pair's list is left empty
  for (int i = threadIdx.x; i < p.max_per_head; i += kThreads) {
    int id = -1;
    if (i < total) id = extended_item(i, r, mid, s_below_s, in);
    out[i] = id;
  }
  if (threadIdx.x == 0) p.count[pair] = total < 0 ? 0 : total;
}

}  // namespace

void launch_extend_kept(const ExtendParams& p, int batch, cudaStream_t stream) {
  extend_kept_kernel<<<dim3(p.num_kv_heads, batch), kThreads, 0, stream>>>(p);
  check_cuda(cudaGetLastError(), "extend_kept kernel launch");
}

}  // namespace masskv::cuda::detail
