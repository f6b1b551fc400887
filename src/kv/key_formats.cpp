// Selector key formats (masskv/kv/key_formats.hpp): names, checks, dispatch, and the bf16
// reference format. int4 lives in int4_keys.cpp, the FP4 formats in fp4_keys.cpp.
#include "masskv/kv/key_formats.hpp"

#include <cmath>

#include "core/cpu_features.hpp"
#include "kv/key_format_rows.hpp"
#include "kv/key_kernels.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"

namespace masskv::kv {

namespace {

bf16 load_bf16(const std::uint8_t* p) {
  return bf16{static_cast<std::uint16_t>(p[0] | (p[1] << 8))};
}

}  // namespace

namespace detail {

void quantize_bf16(const float* x, int d, std::uint8_t* codes) {
  for (int i = 0; i < d; ++i) {
    const bf16 h = f32_to_bf16(x[i]);
    codes[2 * i] = static_cast<std::uint8_t>(h.bits & 0xff);
    codes[2 * i + 1] = static_cast<std::uint8_t>(h.bits >> 8);
  }
}

void dequantize_bf16(const std::uint8_t* codes, int d, float* out) {
  for (int i = 0; i < d; ++i) out[i] = bf16_to_f32(load_bf16(codes + 2 * i));
}

float dot_bf16_portable(const float* q, const std::uint8_t* codes, const std::uint8_t*, int d) {
  float total = 0;
  for (int i = 0; i < d; ++i) total += q[i] * bf16_to_f32(load_bf16(codes + 2 * i));
  return total;
}

}  // namespace detail

std::string_view to_string(KeyFormat f) noexcept {
  switch (f) {
    case KeyFormat::bf16:
      return "bf16";
    case KeyFormat::int4:
      return "int4";
    case KeyFormat::mxfp4:
      return "mxfp4";
    case KeyFormat::nvfp4:
      return "nvfp4";
    case KeyFormat::mxfp8:
      return "mxfp8";
  }
  return "?";
}

KeyFormat parse_key_format(std::string_view name, std::string_view argument) {
  for (KeyFormat f : {KeyFormat::bf16, KeyFormat::int4, KeyFormat::mxfp4, KeyFormat::nvfp4,
                      KeyFormat::mxfp8}) {
    if (name == to_string(f)) return f;
  }
  fail(ErrorCode::invalid_argument, argument, "unknown selector key format '", name,
       "' (bf16, int4, mxfp4, nvfp4, mxfp8)");
}

void check_key_dim(KeyFormat f, int d, std::string_view argument) {
  require(d > 0 && d % key_block(f) == 0, ErrorCode::invalid_argument, argument, "the ",
          to_string(f), " selector key format needs a positive multiple of ", key_block(f),
          " values per row, got ", d);
}

bool key_encodable(KeyFormat f, float x) {
  const float a = std::fabs(x);
  switch (f) {
    case KeyFormat::bf16:
      return std::isfinite(bf16_to_f32(f32_to_bf16(a)));
    case KeyFormat::int4:
      return std::isfinite(f16_to_f32(f32_to_f16(a / 7.0f)));
    case KeyFormat::nvfp4:
      return a <= kNvfp4Max;
    default:
      return std::isfinite(a);
  }
}

void quantize_row(KeyFormat f, const float* k, int d, std::uint8_t* codes, std::uint8_t* scales) {
  check_key_dim(f, d, "d");
  for (int i = 0; i < d; ++i) {
    require(std::isfinite(k[i]), ErrorCode::non_finite, "k", "k[", i, "] = ", k[i],
            " is not finite");
  }
  switch (f) {
    case KeyFormat::bf16:
      for (int i = 0; i < d; ++i) {
        require(key_encodable(f, k[i]), ErrorCode::out_of_range, "k", "k[", i, "] = ", k[i],
                " overflows bf16");
      }
      return detail::quantize_bf16(k, d, codes);
    case KeyFormat::int4:
      return detail::quantize_int4(k, d, codes, scales);
    case KeyFormat::mxfp4:
      return detail::quantize_mxfp4(k, d, codes, scales);
    case KeyFormat::nvfp4:
      return detail::quantize_nvfp4(k, d, codes, scales);
    case KeyFormat::mxfp8:
      return detail::quantize_mxfp8(k, d, codes, scales);
  }
}

void dequantize_row(KeyFormat f, const std::uint8_t* codes, const std::uint8_t* scales, int d,
                    float* out) {
  check_key_dim(f, d, "d");
  switch (f) {
    case KeyFormat::bf16:
      return detail::dequantize_bf16(codes, d, out);
    case KeyFormat::int4:
      return detail::dequantize_int4(codes, scales, d, out);
    case KeyFormat::mxfp4:
      return detail::dequantize_mxfp4(codes, scales, d, out);
    case KeyFormat::nvfp4:
      return detail::dequantize_nvfp4(codes, scales, d, out);
    case KeyFormat::mxfp8:
      return detail::dequantize_mxfp8(codes, scales, d, out);
  }
}

DotRowFn dot_row_kernel(KeyFormat f) {
  const bool simd = cpu::has_avx2() && cpu::simd_allowed();
  switch (f) {
    case KeyFormat::bf16:
      return simd ? detail::dot_bf16_avx2 : detail::dot_bf16_portable;
    case KeyFormat::int4:
      return simd ? detail::dot_int4_avx2 : detail::dot_int4_portable;
    case KeyFormat::mxfp4:
      return simd ? detail::dot_mxfp4_avx2 : detail::dot_mxfp4_portable;
    case KeyFormat::nvfp4:
      return simd ? detail::dot_nvfp4_avx2 : detail::dot_nvfp4_portable;
    case KeyFormat::mxfp8:
      return simd ? detail::dot_mxfp8_avx2 : detail::dot_mxfp8_portable;
  }
  fail(ErrorCode::invalid_argument, "f", "unknown selector key format ", static_cast<int>(f));
}

float dot_row(KeyFormat f, const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
              int d) {
  check_key_dim(f, d, "d");
  return dot_row_kernel(f)(q, codes, scales, d);
}

}  // namespace masskv::kv
