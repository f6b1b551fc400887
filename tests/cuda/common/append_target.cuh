// The device buffers cuda::append writes besides the pool, shared by the append check
// (tests/cuda/append_check.cu) and the bench's append + select + decode step.
#pragma once

#include <cstdint>

#include "gpu_util.cuh"
#include "masskv/cuda/append.hpp"
#include "masskv/dtype.hpp"

// The device state cuda::append writes besides the pool: the summaries of `pages` pages of
// `heads` kv heads (f32 min/max/mean/M2, count, max ‖v‖) and, with `bound_store`, the bf16
// bound store and its W. One owner for the check's cases, the timing and the bench's step.
struct AppendTarget {
  AppendTarget(int pages, int heads, int d, bool bound_store);
  // Args writing into these buffers and the given pool (strides in elements, as
  // kv::PagedKVView); the token arrays (k, v, page, slot) are the caller's.
  masskv::cuda::AppendArgs args(void* k_pool, void* v_pool, masskv::DType dtype, int page_size,
                                std::int64_t stride_page, std::int64_t stride_head,
                                std::int64_t stride_slot);
  int pages, heads, d;
  DevBuf<float> min, max, mean, m2, vnorm, wmax;
  DevBuf<std::uint16_t> bmin, bmax;
  DevBuf<std::int32_t> count;
};

inline AppendTarget::AppendTarget(int pages_, int heads_, int d_, bool bound_store)
    : pages(pages_), heads(heads_), d(d_) {
  const std::size_t sums = static_cast<std::size_t>(pages) * heads * d;
  const std::size_t ph = static_cast<std::size_t>(pages) * heads;
  min = DevBuf<float>(sums);
  max = DevBuf<float>(sums);
  mean = DevBuf<float>(sums);
  m2 = DevBuf<float>(sums);
  vnorm = DevBuf<float>(ph);
  count = DevBuf<std::int32_t>(pages);
  if (bound_store) {
    bmin = DevBuf<std::uint16_t>(sums);
    bmax = DevBuf<std::uint16_t>(sums);
    wmax = DevBuf<float>(ph);
  }
}

inline masskv::cuda::AppendArgs AppendTarget::args(void* k_pool, void* v_pool, masskv::DType dtype, int page_size,
                                    std::int64_t stride_page, std::int64_t stride_head,
                                    std::int64_t stride_slot) {
  masskv::cuda::AppendArgs a;
  a.k_pool = k_pool;
  a.v_pool = v_pool;
  a.dtype = dtype;
  a.stride_page = stride_page;
  a.stride_head = stride_head;
  a.stride_slot = stride_slot;
  a.num_pages = pages;
  a.num_kv_heads = heads;
  a.page_size = page_size;
  a.head_dim = d;
  a.min = min.p;
  a.max = max.p;
  a.mean = mean.p;
  a.m2 = m2.p;
  a.count = count.p;
  a.max_vnorm = vnorm.p;
  if (bmin.p != nullptr) {
    a.bound_min = reinterpret_cast<masskv::bf16*>(bmin.p);
    a.bound_max = reinterpret_cast<masskv::bf16*>(bmax.p);
    a.bound_wmax = wmax.p;
  }
  return a;
}
