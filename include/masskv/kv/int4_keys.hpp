// Selector key format (DESIGN.md §2.9): per-token keys in INT4 with an fp16 scale per block of
// 32 values. The one definition of the format: the paged cache's selector key store, the
// top-p mass source MassSource::quant_keys and the learned selectors' key cache use it.
//
// A row of d values (d a multiple of 32) is d / 32 blocks. Block of values x_0..x_31:
//   scale  s   = f16(max_i |x_i| / 7), rounded to nearest even (s = 0 when every x_i is 0);
//   values q_i = clamp(round_half_even(x_i / s), -7, 7), symmetric: -8 is never used;
//   bytes      : byte k (k < 16) holds q_k + 8 in its low nibble and q_{k+16} + 8 in its high
//                nibble (16 bytes per block);
//   decoded    : x̂_i = s * q_i (exact in f32).
// Storage: d/2 bytes of nibbles + d/16 bytes of scales per row = 4.5 bits per value (bf16
// keys: 16). Error: |x_i - x̂_i| <= s (1/2 + 2^-20) + 7 * 2^-25: s/2 from rounding, widened
// by the f32 rounding of x_i / s; clamping only trims the block maximum when s rounded below
// max/7, by <= 7 |s - max/7|, which is < s/2 for a normal f16 s and <= 7 * 2^-25 for a
// subnormal one. Blocks whose max|x| / 7 overflows f16 (> 65504) have no encoding.
#pragma once

#include <cstdint>

#include "masskv/dtype.hpp"

namespace masskv::kv::int4 {

constexpr int kBlock = 32;       // values per scale
constexpr int kBlockBytes = 16;  // nibble bytes per block

// Bytes of one row of d values: nibbles, then (separately stored) scales.
constexpr int row_bytes(int d) { return d / 2; }
constexpr int row_scales(int d) { return d / kBlock; }
constexpr double bytes_per_value() { return (kBlockBytes + 2.0) / kBlock; }

// Encodes x[0..d) (d % 32 == 0, finite) into packed[d/2] and scales[d/32]. Throws
// Error(out_of_range, "k") when a block's max|x| / 7 overflows f16.
void quantize_row(const float* x, int d, std::uint8_t* packed, f16* scales);
// x̂ = s * q, written as f32 (tests and references; the kernels never materialise it).
void dequantize_row(const std::uint8_t* packed, const f16* scales, int d, float* out);
// sum_i q_i * x̂_i computed on the nibbles (no decoded copy): per block the integer values
// times q in f32, times the block scale, summed over blocks in f32. AVX2 when available.
float dot_row(const float* q, const std::uint8_t* packed, const f16* scales, int d);

}  // namespace masskv::kv::int4
