// masskv_gpu_bench's append part (append_check.cu): cuda::append against the CPU cache and
// bound store, bit for bit, plus its error flag and its time.
#pragma once

#include <cstdint>

#include "bench_util.cuh"
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

// Grid check; returns the number of failures (printed).
int run_append_check();
