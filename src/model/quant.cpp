#include "masskv/model/quant.hpp"

#include <array>
#include <cstring>

#include "core/cpu_features.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "model/quant_kernels.hpp"

namespace masskv::model {
namespace {

// Every type the reader can size. Block sizes follow ggml's block_* structs; the types without
// compute support are here only so a file holding them opens and reports them by name.
constexpr std::array<std::pair<std::uint32_t, TypeTraits>, 20> kTypes{{
    {0, {"f32", 1, 4, true}},
    {1, {"f16", 1, 2, true}},
    {2, {"q4_0", qk4_0, q4_0_bytes, true}},
    {3, {"q4_1", qk4_1, q4_1_bytes, true}},
    {6, {"q5_0", qk5_0, q5_0_bytes, true}},
    {7, {"q5_1", qk5_1, q5_1_bytes, true}},
    {8, {"q8_0", qk8_0, q8_0_bytes, true}},
    {9, {"q8_1", 32, 2 + 2 + 32, false}},
    {10, {"q2_K", qk_k, 16 + 64 + 2 + 2, false}},
    {11, {"q3_K", qk_k, 32 + 64 + 12 + 2, false}},
    {12, {"q4_K", qk_k, q4_k_bytes, true}},
    {13, {"q5_K", qk_k, 2 + 2 + 12 + 32 + 128, false}},
    {14, {"q6_K", qk_k, q6_k_bytes, true}},
    {15, {"q8_K", qk_k, 4 + 256 + 2 * 16, false}},
    {24, {"i8", 1, 1, false}},
    {25, {"i16", 1, 2, false}},
    {26, {"i32", 1, 4, false}},
    {27, {"i64", 1, 8, false}},
    {28, {"f64", 1, 8, false}},
    {30, {"bf16", 1, 2, true}},
}};

float load_f16(const std::uint8_t* p) noexcept {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_to_f32(f16{bits});
}

// ---- block decoders: write one block's values; each value is rounded once to f32 ----------
// (d*q is exact in f32 for every type below, so only the "+ m" / "- m" step rounds.)

void decode_q4_0(const std::uint8_t* b, float* y) noexcept {
  const float d = load_f16(b);
  const std::uint8_t* qs = b + 2;
  for (std::size_t j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void decode_q4_1(const std::uint8_t* b, float* y) noexcept {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const std::uint8_t* qs = b + 4;
  for (std::size_t j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5: bit j of the 32-bit little-endian qh is the fifth bit of value j.
std::uint32_t load_u32(const std::uint8_t* p) noexcept {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

void decode_q5_0(const std::uint8_t* b, float* y) noexcept {
  const float d = load_f16(b);
  const std::uint32_t qh = load_u32(b + 2);
  const std::uint8_t* qs = b + 6;
  for (std::size_t j = 0; j < 16; ++j) {
    const int lo = static_cast<int>((qs[j] & 0x0Fu) | ((qh >> j) & 1u) << 4);
    const int hi = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4);
    y[j] = static_cast<float>(lo - 16) * d;
    y[j + 16] = static_cast<float>(hi - 16) * d;
  }
}

void decode_q5_1(const std::uint8_t* b, float* y) noexcept {
  const float d = load_f16(b);
  const float m = load_f16(b + 2);
  const std::uint32_t qh = load_u32(b + 4);
  const std::uint8_t* qs = b + 8;
  for (std::size_t j = 0; j < 16; ++j) {
    const std::uint32_t lo = (qs[j] & 0x0Fu) | ((qh >> j) & 1u) << 4;
    const std::uint32_t hi = (qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4;
    y[j] = static_cast<float>(lo) * d + m;
    y[j + 16] = static_cast<float>(hi) * d + m;
  }
}

void decode_q8_0(const std::uint8_t* b, float* y) noexcept {
  const float d = load_f16(b);
  for (std::size_t j = 0; j < 32; ++j) {
    y[j] = static_cast<float>(static_cast<std::int8_t>(b[2 + j])) * d;
  }
}

// Q4_K: 8 sub-blocks of 32; value = d*scale_s*q - dmin*min_s. Byte run c (32 bytes) holds
// sub-block 2c in its low nibbles and sub-block 2c+1 in its high nibbles.
void decode_q4_k(const std::uint8_t* b, float* y) noexcept {
  const float d = load_f16(b);
  const float dmin = load_f16(b + 2);
  std::uint8_t sc[8], mn[8];
  kernels::q4_k_scales_mins(b + 4, sc, mn);
  const std::uint8_t* q = b + 16;
  for (std::size_t c = 0; c < 4; ++c) {
    const float d1 = d * sc[2 * c], m1 = dmin * mn[2 * c];
    const float d2 = d * sc[2 * c + 1], m2 = dmin * mn[2 * c + 1];
    for (std::size_t l = 0; l < 32; ++l) {
      y[64 * c + l] = d1 * static_cast<float>(q[32 * c + l] & 0x0F) - m1;
      y[64 * c + 32 + l] = d2 * static_cast<float>(q[32 * c + l] >> 4) - m2;
    }
  }
}

// Q6_K: 16 groups of 16 with int8 scales; 6-bit q = 4 low bits (ql) + 2 high bits (qh), minus
// 32. Each half of 128 values reads 64 ql bytes, 32 qh bytes and 8 scales.
void decode_q6_k(const std::uint8_t* b, float* y) noexcept {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = load_f16(b + 208);
  for (std::size_t h = 0; h < 2; ++h) {
    for (std::size_t l = 0; l < 32; ++l) {
      const std::size_t is = l / 16;
      const int q1 = ((ql[l] & 0x0F) | ((qh[l] >> 0) & 3) << 4) - 32;
      const int q2 = ((ql[l + 32] & 0x0F) | ((qh[l] >> 2) & 3) << 4) - 32;
      const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      y[l] = d * static_cast<float>(sc[is]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

template <void (*Decode)(const std::uint8_t*, float*), std::size_t QK, std::size_t Bytes>
void dequant_blocks(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n / QK; ++i) Decode(b + i * Bytes, dst + i * QK);
}

// Fixed order: each block's products summed left to right, then added to the row total.
template <void (*Decode)(const std::uint8_t*, float*), std::size_t QK, std::size_t Bytes>
float dot_blocks(const void* src, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  float y[QK];
  float total = 0.0f;
  for (std::size_t i = 0; i < n / QK; ++i) {
    Decode(b + i * Bytes, y);
    float s = 0.0f;
    for (std::size_t j = 0; j < QK; ++j) s += y[j] * x[i * QK + j];
    total += s;
  }
  return total;
}

void dequant_f32(const void* src, float* dst, std::size_t n) {
  std::memcpy(dst, src, n * sizeof(float));
}
void dequant_f16(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n; ++i) dst[i] = load_f16(b + 2 * i);
}
void dequant_bf16(const void* src, float* dst, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, b + 2 * i, 2);
    dst[i] = bf16_to_f32(bf16{bits});
  }
}

float dot_f32(const void* src, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  float total = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    float w;
    std::memcpy(&w, b + 4 * i, 4);
    total += w * x[i];
  }
  return total;
}
float dot_f16(const void* src, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  float total = 0.0f;
  for (std::size_t i = 0; i < n; ++i) total += load_f16(b + 2 * i) * x[i];
  return total;
}
float dot_bf16(const void* src, const float* x, std::size_t n) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  float total = 0.0f;
  for (std::size_t i = 0; i < n; ++i) {
    std::uint16_t bits;
    std::memcpy(&bits, b + 2 * i, 2);
    total += bf16_to_f32(bf16{bits}) * x[i];
  }
  return total;
}

const TypeTraits& compute_traits(GgmlType type, std::string_view argument) {
  const TypeTraits& t = type_traits(type);
  require(t.compute, ErrorCode::unsupported, argument, "tensor type ", t.name,
          " has no dequantisation kernel");
  return t;
}

}  // namespace

const TypeTraits* find_type_traits(std::uint32_t raw_type) noexcept {
  for (const auto& [id, traits] : kTypes) {
    if (id == raw_type) return &traits;
  }
  return nullptr;
}

const TypeTraits& type_traits(GgmlType type) noexcept {
  const TypeTraits* t = find_type_traits(static_cast<std::uint32_t>(type));
  static constexpr TypeTraits kUnknown{"unknown", 1, 1, false};
  return t != nullptr ? *t : kUnknown;
}

std::string_view to_string(GgmlType type) noexcept { return type_traits(type).name; }

std::size_t row_bytes(GgmlType type, std::size_t n, std::string_view argument) {
  const TypeTraits& t = type_traits(type);
  require(n % t.block_elems == 0, ErrorCode::invalid_argument, argument, "row of ", n,
          " values is not a multiple of the ", t.name, " block size ", t.block_elems);
  return n / t.block_elems * t.block_bytes;
}

namespace kernels {

void q4_k_scales_mins(const std::uint8_t* p, std::uint8_t scales[8],
                      std::uint8_t mins[8]) noexcept {
  for (std::size_t j = 0; j < 4; ++j) {
    scales[j] = p[j] & 63;
    mins[j] = p[j + 4] & 63;
  }
  for (std::size_t j = 4; j < 8; ++j) {
    scales[j] = static_cast<std::uint8_t>((p[j + 4] & 0x0F) | (p[j - 4] >> 6) << 4);
    mins[j] = static_cast<std::uint8_t>((p[j + 4] >> 4) | (p[j] >> 6) << 4);
  }
}

namespace {

// One row per compute type: its scalar dequant/dot, its AVX2 dot/dequant and, for the
// block-quantised types, its Q8-activation dots (scalar, AVX2).
struct KernelSet {
  GgmlType type;
  DequantFn dequant;
  DotFn dot;
  DotFn avx2;
  DequantFn avx2_dequant;
  Q8DotFn q8_dot = nullptr;
  Q8DotFn q8_avx2 = nullptr;
};

template <void (*Decode)(const std::uint8_t*, float*), std::size_t QK, std::size_t Bytes>
constexpr KernelSet blocked(GgmlType type, DotFn avx2, DequantFn avx2_dequant, Q8DotFn q8_dot,
                            Q8DotFn q8_avx2) {
  return {type,
          dequant_blocks<Decode, QK, Bytes>,
          dot_blocks<Decode, QK, Bytes>,
          avx2,
          avx2_dequant,
          q8_dot,
          q8_avx2};
}

// f32 has no AVX2 dequantiser: it is a copy.
constexpr KernelSet kKernels[] = {
    {GgmlType::f32, dequant_f32, dot_f32, dot_f32_avx2, dequant_f32},
    {GgmlType::f16, dequant_f16, dot_f16, dot_f16_avx2, dequant_f16_avx2},
    {GgmlType::bf16, dequant_bf16, dot_bf16, dot_bf16_avx2, dequant_bf16_avx2},
    blocked<decode_q4_0, qk4_0, q4_0_bytes>(GgmlType::q4_0, dot_q4_0_avx2, dequant_q4_0_avx2,
                                            q8_dot_q4_0_scalar, q8_dot_q4_0_avx2),
    blocked<decode_q4_1, qk4_1, q4_1_bytes>(GgmlType::q4_1, dot_q4_1_avx2, dequant_q4_1_avx2,
                                            q8_dot_q4_1_scalar, q8_dot_q4_1_avx2),
    blocked<decode_q5_0, qk5_0, q5_0_bytes>(GgmlType::q5_0, dot_q5_0_avx2, dequant_q5_0_avx2,
                                            q8_dot_q5_0_scalar, q8_dot_q5_0_avx2),
    blocked<decode_q5_1, qk5_1, q5_1_bytes>(GgmlType::q5_1, dot_q5_1_avx2, dequant_q5_1_avx2,
                                            q8_dot_q5_1_scalar, q8_dot_q5_1_avx2),
    blocked<decode_q8_0, qk8_0, q8_0_bytes>(GgmlType::q8_0, dot_q8_0_avx2, dequant_q8_0_avx2,
                                            q8_dot_q8_0_scalar, q8_dot_q8_0_avx2),
    blocked<decode_q4_k, qk_k, q4_k_bytes>(GgmlType::q4_k, dot_q4_k_avx2, dequant_q4_k_avx2,
                                           q8_dot_q4_k_scalar, q8_dot_q4_k_avx2),
    blocked<decode_q6_k, qk_k, q6_k_bytes>(GgmlType::q6_k, dot_q6_k_avx2, dequant_q6_k_avx2,
                                           q8_dot_q6_k_scalar, q8_dot_q6_k_avx2),
};

const KernelSet* find_kernels(GgmlType type) noexcept {
  for (const KernelSet& k : kKernels) {
    if (k.type == type) return &k;
  }
  return nullptr;
}

// The type's kernel in `field`, or nullptr.
template <class Fn>
Fn kernel(GgmlType type, Fn KernelSet::*field) noexcept {
  const KernelSet* k = find_kernels(type);
  return k != nullptr ? k->*field : nullptr;
}

// The AVX2 kernel when the CPU has it and it is allowed, else the scalar one.
template <class Fn>
Fn best(GgmlType type, Fn KernelSet::*avx2, Fn KernelSet::*scalar) noexcept {
  if (cpu::has_avx2() && cpu::simd_allowed()) {
    if (Fn f = kernel(type, avx2)) return f;
  }
  return kernel(type, scalar);
}

}  // namespace

DequantFn scalar_dequant(GgmlType type) noexcept { return kernel(type, &KernelSet::dequant); }
DotFn scalar_dot(GgmlType type) noexcept { return kernel(type, &KernelSet::dot); }
DotFn avx2_dot(GgmlType type) noexcept { return kernel(type, &KernelSet::avx2); }
DequantFn avx2_dequant(GgmlType type) noexcept { return kernel(type, &KernelSet::avx2_dequant); }
Q8DotFn scalar_q8_dot(GgmlType type) noexcept { return kernel(type, &KernelSet::q8_dot); }
Q8DotFn avx2_q8_dot(GgmlType type) noexcept { return kernel(type, &KernelSet::q8_avx2); }

DequantFn best_dequant(GgmlType type) noexcept {
  return best(type, &KernelSet::avx2_dequant, &KernelSet::dequant);
}
DotFn best_dot(GgmlType type) noexcept { return best(type, &KernelSet::avx2, &KernelSet::dot); }
Q8DotFn best_q8_dot(GgmlType type) noexcept {
  return best(type, &KernelSet::q8_avx2, &KernelSet::q8_dot);
}

QuantizeQ8Fn best_quantize_q8() noexcept {
  return cpu::has_avx2() && cpu::simd_allowed() ? quantize_q8_avx2 : quantize_q8_scalar;
}

}  // namespace kernels

void dequantize_row(GgmlType type, const void* src, float* dst, std::size_t n) {
  compute_traits(type, "type");
  row_bytes(type, n, "n");
  kernels::best_dequant(type)(src, dst, n);
}

float dot_row(GgmlType type, const void* row, const float* x, std::size_t n) {
  compute_traits(type, "type");
  row_bytes(type, n, "n");
  return kernels::best_dot(type)(row, x, n);
}

bool uses_q8_activations(GgmlType type) noexcept { return kernels::scalar_q8_dot(type) != nullptr; }

void quantize_q8(const float* x, std::size_t n, Q8Activations& out) {
  require(n % qk8_act == 0, ErrorCode::invalid_argument, "n", n,
          " values are not a multiple of the Q8 block size ", qk8_act);
  out.q.resize(n);
  out.d.resize(n / qk8_act);
  out.sum.resize(n / qk8_act);
  kernels::best_quantize_q8()(x, n, out.q.data(), out.d.data(), out.sum.data());
}

float dot_row_q8(GgmlType type, const void* row, const Q8Activations& x, std::size_t n) {
  compute_traits(type, "type");
  require(uses_q8_activations(type), ErrorCode::unsupported, "type", "tensor type ",
          to_string(type), " takes f32 activations (dot_row)");
  row_bytes(type, n, "n");
  require(x.q.size() >= n && x.d.size() >= n / qk8_act && x.sum.size() >= n / qk8_act,
          ErrorCode::invalid_argument, "n", "row of ", n, " values but the activations hold ",
          x.q.size());
  return kernels::best_q8_dot(type)(row, {x.q.data(), x.d.data(), x.sum.data()}, n);
}

void matvec(GgmlType type, const void* w, std::size_t rows, std::size_t cols, const float* x,
            float* y, Activations activations) {
  compute_traits(type, "type");
  const std::size_t stride = row_bytes(type, cols, "cols");
  const auto* base = static_cast<const std::uint8_t*>(w);
  const auto n = static_cast<std::int64_t>(rows);
  // Fixed chunks of rows; each y[r] is one row's dot product, so the thread count cannot
  // change it.
  if (activations == Activations::q8 && uses_q8_activations(type)) {
    static thread_local Q8Activations xq;  // quantised once, read by every thread
    quantize_q8(x, cols, xq);
    const kernels::Q8View v{xq.q.data(), xq.d.data(), xq.sum.data()};
    const kernels::Q8DotFn dot = kernels::best_q8_dot(type);
#pragma omp parallel for schedule(static, 16)
    for (std::int64_t r = 0; r < n; ++r) {
      y[r] = dot(base + static_cast<std::size_t>(r) * stride, v, cols);
    }
    return;
  }
  const kernels::DotFn dot = kernels::best_dot(type);
#pragma omp parallel for schedule(static, 16)
  for (std::int64_t r = 0; r < n; ++r) {
    y[r] = dot(base + static_cast<std::size_t>(r) * stride, x, cols);
  }
}

}  // namespace masskv::model
