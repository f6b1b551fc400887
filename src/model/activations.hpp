// The gated FFN activation of the forward pass over a block: gate[i] = act(gate[i]) * up[i],
// act = SiLU (llama) or GELU-tanh (gemma3). A scalar version (the layer_ops.hpp formulas with
// libm) and an AVX2+FMA one (its own exp, within a few f32 ulp of libm); glu() picks.
#pragma once

#include <cstddef>

namespace masskv::model::ops {

void glu(bool gelu, float* gate, const float* up, std::size_t n);

namespace kernels {
void glu_scalar(bool gelu, float* gate, const float* up, std::size_t n);
// Call only when masskv::cpu::has_avx2().
void glu_avx2(bool gelu, float* gate, const float* up, std::size_t n);
}  // namespace kernels

}  // namespace masskv::model::ops
