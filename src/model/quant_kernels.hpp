// Per-type row kernels behind masskv/model/quant.hpp: a portable scalar set (quant.cpp) and an
// AVX2/FMA/F16C set (quant_avx2.cpp, entered only after the runtime CPU check). Exposed here
// so tests can check both sets against the fp64 reference whatever the dispatcher picks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "masskv/model/quant.hpp"

namespace masskv::model::kernels {

using DequantFn = void (*)(const void* src, float* dst, std::size_t n);
using DotFn = float (*)(const void* row, const float* x, std::size_t n);

// Scalar kernels for a compute type, or nullptr. n must be a multiple of the block size.
DequantFn scalar_dequant(GgmlType type) noexcept;
DotFn scalar_dot(GgmlType type) noexcept;
// AVX2 dot kernel for a type, or nullptr when that type has none. Call only when
// masskv::cpu::has_avx2().
DotFn avx2_dot(GgmlType type) noexcept;
// The kernel dot_row uses (AVX2 when present and allowed, else scalar).
DotFn best_dot(GgmlType type) noexcept;
// AVX2 dequantiser (bit-equal to the scalar one), or nullptr; call only when has_avx2().
DequantFn avx2_dequant(GgmlType type) noexcept;
// The dequantiser dequantize_row and matmul use (AVX2 when present and allowed, else scalar).
DequantFn best_dequant(GgmlType type) noexcept;

// ---- Q8 activations (quant.hpp's Q8Activations as plain pointers for the kernels) ----------
// Block b of 32 values: x ~ d[b] * q[32b + j]; sum[b] = d[b] * sum_j q[32b + j].
struct Q8View {
  const std::int8_t* q;
  const float* d;
  const float* sum;
};
using QuantizeQ8Fn = void (*)(const float* x, std::size_t n, std::int8_t* q, float* d, float* sum);
// sum_i w_i * d[i/32] * q_i over one stored row of n values (n a multiple of the weight block).
using Q8DotFn = float (*)(const void* row, Q8View x, std::size_t n);

// Both quantisers give the same bits (q = x * (1/d) rounded to nearest-even, d = max|x| / 127;
// a block with a non-finite value gets d = sum = NaN and q = 0).
void quantize_q8_scalar(const float* x, std::size_t n, std::int8_t* q, float* d, float* sum);
void quantize_q8_avx2(const float* x, std::size_t n, std::int8_t* q, float* d, float* sum);
QuantizeQ8Fn best_quantize_q8() noexcept;

// Integer dot kernels for the block-quantised types, or nullptr for the float types (f32, f16,
// bf16 keep f32 activations). The scalar kernels form the same exact integer partial sums as
// the AVX2 ones (lane l of a block: values 4l..4l+3) and combine them with the same fused
// multiply-adds in the same order, so the two sets give the same bits: activation block xb
// folds into lane l of accumulator xb % kQ8Chains, the accumulators are added lane-wise as
// (0 + 1) + (2 + 3), then the 8 lanes in simd::hsum's tree.
inline constexpr std::size_t kQ8Chains = 4;
Q8DotFn scalar_q8_dot(GgmlType type) noexcept;
Q8DotFn avx2_q8_dot(GgmlType type) noexcept;  // call only when masskv::cpu::has_avx2()
Q8DotFn best_q8_dot(GgmlType type) noexcept;

float q8_dot_q4_0_scalar(const void* row, Q8View x, std::size_t n);
float q8_dot_q4_1_scalar(const void* row, Q8View x, std::size_t n);
float q8_dot_q5_0_scalar(const void* row, Q8View x, std::size_t n);
float q8_dot_q5_1_scalar(const void* row, Q8View x, std::size_t n);
float q8_dot_q8_0_scalar(const void* row, Q8View x, std::size_t n);
float q8_dot_q4_k_scalar(const void* row, Q8View x, std::size_t n);
float q8_dot_q6_k_scalar(const void* row, Q8View x, std::size_t n);

float q8_dot_q4_0_avx2(const void* row, Q8View x, std::size_t n);
float q8_dot_q4_1_avx2(const void* row, Q8View x, std::size_t n);
float q8_dot_q5_0_avx2(const void* row, Q8View x, std::size_t n);
float q8_dot_q5_1_avx2(const void* row, Q8View x, std::size_t n);
float q8_dot_q8_0_avx2(const void* row, Q8View x, std::size_t n);
float q8_dot_q4_k_avx2(const void* row, Q8View x, std::size_t n);
float q8_dot_q6_k_avx2(const void* row, Q8View x, std::size_t n);

// Q4_K packs 8 six-bit scales and 8 six-bit mins into 12 bytes: entries 0-3 in the low 6 bits
// of bytes 0-3 (scales) and 4-7 (mins); entries 4-7 take their low 4 bits from bytes 8-11
// (scale low nibble, min high nibble) and their top 2 bits from the spare top bits of 0-7.
void q4_k_scales_mins(const std::uint8_t* packed, std::uint8_t scales[8],
                      std::uint8_t mins[8]) noexcept;

float dot_f32_avx2(const void* row, const float* x, std::size_t n);
float dot_f16_avx2(const void* row, const float* x, std::size_t n);
float dot_bf16_avx2(const void* row, const float* x, std::size_t n);
float dot_q4_0_avx2(const void* row, const float* x, std::size_t n);
float dot_q4_1_avx2(const void* row, const float* x, std::size_t n);
float dot_q5_0_avx2(const void* row, const float* x, std::size_t n);
float dot_q5_1_avx2(const void* row, const float* x, std::size_t n);
float dot_q8_0_avx2(const void* row, const float* x, std::size_t n);
float dot_q4_k_avx2(const void* row, const float* x, std::size_t n);
float dot_q6_k_avx2(const void* row, const float* x, std::size_t n);

void dequant_f16_avx2(const void* src, float* dst, std::size_t n);
void dequant_bf16_avx2(const void* src, float* dst, std::size_t n);
void dequant_q4_0_avx2(const void* src, float* dst, std::size_t n);
void dequant_q4_1_avx2(const void* src, float* dst, std::size_t n);
void dequant_q5_0_avx2(const void* src, float* dst, std::size_t n);
void dequant_q5_1_avx2(const void* src, float* dst, std::size_t n);
void dequant_q8_0_avx2(const void* src, float* dst, std::size_t n);
void dequant_q4_k_avx2(const void* src, float* dst, std::size_t n);
void dequant_q6_k_avx2(const void* src, float* dst, std::size_t n);

}  // namespace masskv::model::kernels
