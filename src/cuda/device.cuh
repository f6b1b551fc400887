// CUDA helpers shared by the decode and selection files: error mapping, the SM count,
// programmatic dependent launch, L1 prefetch hints, phase stamps (stamps.hpp), the workspaces'
// growable device buffer and their device error flag.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "masskv/cuda/arch.hpp"
#include "masskv/cuda/stamps.hpp"
#include "masskv/error.hpp"

namespace masskv::cuda::detail {

// A CUDA error as masskv::Error(out_of_memory or unsupported, "cuda") naming `what`.
inline void check_cuda(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  fail(e == cudaErrorMemoryAllocation ? ErrorCode::out_of_memory : ErrorCode::unsupported, "cuda",
       what, ": ", cudaGetErrorString(e));
}

// Hopper-only instructions (thread-block clusters, wgmma, setmaxnreg, griddepcontrol) are
// compiled for sm_90 and newer. In an sm_80 pass (CMAKE_CUDA_ARCHITECTURES holds 80) the kernels
// built on them keep an empty body that traps, and the host never launches them: see
// hopper_paths().
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define MASSKV_PRE_SM90 1
#else
#define MASSKV_PRE_SM90 0
#endif

// Host: whether the Hopper-only paths may run (include/masskv/cuda/arch.hpp; arch.cu).
using cuda::hopper_paths;

// Host: the shared memory per block a kernel may use on the current device (the opt-in limit,
// static and dynamic together); on the sm_80 paths at most an sm_80 GPU's 163 KB, so the GPU
// check on a Hopper GPU with the sm_80 paths forced meets an A100's limit (arch.cu).
std::size_t smem_optin();
// Host: raises fn's dynamic shared-memory limit to `bytes`; throws masskv::Error
// (unsupported, "shared memory") naming `what` when bytes and fn's static shared memory
// exceed smem_optin(). Call it once per kernel (it queries the device).
void set_dynamic_smem(const void* fn, std::size_t bytes, const char* what);
template <class... A>
void set_dynamic_smem(void (*fn)(A...), std::size_t bytes, const char* what) {
  set_dynamic_smem(reinterpret_cast<const void*>(fn), bytes, what);
}
// Host: the dynamic shared memory fn may ask for: smem_optin() less fn's static shared memory.
std::size_t dynamic_smem_room(const void* fn);
template <class... A>
std::size_t dynamic_smem_room(void (*fn)(A...)) {
  return dynamic_smem_room(reinterpret_cast<const void*>(fn));
}

// Host: an attribute of the current device (masskv::Error naming `what` on a CUDA error).
inline int device_attr(cudaDeviceAttr attr, const char* what) {
  int dev = 0, v = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&v, attr, dev), what);
  return v;
}

inline int device_sms() {
  static const int sms = device_attr(cudaDevAttrMultiProcessorCount, "SM count");
  return sms;
}

// Programmatic dependent launch (sm_90): a kernel launched with PdlLaunch may start while its
// predecessor in the stream finishes (its launch and prologue overlap the predecessor's tail);
// it calls wait_for_predecessor (griddepcontrol.wait: the predecessor has completed and its
// writes are visible) before reading what the predecessor produced. Both device calls are
// no-ops in a kernel launched without the attribute, and compiled out before sm_90 (where
// PdlLaunch sets no attribute).
__device__ __forceinline__ void wait_for_predecessor() {
#if !MASSKV_PRE_SM90
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void allow_dependents() {
#if !MASSKV_PRE_SM90
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// A hint to bring the 128-byte line holding `ptr` into L1 (no result, no fault on a valid
// address): issued for inputs whose address is known before the loads that precede their use,
// so the later load finds the line instead of waiting a memory round trip.
__device__ __forceinline__ void prefetch_l1(const void* ptr) {
  asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(ptr)));
}
// Thread `part` of `parts` requests lines part, part + parts, ... of [begin, end), counted in
// whole 128-byte lines from the one that holds begin.
__device__ __forceinline__ void prefetch_l1_lines(const void* begin, const void* end, int part,
                                                  int parts) {
  const auto lo = reinterpret_cast<std::uintptr_t>(begin) & ~std::uintptr_t{127};
  const auto hi = reinterpret_cast<std::uintptr_t>(end);
  for (std::uintptr_t a = lo + static_cast<std::uintptr_t>(part) * 128; a < hi;
       a += static_cast<std::uintptr_t>(parts) * 128)
    prefetch_l1(reinterpret_cast<const void*>(a));
}

// Profiling (stamps.hpp): thread 0 of the CTA writes %globaltimer for (kernel, phase) when
// `at` is set; a uniform branch otherwise.
__device__ __forceinline__ void stamp(std::uint64_t* at, int kernel, int phase) {
  if (at == nullptr || threadIdx.x != 0) return;
  const unsigned cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (cta >= static_cast<unsigned>(stamps::kCtas)) return;
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  at[stamps::index(kernel, static_cast<int>(cta), phase)] = t;
}

// Host: a launch configuration with one launch attribute (cfg points at attr, which the caller
// keeps alive).
inline cudaLaunchConfig_t config_with(dim3 grid, dim3 block, std::size_t smem,
                                      cudaStream_t stream, cudaLaunchAttribute& attr) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return cfg;
}

// Host: the launch configuration of such a kernel (cudaLaunchKernelEx(&l.cfg, kernel, ...)):
// a plain launch in stream order where the Hopper paths are off. Not copyable: cfg points at
// attr.
struct PdlLaunch {
  cudaLaunchAttribute attr{};
  cudaLaunchConfig_t cfg{};
  PdlLaunch(cudaStream_t stream, dim3 grid, dim3 block, std::size_t smem = 0) {
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg = config_with(grid, block, smem, stream, attr);
    if (!hopper_paths()) cfg.numAttrs = 0;
  }
  PdlLaunch(const PdlLaunch&) = delete;
  PdlLaunch& operator=(const PdlLaunch&) = delete;
};

// Host: the launch configuration of a kernel in thread-block clusters of `cs` CTAs along x
// (cudaLaunchKernelEx(&cfg, kernel, ...) or cudaOccupancyMaxActiveClusters); attr must outlive
// cfg.
inline cudaLaunchConfig_t cluster_config(dim3 grid, dim3 block, std::size_t smem,
                                         cudaStream_t stream, cudaLaunchAttribute& attr, int cs) {
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(cs);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  return config_with(grid, block, smem, stream, attr);
}

// Device array that only grows: once a step's shapes were seen, later steps allocate nothing
// (so a step can be captured in a CUDA graph).
template <class T>
class GrowBuffer {
 public:
  GrowBuffer() = default;
  GrowBuffer(const GrowBuffer&) = delete;
  GrowBuffer& operator=(const GrowBuffer&) = delete;
  ~GrowBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  // Returns true when it (re)allocated: the contents are then undefined.
  bool reserve(std::size_t n, const char* what) {
    if (n <= size_) return false;
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    size_ = 0;
    check_cuda(cudaMalloc(&ptr_, n * sizeof(T)), what);
    size_ = n;
    return true;
  }
  T* data() const noexcept { return ptr_; }

 private:
  T* ptr_ = nullptr;
  std::size_t size_ = 0;
};

// The flag kernels set with atomicOr on bad device data (bits defined by each kernel file).
class ErrorFlag {
 public:
  ErrorFlag() {
    check_cuda(cudaMalloc(&ptr_, sizeof(unsigned)), "cudaMalloc(error flag)");
    check_cuda(cudaMemset(ptr_, 0, sizeof(unsigned)), "cudaMemset(error flag)");
  }
  ErrorFlag(const ErrorFlag&) = delete;
  ErrorFlag& operator=(const ErrorFlag&) = delete;
  ~ErrorFlag() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  unsigned* get() const noexcept { return ptr_; }
  // Waits for `stream` (errors name `step`) and returns the flag, cleared for the next step.
  unsigned take(cudaStream_t stream, const char* step) const {
    unsigned flag = 0;
    check_cuda(cudaMemcpyAsync(&flag, ptr_, sizeof flag, cudaMemcpyDeviceToHost, stream),
               "cudaMemcpyAsync(error flag)");
    check_cuda(cudaStreamSynchronize(stream), step);
    if (flag == 0) return 0;
    check_cuda(cudaMemsetAsync(ptr_, 0, sizeof flag, stream), "cudaMemset(error flag)");
    check_cuda(cudaStreamSynchronize(stream), "cudaMemset(error flag)");
    return flag;
  }

 private:
  unsigned* ptr_ = nullptr;
};

}  // namespace masskv::cuda::detail
