// Pointer kernels of the INT4 selector key dot product (format: masskv/kv/int4_keys.hpp).
// No std templates: the AVX2 translation unit includes this header alone.
#pragma once

#include <cstdint>

namespace masskv::kv::int4::detail {

// sum_i q_i * s_b * (nibble_i - 8) over d values (d % 32 == 0); scales are f16 bits.
float dot_row_portable(const float* q, const std::uint8_t* packed, const std::uint16_t* scales,
                       int d);
// AVX2 + FMA + F16C. Enter only after cpu::has_avx2().
float dot_row_avx2(const float* q, const std::uint8_t* packed, const std::uint16_t* scales, int d);

}  // namespace masskv::kv::int4::detail
