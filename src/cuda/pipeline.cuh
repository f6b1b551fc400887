// Hopper (sm_90a) synchronisation for warp-specialised kernels: shared-memory mbarriers (the
// full/empty handshakes of a producer-consumer ring), named barriers (ordering between
// warpgroups without stopping the whole CTA) and setmaxnreg (moving registers from the
// producer warpgroup to the consumers).
#pragma once

#include <cstdint>

namespace masskv::cuda::pipeline {

__device__ __forceinline__ unsigned shared_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// An mbarrier whose phase completes after `count` arrivals. Initialise from one thread, then
// make it visible to the CTA with a __syncthreads before any use.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_addr(bar)), "r"(count)
               : "memory");
}
// Arrive (release: this thread's earlier writes are visible to whoever waits on the phase).
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile(
      "{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(shared_addr(bar))
      : "memory");
}
// Wait (acquire) until the phase of the given parity has completed: the k-th completion of a
// barrier has parity k & 1.
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(shared_addr(bar)),
      "r"(parity)
      : "memory");
}

// Named barrier `id` (1..15; 0 is __syncthreads) over `threads` threads: bar_sync waits for
// the count to be reached, bar_arrive counts without waiting.
__device__ __forceinline__ void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Per-thread register limit of the executing warpgroup (all its threads must execute it).
template <int kRegs>
__device__ __forceinline__ void regs_increase() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void regs_decrease() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

}  // namespace masskv::cuda::pipeline
