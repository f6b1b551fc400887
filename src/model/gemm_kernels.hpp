// The prefill matmul (quant.hpp's matmul) in two steps: dequantise 8 weight rows into an f32
// panel, then multiply the panel by the block's activations with a register-blocked micro-kernel.
// The panel kernels come in a scalar and an AVX2+FMA version; both are exposed so tests can
// check each against the fp64 reference whatever the dispatcher picks.
#pragma once

#include <cstddef>

#include "model/quant_kernels.hpp"

namespace masskv::model::kernels {

inline constexpr std::size_t kPanelRows = 8;

// c[i * ldc + t] = sum_{k < K} w[i * ldw + k] * xt[k * ldx + t] for i < 8 and t < nt, nt a
// multiple of 8. Every output is one f32 chain over k in increasing order, whatever tile it
// falls in, so a token's result does not depend on nt or its place in the block.
using PanelFn = void (*)(const float* w, std::size_t ldw, std::size_t K, const float* xt,
                         std::size_t ldx, std::size_t nt, float* c, std::size_t ldc);

void panel_scalar(const float* w, std::size_t ldw, std::size_t K, const float* xt, std::size_t ldx,
                  std::size_t nt, float* c, std::size_t ldc);
// Call only when masskv::cpu::has_avx2().
void panel_avx2(const float* w, std::size_t ldw, std::size_t K, const float* xt, std::size_t ldx,
                std::size_t nt, float* c, std::size_t ldc);

// dst[j * ldd + i] = src[i * lds + j] for i < rows, j < cols: the activations into the
// [cols][tokens] layout, the panel's results into Y. Exact copies, so the versions agree.
using TransposeFn = void (*)(const float* src, std::size_t lds, std::size_t rows, std::size_t cols,
                             float* dst, std::size_t ldd);
void transpose_scalar(const float* src, std::size_t lds, std::size_t rows, std::size_t cols,
                      float* dst, std::size_t ldd);
// 8x8 blocks in registers; call only when masskv::cpu::has_avx2().
void transpose_avx2(const float* src, std::size_t lds, std::size_t rows, std::size_t cols,
                    float* dst, std::size_t ldd);

struct GemmKernels {
  DequantFn dequant;
  PanelFn panel;
  TransposeFn transpose;
};

// matmul with given kernels (matmul passes best_dequant and the AVX2 panel and transpose when
// allowed); same contract as matmul.
void matmul_with(const GemmKernels& k, GgmlType type, const void* w, std::size_t rows,
                 std::size_t cols, const float* x, std::size_t n, float* y);

}  // namespace masskv::model::kernels
