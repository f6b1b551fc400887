// The f32 GEMM of the CPU prefill, Y[t][r] = sum_i W[r][i] X[t][i], in two steps: load 8 weight
// rows into an f32 panel, then multiply the panel by a block of activations with a
// register-blocked micro-kernel. It lives in core because two stages share it: the model's
// prefill matmul (model/quant.hpp, which loads quantised rows by dequantising them) and the
// prefill selection's f32 block scores (select/prefill_select.cpp), and select should not
// depend on model. The panel kernels come in a scalar and an AVX2+FMA version; both
// are exposed so tests can check each against the fp64 reference whatever the dispatcher picks.
#pragma once

#include <cstddef>

namespace masskv::linalg {

inline constexpr std::size_t kPanelRows = 8;

// Writes row `src` (n values in its stored format) as n floats to dst: a copy for f32 rows,
// a dequantiser for the model's quantised ones.
using RowLoadFn = void (*)(const void* src, float* dst, std::size_t n);

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
  RowLoadFn load;
  PanelFn panel;
  TransposeFn transpose;
};

// `load` with the AVX2 panel and transpose when the CPU has them and MASSKV_ISA allows them.
GemmKernels best_kernels(RowLoadFn load) noexcept;

// Y[t][r] = sum_i W[r][i] X[t][i] for t < n tokens: X is [n][cols], Y is [n][rows]; row r of
// W starts at w + r * row_stride bytes and is loaded by k.load. Each output is one f32 chain
// over i in order (k.panel's contract), independent of the thread count and of which other
// tokens share the call. OpenMP over panels. No checks: callers validated.
void gemm_with(const GemmKernels& k, const void* w, std::size_t row_stride, std::size_t rows,
               std::size_t cols, const float* x, std::size_t n, float* y);

// gemm_with(best_kernels(copy)) for an f32 W (rows contiguous, cols floats each).
void matmul_f32(const float* w, std::size_t rows, std::size_t cols, const float* x, std::size_t n,
                float* y);

}  // namespace masskv::linalg
