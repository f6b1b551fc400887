// INT4 selector keys (format: KeyFormat::int4 in masskv/kv/key_formats.hpp, docs/design.md §2.9).
#include "masskv/kv/int4_keys.hpp"

#include <cmath>

#include "kv/key_format_rows.hpp"
#include "kv/key_kernels.hpp"
#include "masskv/error.hpp"

namespace masskv::kv {

namespace {

f16 load_f16(const std::uint8_t* p) { return f16{static_cast<std::uint16_t>(p[0] | (p[1] << 8))}; }

}  // namespace

namespace detail {

void quantize_int4(const float* x, int d, std::uint8_t* packed, std::uint8_t* scales) {
  for (int b0 = 0; b0 < d; b0 += int4::kBlock) {
    float mx = 0;
    for (int i = 0; i < int4::kBlock; ++i) mx = std::fmax(mx, std::fabs(x[b0 + i]));
    const f16 s16 = f32_to_f16(mx / 7.0f);
    const float s = f16_to_f32(s16);
    require(std::isfinite(s), ErrorCode::out_of_range, "k", "a block's max |k| = ", mx,
            " exceeds the int4 selector key range (7 * 65504)");
    std::uint8_t* out = packed + b0 / 2;
    for (int k = 0; k < int4::kBlockBytes; ++k) {
      int q[2] = {0, 0};
      for (int half = 0; half < 2; ++half) {
        if (s > 0) {
          const float r = std::nearbyint(x[b0 + k + 16 * half] / s);  // ties to even
          q[half] = static_cast<int>(std::fmin(7.0f, std::fmax(-7.0f, r)));
        }
      }
      out[k] = static_cast<std::uint8_t>((q[0] + 8) | ((q[1] + 8) << 4));
    }
    std::uint8_t* sb = scales + 2 * (b0 / int4::kBlock);
    sb[0] = static_cast<std::uint8_t>(s16.bits & 0xff);
    sb[1] = static_cast<std::uint8_t>(s16.bits >> 8);
  }
}

void dequantize_int4(const std::uint8_t* packed, const std::uint8_t* scales, int d, float* out) {
  for (int b0 = 0; b0 < d; b0 += int4::kBlock) {
    const float s = f16_to_f32(load_f16(scales + 2 * (b0 / int4::kBlock)));
    const std::uint8_t* in = packed + b0 / 2;
    for (int k = 0; k < int4::kBlockBytes; ++k) {
      out[b0 + k] = s * static_cast<float>((in[k] & 0x0f) - 8);
      out[b0 + k + 16] = s * static_cast<float>((in[k] >> 4) - 8);
    }
  }
}

float dot_int4_portable(const float* q, const std::uint8_t* packed, const std::uint8_t* scales,
                        int d) {
  float total = 0;
  for (int b0 = 0; b0 < d; b0 += int4::kBlock) {
    const std::uint8_t* in = packed + b0 / 2;
    float lo = 0, hi = 0;
    for (int k = 0; k < int4::kBlockBytes; ++k) {
      lo += q[b0 + k] * static_cast<float>((in[k] & 0x0f) - 8);
      hi += q[b0 + k + 16] * static_cast<float>((in[k] >> 4) - 8);
    }
    total += f16_to_f32(load_f16(scales + 2 * (b0 / int4::kBlock))) * (lo + hi);
  }
  return total;
}

}  // namespace detail

namespace int4 {

// f16 objects may be read and written through unsigned char pointers: the byte interface
// serves the typed one without a copy.
void quantize_row(const float* x, int d, std::uint8_t* packed, f16* scales) {
  kv::quantize_row(KeyFormat::int4, x, d, packed, reinterpret_cast<std::uint8_t*>(scales));
}

void dequantize_row(const std::uint8_t* packed, const f16* scales, int d, float* out) {
  kv::dequantize_row(KeyFormat::int4, packed, reinterpret_cast<const std::uint8_t*>(scales), d,
                     out);
}

float dot_row(const float* q, const std::uint8_t* packed, const f16* scales, int d) {
  return kv::dot_row(KeyFormat::int4, q, packed, reinterpret_cast<const std::uint8_t*>(scales), d);
}

}  // namespace int4

}  // namespace masskv::kv
