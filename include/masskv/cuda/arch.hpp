// Which GPU code paths run (issue 7: sm_90a first, an sm_80 path where it costs little).
#pragma once

namespace masskv::cuda {

// Which paths hopper_paths() may take: automatic (by the device and the build) or sm80 (the
// sm_80 paths on any device: how the checks cover them on a Hopper GPU; masskv_gpu_bench and
// the Python module set it from MASSKV_CUDA_PATHS=sm80, the library reads no environment).
// Process-wide: set it before the library's first CUDA call. Once hopper_paths() has decided,
// another value throws masskv::Error (invalid_argument, "paths").
enum class CudaPaths { automatic, sm80 };
void set_cuda_paths(CudaPaths paths);

// Whether the Hopper-only paths run on the current device: it is sm_90 or newer, this build's
// kernels were compiled for it (a build of sm_80 code alone, JIT-compiled on a Hopper GPU, takes
// the sm_80 paths), and set_cuda_paths did not force the sm_80 paths. The Hopper-only paths are
// programmatic dependent launch between a step's kernels, sparse entmax decode in one kernel of
// thread-block clusters, the cluster top-k of long flat selections, hierarchical selection in one
// kernel (opt-in) and the wgmma prefill kernels. Without them: plain launches in stream order,
// entmax by split-K, the block top-k at every length, hierarchical selection by separate launches
// and prefill on mma.sync — the same results (the GPU check compares both to the CPU reference).
// Decided once per process; throws masskv::Error when no kernel image of this build runs on the
// device.
bool hopper_paths();

}  // namespace masskv::cuda
