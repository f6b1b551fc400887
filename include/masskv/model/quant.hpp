// ggml tensor types as stored in GGUF files: block layouts, dequantisation, dot products
// against f32 or Q8-quantised activations, a threaded matrix-vector product and the prefill
// matmul.
//
// A row of n values of a block-quantised type is n / block_elems consecutive blocks of
// block_bytes each; scales and mins are little-endian f16. dot_row and matmul keep x in f32 and
// only add f32 rounding. matvec (decode), like llama.cpp, by default sees the activations of a
// block-quantised weight through an 8-bit quantisation (Q8Activations) and runs integer dot
// products: faster, at the cost of that rounding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace masskv::model {

// Values are ggml's type ids (the on-disk numbers in GGUF tensor infos).
enum class GgmlType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  bf16 = 30,
};

struct TypeTraits {
  std::string_view name;      // ggml's name, e.g. "q4_K"
  std::uint32_t block_elems;  // values per block (1 for plain types)
  std::uint32_t block_bytes;  // bytes per block
  bool compute;               // dequantize_row / dot_row / matvec implement it
};

// Traits of a raw type id, or nullptr when the id is not one the reader knows (the reader
// cannot even size such a tensor, so it rejects the file).
const TypeTraits* find_type_traits(std::uint32_t raw_type) noexcept;
// Traits of a known type (never null for an enumerator above).
const TypeTraits& type_traits(GgmlType type) noexcept;
std::string_view to_string(GgmlType type) noexcept;

// Block sizes of the compute types (ggml's QK* constants and sizeof(block_*)).
inline constexpr std::size_t qk4_0 = 32, q4_0_bytes = 2 + 16;          // d, 32 nibbles
inline constexpr std::size_t qk4_1 = 32, q4_1_bytes = 2 + 2 + 16;      // d, m, 32 nibbles
inline constexpr std::size_t qk5_0 = 32, q5_0_bytes = 2 + 4 + 16;      // d, high bits, nibbles
inline constexpr std::size_t qk5_1 = 32, q5_1_bytes = 2 + 2 + 4 + 16;  // d, m, high bits, nibbles
inline constexpr std::size_t qk8_0 = 32, q8_0_bytes = 2 + 32;          // d, 32 int8
inline constexpr std::size_t qk_k = 256;                               // K-quant super-block
inline constexpr std::size_t q4_k_bytes = 2 + 2 + 12 + 128;   // d, dmin, 6-bit scales/mins, nibbles
inline constexpr std::size_t q6_k_bytes = 128 + 64 + 16 + 2;  // low nibbles, high 2 bits, scales, d

// Bytes of a row of n values; throws Error(invalid_argument, argument) when n is not a
// multiple of the block size (e.g. a K-quant row whose width is not a multiple of 256).
std::size_t row_bytes(GgmlType type, std::size_t n, std::string_view argument = "n");

// dst[0..n) = the n values stored at src. Throws Error(unsupported) for a type without
// compute support and Error(invalid_argument, "n") when n is not a multiple of the block.
// Each value is the exact block formula rounded once to f32 (tests check bit-exactness).
void dequantize_row(GgmlType type, const void* src, float* dst, std::size_t n);

// sum_i w_i * x_i over one row of n stored values w, accumulated in f32 in a fixed order.
float dot_row(GgmlType type, const void* row, const float* x, std::size_t n);

// ---- Q8 activations ----------------------------------------------------------------------
// x quantised to 8 bits in blocks of 32 values: x_i ~ d[b] * q[i] for b = i / 32, with
// d[b] = max_j |x_j| / 127 over the block (f32) and q_i = x_i / d[b] rounded to the nearest
// integer (ties to even), so |x_i - d q_i| <= d / 2 (plus f32 rounding of x_i / d). sum[b] =
// d[b] * sum_j q_j is the quantised block's sum, which the weight types with an offset or min
// (Q4_1, Q5_1, Q4_K) need. A block whose max |x| is below 127 * FLT_MIN (d would be subnormal)
// is stored as zeros; a block holding an inf or NaN gets d = sum = NaN, so every dot product
// that reads it is NaN.
struct Q8Activations {
  std::vector<std::int8_t> q;
  std::vector<float> d, sum;
};
inline constexpr std::size_t qk8_act = 32;

// out = x[0..n) quantised; throws Error(invalid_argument, "n") when n % 32 != 0.
void quantize_q8(const float* x, std::size_t n, Q8Activations& out);
// True for the block-quantised compute types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K), which
// have integer dot kernels; f32, f16 and bf16 weights always take f32 activations.
bool uses_q8_activations(GgmlType type) noexcept;
// sum_i w_i * d[i/32] q_i over one row of n stored values, from integer block dot products
// (exact) scaled once per block of 32 in f32. Throws Error(unsupported, "type") when
// !uses_q8_activations(type), Error(invalid_argument, "n") on a partial block or when x holds
// fewer than n values.
float dot_row_q8(GgmlType type, const void* row, const Q8Activations& x, std::size_t n);

enum class Activations {
  q8,   // quantised once per mat-vec where uses_q8_activations(type), else f32
  f32,  // always f32 (dot_row)
};

// y[r] = W row r times x for r < rows; W is rows x cols, row-major, rows contiguous. With
// Activations::q8 and uses_q8_activations(type), x is quantised once (quantize_q8) and y[r] =
// dot_row_q8(row r); otherwise y[r] = dot_row(row r, x). OpenMP over rows with fixed chunks:
// each y[r] is computed by one thread in a fixed order, so results do not depend on the thread
// count.
void matvec(GgmlType type, const void* w, std::size_t rows, std::size_t cols, const float* x,
            float* y, Activations activations = Activations::q8);

// Y[t][r] = sum_i W[r][i] X[t][i] for t < n tokens: X is [n][cols], Y is [n][rows] (prefill
// batches), f32 activations. Weight rows are dequantised to f32 once per 8-row panel and block
// of up to 128 tokens, then multiplied by a register-blocked f32 kernel (src/core/gemm*.cpp).
// Each output is one f32 chain over i in order: within 1e-5 * sum|w x| of the exact product
// like dot_row (so like matvec with Activations::f32, not bit-equal); independent of the
// thread count and of which other tokens share the call. OpenMP over panels.
void matmul(GgmlType type, const void* w, std::size_t rows, std::size_t cols, const float* x,
            std::size_t n, float* y);

}  // namespace masskv::model
