#include "model/activations.hpp"

#include "core/cpu_features.hpp"
#include "model/layer_ops.hpp"

namespace masskv::model::ops {

namespace kernels {
void glu_scalar(bool gelu, float* gate, const float* up, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) gate[i] = (gelu ? gelu_tanh(gate[i]) : silu(gate[i])) * up[i];
}
}  // namespace kernels

void glu(bool gelu, float* gate, const float* up, std::size_t n) {
  if (cpu::has_avx2() && cpu::simd_allowed()) {
    kernels::glu_avx2(gelu, gate, up, n);
  } else {
    kernels::glu_scalar(gelu, gate, up, n);
  }
}

}  // namespace masskv::model::ops
