// The online softmax of docs/design.md §2.6, once for every CUDA softmax kernel: a row's running
// max m and sum l over logits in the state's base (Base2: the decode and prefill kernels score
// in base-2 logits, q·k·scale·log2 e; BaseE: the split-K partials carry natural-log lse), the
// rescale when the max grows, the merge weight of a partial, and the row's lse in natural log
// (what every kernel writes out). The output accumulator stays with each kernel (8 dims a lane
// in decode.cu / decode_tokens.cu, MMA fragments in decode_mma.cu and the prefill tiles): only
// its scaling factor crosses. Base2Approx is Base2 with ex2.approx (the prefill kernels, where
// the exponent's throughput matters more than its last bit).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace masskv::cuda::softmax {

constexpr float kLn2 = 0.6931471805599453f;

struct Base2 {
  __device__ __forceinline__ static float exp(float x) { return exp2f(x); }
  __device__ __forceinline__ static float log(float x) { return log2f(x); }
  __device__ __forceinline__ static float to_natural(float x) { return x * kLn2; }
};
struct Base2Approx : Base2 {  // Base2's log and lse, the exponent on the SFU
  __device__ __forceinline__ static float exp(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
  }
};
struct BaseE {
  __device__ __forceinline__ static float exp(float x) { return expf(x); }
  __device__ __forceinline__ static float log(float x) { return logf(x); }
  __device__ __forceinline__ static float to_natural(float x) { return x; }
};

// One row's running state. A row with no key yet has m = -inf, l = 0.
template <class B>
struct Row {
  float m = -INFINITY, l = 0.f;

  // Raises the max to mt when mt is larger, rescaling l: returns whether it grew, with corr the
  // factor the row's accumulated output must then be multiplied by (m = -inf gives 0: nothing
  // accumulated yet); otherwise corr = 1 and the caller may skip its output's rescale.
  __device__ __forceinline__ bool raise(float mt, float& corr) {
    if (!(mt > m)) {
      corr = 1.f;
      return false;
    }
    corr = B::exp(m - mt);
    l *= corr;
    m = mt;
    return true;
  }
  // A logit's weight against the running max (after raise).
  __device__ __forceinline__ float weight(float s) const { return B::exp(s - m); }

  // The lse of a merged row: max mx, weights summed to sum.
  __device__ __forceinline__ static float lse_of(float mx, float sum) {
    return sum > 0.f ? B::to_natural(mx + B::log(sum)) : -INFINITY;
  }
  // A partial's merge weight against the merged max mx (0 when every partial is empty).
  __device__ __forceinline__ static float merge_weight(float m_part, float mx) {
    return mx == -INFINITY ? 0.f : B::exp(m_part - mx);
  }
};

}  // namespace masskv::cuda::softmax
