// Pointer kernels of the selector key dot products (formats: masskv/kv/key_formats.hpp): one
// portable and one AVX2 version per format, dispatched by kv::dot_row_kernel. No std
// templates: the AVX2 translation unit includes this header alone.
#pragma once

#include <cstdint>

namespace masskv::kv::detail {

// sum_i q_i x̂_i over d values of one row (d a multiple of the format's block; bf16's
// `scales` is unused). The AVX2 versions need AVX2 + FMA + F16C: enter after cpu::has_avx2().
float dot_bf16_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                        int d);
float dot_bf16_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d);
float dot_int4_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                        int d);
float dot_int4_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d);
float dot_mxfp4_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                         int d);
float dot_mxfp4_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d);
float dot_nvfp4_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                         int d);
float dot_nvfp4_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d);
float dot_mxfp8_portable(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                         int d);
float dot_mxfp8_avx2(const float* q, const std::uint8_t* codes, const std::uint8_t* scales, int d);

// Twice the E2M1 value of each code (integers -12..12), the table both FP4 dots index, and
// the values of every E4M3 and E8M0 code (NaN codes: NaN), for the block scales.
extern const signed char kE2M1Twice[16];
extern const float* const kE4M3Value;
extern const float* const kE8M0Value;

}  // namespace masskv::kv::detail
