// Per-format row encoders and decoders behind kv::quantize_row / dequantize_row
// (masskv/kv/key_formats.hpp). The public functions check d and finiteness first; these
// check only what depends on the values (the range).
#pragma once

#include <cstdint>

namespace masskv::kv::detail {

void quantize_bf16(const float* x, int d, std::uint8_t* codes);
void dequantize_bf16(const std::uint8_t* codes, int d, float* out);
void quantize_int4(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales);
void dequantize_int4(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out);
void quantize_mxfp4(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales);
void dequantize_mxfp4(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out);
void quantize_nvfp4(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales);
void dequantize_nvfp4(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out);
void quantize_mxfp8(const float* x, int d, std::uint8_t* codes, std::uint8_t* scales);
void dequantize_mxfp8(const std::uint8_t* codes, const std::uint8_t* scales, int d, float* out);

}  // namespace masskv::kv::detail
