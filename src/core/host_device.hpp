// MASSKV_HD marks a function that the CPU code and the CUDA kernels share (one rule, one copy):
// __host__ __device__ under nvcc, nothing for the host compiler. Such a function uses no std
// library call that device code lacks.
#pragma once

#if defined(__CUDACC__)
#define MASSKV_HD __host__ __device__
#else
#define MASSKV_HD
#endif
