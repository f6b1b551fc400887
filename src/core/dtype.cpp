#include "masskv/dtype.hpp"

#include <cmath>

#include "masskv/error.hpp"

namespace masskv {

std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

DType parse_dtype(std::string_view name, std::string_view argument) {
  if (name == "f32") return DType::f32;
  if (name == "f16") return DType::f16;
  if (name == "bf16") return DType::bf16;
  fail(ErrorCode::invalid_argument, argument, "unknown dtype '", name, "' (f32, f16, bf16)");
}

bf16 f32_to_bf16_down(float f) noexcept {
  const bf16 r = f32_to_bf16(f);
  if (std::isnan(f) || bf16_to_f32(r) <= f) return r;
  // r rounded up: step one bf16 ulp toward -inf.
  if (r.bits == 0) return bf16{0x8001u};                             // +0 -> -min subnormal
  if (r.bits & 0x8000u) return bf16{static_cast<std::uint16_t>(r.bits + 1)};  // more negative
  return bf16{static_cast<std::uint16_t>(r.bits - 1)};
}

bf16 f32_to_bf16_up(float f) noexcept {
  // -bf16_down(-f) == bf16_up(f): negation is exact in both formats.
  const bf16 d = f32_to_bf16_down(-f);
  return bf16{static_cast<std::uint16_t>(d.bits ^ 0x8000u)};
}

float f16_to_f32(f16 h) noexcept {
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

f16 f32_to_f16(float f) noexcept {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return f16{static_cast<std::uint16_t>(sign | 0x7e00u)};  // nan
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

}  // namespace masskv
