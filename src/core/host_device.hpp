// MASSKV_HD marks a function that the CPU code and the CUDA kernels share (one rule, one copy):
// __host__ __device__ under nvcc, nothing for the host compiler. Such a function uses no std
// library call that device code lacks.
#pragma once

#if defined(__CUDACC__)
#define MASSKV_HD __host__ __device__
#else
#define MASSKV_HD
#endif

namespace masskv::hd {

// f64 operations rounded once each, the same bits on the host and the device: the device's _rn
// intrinsics are never contracted into a fused multiply-add (nvcc contracts a * b + c by
// default); host files whose results must match the GPU's are built -ffp-contract=off, or
// without FMA instructions.
MASSKV_HD inline double mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
MASSKV_HD inline double add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
MASSKV_HD inline double div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

}  // namespace masskv::hd
