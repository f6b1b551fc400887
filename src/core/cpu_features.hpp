// Runtime CPU-feature dispatch: ISA-specific kernels are entered only when the CPU has them.
#pragma once

namespace masskv::cpu {

// AVX2 + FMA + F16C (the x86-64-v3 subset our kernels use).
bool has_avx2() noexcept;

// MASSKV_ISA=scalar in the environment forces the scalar kernels (for A/B checks).
bool simd_allowed() noexcept;

}  // namespace masskv::cpu
