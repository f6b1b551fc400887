// Which code paths the current device and this build allow (include/masskv/cuda/arch.hpp).
#include <algorithm>
#include <mutex>

#include "device.cuh"

namespace masskv::cuda {
namespace {

using detail::check_cuda;

// Compiled for every architecture of the build like the other kernels: its attributes say which
// of them the runtime picked for the device (a Hopper SASS image, or PTX of an older target
// JIT-compiled for it). Never launched.
__global__ void arch_probe_kernel() {}

// set_cuda_paths' value, and whether hopper_paths has read it (then it is fixed).
std::mutex paths_mu;
CudaPaths paths_set = CudaPaths::automatic;
bool paths_read = false;

}  // namespace

void set_cuda_paths(CudaPaths paths) {
  const std::lock_guard<std::mutex> lock(paths_mu);
  require(!paths_read || paths == paths_set, ErrorCode::invalid_argument, "paths",
          "set_cuda_paths comes before the library's first CUDA call (hopper_paths has decided)");
  paths_set = paths;
}

bool hopper_paths() {
  static const bool hopper = [] {
    {
      const std::lock_guard<std::mutex> lock(paths_mu);
      paths_read = true;
      if (paths_set == CudaPaths::sm80) return false;
    }
    const int major = detail::device_attr(cudaDevAttrComputeCapabilityMajor, "compute capability");
    cudaFuncAttributes attr{};
    check_cuda(cudaFuncGetAttributes(&attr, arch_probe_kernel),
               "cudaFuncGetAttributes (no kernel image of this build runs on the device)");
    return major >= 9 && attr.ptxVersion >= 90;
  }();
  return hopper;
}

namespace detail {

constexpr std::size_t kSm80SmemOptin = 166912;  // 163 KB: an A100's opt-in limit per block

std::size_t smem_optin() {
  static const std::size_t optin = [] {
    const auto device = static_cast<std::size_t>(
        device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin, "shared memory per block"));
    return hopper_paths() ? device : std::min(device, kSm80SmemOptin);
  }();
  return optin;
}

std::size_t dynamic_smem_room(const void* fn) {
  cudaFuncAttributes a{};
  check_cuda(cudaFuncGetAttributes(&a, fn), "cudaFuncGetAttributes");
  return smem_optin() > a.sharedSizeBytes ? smem_optin() - a.sharedSizeBytes : 0;
}

void set_dynamic_smem(const void* fn, std::size_t bytes, const char* what) {
  const std::size_t room = dynamic_smem_room(fn);
  require(bytes <= room, ErrorCode::unsupported, "shared memory", what, " needs ", bytes,
          " bytes of dynamic shared memory per block; this device (",
          hopper_paths() ? "Hopper" : "sm_80", " paths) leaves it ", room);
  check_cuda(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)),
             what);
}

}  // namespace detail
}  // namespace masskv::cuda
