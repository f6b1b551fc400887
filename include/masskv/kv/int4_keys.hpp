// The INT4 selector key format's typed interface (scales as f16), kept for the callers that
// predate kv/key_formats.hpp. The format itself (block layout, scale rule, rounding, error
// bound) is defined there, as KeyFormat::int4; these functions are that format with the
// scales viewed as f16 (their bytes are the same).
#pragma once

#include <cstdint>

#include "masskv/dtype.hpp"
#include "masskv/kv/key_formats.hpp"

namespace masskv::kv::int4 {

constexpr int kBlock = 32;       // values per scale
constexpr int kBlockBytes = 16;  // nibble bytes per block

// Bytes of one row of d values: nibbles, then (separately stored) scales.
constexpr int row_bytes(int d) { return code_bytes(KeyFormat::int4, d); }
constexpr int row_scales(int d) { return d / kBlock; }
constexpr double bytes_per_value() { return (kBlockBytes + 2.0) / kBlock; }

// kv::quantize_row / dequantize_row / dot_row with KeyFormat::int4.
void quantize_row(const float* x, int d, std::uint8_t* packed, f16* scales);
void dequantize_row(const std::uint8_t* packed, const f16* scales, int d, float* out);
float dot_row(const float* q, const std::uint8_t* packed, const f16* scales, int d);

}  // namespace masskv::kv::int4
