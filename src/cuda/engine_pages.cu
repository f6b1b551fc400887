// cuda::engine_pages (masskv/cuda/select.hpp): a page selection mapped through the engine's page
// table into physical ids, per (sequence, kv head) or per sequence, padded and as a FlashInfer
// page table; kv::engine_pages (src/kv/engine_pages.cpp) is the reference, entry for entry.
// Two kernels: lists_kernel, a CTA per output list (a head union is a bit per page of the
// sequence in shared memory, then an ordered compaction), and csr_kernel, a CTA per list that
// finds its offset by summing the counts before it (lists are few: batch x kv heads) and copies.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "block_select.cuh"
#include "select_common.cuh"

namespace masskv::cuda {
namespace {

using namespace select_impl;

constexpr int kThreads = 256;

struct EngineParams {
  const std::int32_t *sel_ids, *sel_count;
  int num_kv_heads, max_per_head;
  const std::int32_t *indptr, *indices, *last_page_len;
  int nnz, page_size, max_pages;
  std::int32_t *ids, *count;
  int max_per_list, lists;
  bool head_union;
  std::int32_t *csr_indptr, *csr_indices, *csr_last;  // null: no CSR form
  unsigned* err;
};

// One output list: validates its sequence and its kv heads' lists (a bad one is flagged and the
// list left empty), maps logical to physical ids, pads with -1.
__global__ void __launch_bounds__(kThreads) lists_kernel(EngineParams p) {
  extern __shared__ unsigned s_bits[];  // head_union: a bit per page of the sequence
  __shared__ int s_warp[kThreads / 32];
  __shared__ unsigned s_bad;
  const int l = blockIdx.x;
  const int b = p.head_union ? l : l / p.num_kv_heads;
  const int h0 = p.head_union ? 0 : l % p.num_kv_heads;
  const int h1 = p.head_union ? p.num_kv_heads : h0 + 1;
  if (threadIdx.x == 0) s_bad = 0;

  const int begin = p.indptr[b], end = p.indptr[b + 1];
  const int n = end - begin;
  unsigned bad = 0;
  if (begin < 0 || end < begin || end > p.nnz || n > p.max_pages) bad |= kBadIndptr;
  const int last = bad == 0 && n > 0 ? p.last_page_len[b] : 1;
  if (last < 1 || last > p.page_size) bad |= kBadLastLen;
  const int words = bad == 0 ? (n + 31) / 32 : 0;
  if (p.head_union)
    for (int w = threadIdx.x; w < words; w += kThreads) s_bits[w] = 0;
  __syncthreads();

  // Validate every list of the output list's kv heads; a union marks their pages.
  for (int h = h0; h < h1 && bad == 0; ++h) {
    const std::size_t pair = static_cast<std::size_t>(b) * p.num_kv_heads + h;
    const int c = p.sel_count[pair];
    if (c < 0 || c > p.max_per_head) {
      bad |= kBadSelection;
      break;
    }
    if (!p.head_union && c > p.max_per_list) bad |= kBadListCapacity;
    const std::int32_t* in = p.sel_ids + pair * p.max_per_head;
    for (int i = threadIdx.x; i < c; i += kThreads) {
      const int id = in[i];
      if (id < 0 || id >= n || (i + 1 < c && in[i + 1] <= id)) {
        bad |= kBadSelection;
      } else if (p.head_union) {
        atomicOr(&s_bits[id >> 5], 1u << (id & 31));
      }
    }
  }
  if (bad != 0) atomicOr(&s_bad, bad);
  __syncthreads();
  bad = s_bad;

  std::int32_t* out = p.ids + static_cast<std::size_t>(l) * p.max_per_list;
  const std::int32_t* phys = p.indices + (bad == 0 ? begin : 0);
  int count = 0, last_id = -1;
  if (bad == 0 && !p.head_union) {
    const std::int32_t* in = p.sel_ids + (static_cast<std::size_t>(b) * p.num_kv_heads + h0) *
                                             p.max_per_head;
    count = p.sel_count[static_cast<std::size_t>(b) * p.num_kv_heads + h0];
    for (int i = threadIdx.x; i < count; i += kThreads) out[i] = phys[in[i]];
    if (count > 0) last_id = in[count - 1];
  } else if (bad == 0) {
    const auto keep = [&](int i) { return (s_bits[i >> 5] >> (i & 31)) & 1u; };
    count = block_select::ordered_compact<kThreads>(n, s_warp, keep, [&](int i, int r) {
      if (r < p.max_per_list) out[r] = phys[i];
    });
    if (count > p.max_per_list) {
      bad = kBadListCapacity;
    } else if (count > 0 && keep(n - 1)) {
      last_id = n - 1;  // the list ends with the sequence's last page (the selectors keep it)
    }
  }
  if (bad != 0) {
    count = 0;
    if (threadIdx.x == 0) atomicOr(p.err, bad);
  }
  for (int i = count + threadIdx.x; i < p.max_per_list; i += kThreads) out[i] = -1;
  if (threadIdx.x == 0) {
    p.count[l] = count;
    if (p.csr_last != nullptr)
      p.csr_last[l] = count == 0 ? 0 : last_id == n - 1 ? last : p.page_size;
  }
}

// The CSR form: list l's offset is the sum of the counts before it; its entries are copied
// there, and the entries past every list's are -1.
__global__ void __launch_bounds__(kThreads) csr_kernel(EngineParams p) {
  __shared__ int s_warp[kThreads / 32];
  const int l = blockIdx.x;
  int before = 0, all = 0;
  for (int j = threadIdx.x; j < p.lists; j += kThreads) {
    const int c = p.count[j];
    all += c;
    if (j < l) before += c;
  }
  int total = 0, offset = 0;
  block_select::exclusive_scan<kThreads>(all, s_warp, total);
  block_select::exclusive_scan<kThreads>(before, s_warp, offset);
  const int c = p.count[l];
  if (threadIdx.x == 0) {
    p.csr_indptr[l] = offset;
    if (l + 1 == p.lists) p.csr_indptr[p.lists] = offset + c;
  }
  const std::int32_t* in = p.ids + static_cast<std::size_t>(l) * p.max_per_list;
  for (int i = threadIdx.x; i < c; i += kThreads) p.csr_indices[offset + i] = in[i];
  const std::int64_t cap = static_cast<std::int64_t>(p.lists) * p.max_per_list;
  for (std::int64_t i = total + static_cast<std::int64_t>(l) * kThreads + threadIdx.x; i < cap;
       i += static_cast<std::int64_t>(p.lists) * kThreads)
    p.csr_indices[i] = -1;
}

}  // namespace

void engine_pages(const EnginePagesArgs& a, const SelectLaunch& launch) {
  using enum ErrorCode;
  require(launch.workspace != nullptr, invalid_argument, "workspace", "is required");
  require(!a.table.indptr.empty(), shape_mismatch, "indptr", "needs batch + 1 entries");
  const int B = static_cast<int>(a.table.indptr.size()) - 1;
  kv::check_engine_pages_shape(a.selection, B, a.page_size, a.lists, a.out);
  require(a.table.last_page_len.size() == static_cast<std::size_t>(B), shape_mismatch,
          "last_page_len", "needs one entry per sequence");
  require(launch.max_pages_per_seq > 0, invalid_argument, "max_pages_per_seq",
          "the host's bound on pages per sequence is required");
  const int L = kv::engine_list_count(a.lists, B, a.selection.num_kv_heads);
  if (L == 0) return;
  const bool head_union = a.lists == kv::EngineLists::head_union;
  const std::size_t smem =
      head_union ? (static_cast<std::size_t>(launch.max_pages_per_seq) + 31) / 32 * 4 : 0;
  // The union's bitmap: raise the kernel's limit once to the largest the device allows.
  static const std::size_t room = [] {
    const std::size_t r = detail::dynamic_smem_room(lists_kernel);
    detail::set_dynamic_smem(lists_kernel, r, "engine_pages");
    return r;
  }();
  require(smem <= room, unsupported, "max_pages_per_seq", "a head union of ",
          launch.max_pages_per_seq, " pages needs ", smem, " bytes of shared memory, over the ",
          room, " a block may use");
  EngineParams p{};
  p.sel_ids = a.selection.ids.data();
  p.sel_count = a.selection.count.data();
  p.num_kv_heads = a.selection.num_kv_heads;
  p.max_per_head = a.selection.max_per_head;
  p.indptr = a.table.indptr.data();
  p.indices = a.table.indices.data();
  p.last_page_len = a.table.last_page_len.data();
  p.nnz = static_cast<int>(a.table.indices.size());
  p.page_size = a.page_size;
  p.max_pages = launch.max_pages_per_seq;
  p.ids = a.out.ids.data();
  p.count = a.out.count.data();
  p.max_per_list = a.out.max_per_list;
  p.lists = L;
  p.head_union = head_union;
  const bool csr = !a.out.indptr.empty();
  p.csr_indptr = csr ? a.out.indptr.data() : nullptr;
  p.csr_indices = csr ? a.out.indices.data() : nullptr;
  p.csr_last = csr ? a.out.last_page_len.data() : nullptr;
  p.err = launch.workspace->impl().err.get();
  lists_kernel<<<L, kThreads, smem, launch.stream>>>(p);
  detail::check_cuda(cudaGetLastError(), "engine_pages lists_kernel");
  if (csr) {
    csr_kernel<<<L, kThreads, 0, launch.stream>>>(p);
    detail::check_cuda(cudaGetLastError(), "engine_pages csr_kernel");
  }
  if (launch.check_errors) launch.workspace->check(launch.stream);
}

}  // namespace masskv::cuda
