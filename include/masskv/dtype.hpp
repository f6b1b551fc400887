// Storage types of the KV cache. Arithmetic is always f32 (kernels) or f64 (references);
// f16 and bf16 are storage only, converted with round-to-nearest-even.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace masskv {

enum class DType : std::uint8_t { f32, f16, bf16 };

constexpr std::size_t dtype_size(DType t) noexcept { return t == DType::f32 ? 4 : 2; }
std::string_view to_string(DType t) noexcept;
// Parses "f32" | "f16" | "bf16"; throws Error(invalid_argument, argument) otherwise.
DType parse_dtype(std::string_view name, std::string_view argument = "dtype");

// Storage wrappers: distinct types so templates can dispatch on them.
struct f16 {
  std::uint16_t bits;
};
struct bf16 {
  std::uint16_t bits;
};

constexpr float bf16_to_f32(bf16 h) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(h.bits) << 16);
}

constexpr bf16 f32_to_bf16(float f) noexcept {
  std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<std::uint16_t>((u >> 16) | 0x40u)};
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return bf16{static_cast<std::uint16_t>(u >> 16)};
}

// Rounds toward -inf / +inf: for summaries stored in bf16, min must round down and max up
// so the page bound of docs/design.md §2.3 stays an upper bound (§2.2).
bf16 f32_to_bf16_down(float f) noexcept;
bf16 f32_to_bf16_up(float f) noexcept;

// Inline: the cache's append path converts every stored element.
inline float f16_to_f32(f16 h) noexcept {
  const std::uint32_t sign = (static_cast<std::uint32_t>(h.bits) & 0x8000u) << 16;
  const std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));  // inf/nan
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
  if (man == 0) return std::bit_cast<float>(sign);
  // Subnormal: value = man * 2^-24, exact in f32.
  const float v = static_cast<float>(man) * 0x1p-24f;
  return sign ? -v : v;
}

inline f16 f32_to_f16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u)};   // nan
  if (a >= 0x477ff000u) return f16{static_cast<std::uint16_t>(sign | 0x7c00u)};  // overflow -> inf
  if (a < 0x38800000u) {
    // Result is subnormal or zero: round a * 2^24 to an integer, ties to even.
    const float scaled = std::bit_cast<float>(a) * 0x1p24f;
    const float r = std::nearbyint(scaled);  // default rounding mode: ties to even
    return f16{static_cast<std::uint16_t>(sign | static_cast<std::uint16_t>(r))};
  }
  // Normal: rebias the exponent and round the 13 dropped mantissa bits to nearest even.
  std::uint32_t v = a - (112u << 23);
  v += 0xfffu + ((v >> 13) & 1u);
  return f16{static_cast<std::uint16_t>(sign | (v >> 13))};
}

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<f16>() {
  return DType::f16;
}
template <>
constexpr DType dtype_of<bf16>() {
  return DType::bf16;
}

inline float to_f32(float x) noexcept { return x; }
inline float to_f32(f16 x) noexcept { return f16_to_f32(x); }
inline float to_f32(bf16 x) noexcept { return bf16_to_f32(x); }

template <class T>
T from_f32(float x) noexcept;
template <>
inline float from_f32<float>(float x) noexcept {
  return x;
}
template <>
inline f16 from_f32<f16>(float x) noexcept {
  return f32_to_f16(x);
}
template <>
inline bf16 from_f32<bf16>(float x) noexcept {
  return f32_to_bf16(x);
}

// Calls f(T{}) with T the storage type of `t`.
template <class F>
decltype(auto) visit_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f16:
      return f(f16{});
    case DType::bf16:
      return f(bf16{});
    case DType::f32:
      break;
  }
  return f(float{});
}

}  // namespace masskv
