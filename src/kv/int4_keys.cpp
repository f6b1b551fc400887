// INT4 selector keys (format in masskv/kv/int4_keys.hpp, DESIGN.md §2.9).
#include "masskv/kv/int4_keys.hpp"

#include <cmath>

#include "core/cpu_features.hpp"
#include "kv/int4_kernels.hpp"
#include "masskv/error.hpp"

namespace masskv::kv::int4 {

void quantize_row(const float* x, int d, std::uint8_t* packed, f16* scales) {
  for (int b0 = 0; b0 < d; b0 += kBlock) {
    float mx = 0;
    for (int i = 0; i < kBlock; ++i) mx = std::fmax(mx, std::fabs(x[b0 + i]));
    const f16 s16 = f32_to_f16(mx / 7.0f);
    const float s = f16_to_f32(s16);
    require(std::isfinite(s), ErrorCode::out_of_range, "k", "a block's max |k| = ", mx,
            " exceeds the int4 selector key range (7 * 65504)");
    std::uint8_t* out = packed + b0 / 2;
    for (int k = 0; k < kBlockBytes; ++k) {
      int q[2] = {0, 0};
      for (int half = 0; half < 2; ++half) {
        if (s > 0) {
          const float r = std::nearbyint(x[b0 + k + 16 * half] / s);  // ties to even
          q[half] = static_cast<int>(std::fmin(7.0f, std::fmax(-7.0f, r)));
        }
      }
      out[k] = static_cast<std::uint8_t>((q[0] + 8) | ((q[1] + 8) << 4));
    }
    scales[b0 / kBlock] = s16;
  }
}

void dequantize_row(const std::uint8_t* packed, const f16* scales, int d, float* out) {
  for (int b0 = 0; b0 < d; b0 += kBlock) {
    const float s = f16_to_f32(scales[b0 / kBlock]);
    const std::uint8_t* in = packed + b0 / 2;
    for (int k = 0; k < kBlockBytes; ++k) {
      out[b0 + k] = s * static_cast<float>((in[k] & 0x0f) - 8);
      out[b0 + k + 16] = s * static_cast<float>((in[k] >> 4) - 8);
    }
  }
}

namespace detail {

float dot_row_portable(const float* q, const std::uint8_t* packed, const std::uint16_t* scales,
                       int d) {
  float total = 0;
  for (int b0 = 0; b0 < d; b0 += kBlock) {
    const std::uint8_t* in = packed + b0 / 2;
    float lo = 0, hi = 0;
    for (int k = 0; k < kBlockBytes; ++k) {
      lo += q[b0 + k] * static_cast<float>((in[k] & 0x0f) - 8);
      hi += q[b0 + k + 16] * static_cast<float>((in[k] >> 4) - 8);
    }
    total += f16_to_f32(f16{scales[b0 / kBlock]}) * (lo + hi);
  }
  return total;
}

}  // namespace detail

float dot_row(const float* q, const std::uint8_t* packed, const f16* scales, int d) {
  const auto* s = reinterpret_cast<const std::uint16_t*>(scales);
  if (cpu::has_avx2() && cpu::simd_allowed()) return detail::dot_row_avx2(q, packed, s, d);
  return detail::dot_row_portable(q, packed, s, d);
}

}  // namespace masskv::kv::int4
