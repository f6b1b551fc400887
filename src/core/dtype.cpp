#include "masskv/dtype.hpp"

#include <cmath>

#include "masskv/error.hpp"

namespace masskv {

std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
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
  if (r.bits == 0) return bf16{0x8001u};  // +0 -> -min subnormal
  if (r.bits & 0x8000u) return bf16{static_cast<std::uint16_t>(r.bits + 1)};  // more negative
  return bf16{static_cast<std::uint16_t>(r.bits - 1)};
}

bf16 f32_to_bf16_up(float f) noexcept {
  // -bf16_down(-f) == bf16_up(f): negation is exact in both formats.
  const bf16 d = f32_to_bf16_down(-f);
  return bf16{static_cast<std::uint16_t>(d.bits ^ 0x8000u)};
}

}  // namespace masskv
