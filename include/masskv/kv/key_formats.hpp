// Selector key formats (docs/design.md §2.9): the per-token keys the selectors score, kept beside
// the KV and quantised on append. The one definition of every format; the paged cache's
// selector key store, MassSource::quant_keys and the learned selectors' key cache use it.
//
// A row of d values is stored as two byte arrays, `codes` (code_bytes(f, d)) and `scales`
// (scale_bytes(f, d)); multi-byte fields are little-endian. "RNE" is round to nearest, ties
// to even. x is an input value, x̂ its decoded value, |x - x̂| the bound each test checks.
//
// bf16 (the reference of the others; d any):
//   codes  : bf16(x_i) RNE, 2 bytes per value; no scales.
//   decoded: x̂_i = bf16 value (exact in f32).       16 bits per value.
//   error  : |x - x̂| <= max(2^-8 |x|, 2^-134) (half an ulp of an 8-bit significand; the
//            second term for f32 subnormals). |x| beyond the largest bf16 has no encoding.
//
// int4 (fp16 scale per 32 values; d % 32 == 0). Block of values x_0..x_31:
//   scale  : s = f16(max_i |x_i| / 7) RNE (s = 0 when every x_i is 0), 2 bytes per block;
//   values : q_i = clamp(RNE(f32(x_i / s)), -7, 7), symmetric: -8 is never used;
//   codes  : byte k (k < 16) holds q_k + 8 in its low nibble and q_{k+16} + 8 in its high
//            nibble (16 bytes per block);
//   decoded: x̂_i = s q_i (exact in f32).            4.5 bits per value.
//   error  : |x - x̂| <= s (1/2 + 2^-20) + 7 * 2^-25: s/2 from rounding, widened by the f32
//            rounding of x_i / s; clamping only trims the block maximum when s rounded below
//            max/7, by <= 7 |s - max/7|, which is < s/2 for a normal f16 s and <= 7 * 2^-25
//            for a subnormal one. Blocks whose max|x| / 7 overflows f16 (> 65504) have no
//            encoding.
//
// The two FP4 formats store E2M1 values (OCP Microscaling Formats spec v1.0, §5.3.3): 4 bits
// s.ee.m, exponent bias 1, no inf or NaN; magnitudes by code 0..7: {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
// Value i of a row sits in byte i / 2, low nibble for even i (the packing of the OCP MX and
// NVIDIA FP4 tensors). A block with effective scale S (a positive f32) encodes
//   v_i = E2M1 RNE of x_i / S, saturating to +-6 (the sign is kept, so -0 stays -0);
// the rounding is exact: |x_i| is compared with S times the grid midpoints, exact products in
// f32 for every S these formats produce. Decoded x̂_i = S v_i, exact in f32. Per value
//   |x - x̂| <= max(S, |x| - 6S)
// (half the grid spacing, at most 2 between 4 and 6, when |x| <= 6S; the saturation error
// beyond).
//
// mxfp4 (OCP MX v1.0 MXFP4: E2M1 values, E8M0 shared scale per 32; d % 32 == 0):
//   scale  : S = 2^X, X = floor(log2 max_i |x_i|) - 2 (the spec's §6.3 rule: the largest
//            power of two <= max, divided by E2M1's largest power of two 4), clamped to
//            >= -127; X = -127 for an all-zero block. Stored as E8M0, 1 byte per block.
//   bound  : max |x| < 8S, so |x - x̂| < 2S <= max_i |x_i| / 2 (the spec's floor rule
//            saturates values in (6S, 8S); others round to the finer grid it buys).
//                                                     4.25 bits per value.
// nvfp4 (NVIDIA NVFP4: E2M1 values, E4M3 scale per 16, and NVFP4's f32 second-level scale,
// which is per tensor: here the key cache of a layer is the tensor and its scale is fixed at 1,
// so no row is ever rescaled by a later append and nothing per row is stored; d % 16 == 0):
//   block  : s_b = E4M3 RNE of f32(max_b |x| / 6) (<= 448 within the range, so never
//            saturating); S = s_b, 1 byte per block.
//   bound  : |x| - 6S <= 0.41 S for a normal s_b (E4M3 rounds relatively by <= 2^-4), and
//            <= 6 * 2^-10 (1 + 2^-20) for a subnormal or zero s_b (a block whose max is below
//            6 * 2^-6 = 0.09375: there the error is absolute, at most about 0.0059).
//   range  : rows with max |x| > kNvfp4Max = 6 * 448 = 2688 have no encoding (the largest
//            block the E4M3 scale reaches). 4.5 bits per value, as int4 (a scale per row would
//            add 32 / d bits: docs/design.md §2.9).
//
// mxfp8 (OCP MX v1.0 MXFP8 with E4M3 elements: E4M3 values, E8M0 shared scale per 32;
// d % 32 == 0; DeepSeek's DSA indexer keeps its keys in FP8 E4M3 too):
//   scale  : S = 2^X, X = floor(log2 max_i |x_i|) - 8 (E4M3's largest power of two is 2^8),
//            clamped to >= -127; X = -127 for an all-zero block. E8M0, 1 byte per block.
//   values : v_i = E4M3 RNE of x_i / S (exact quotient), saturating to +-448 (|x| / S < 512,
//            so only values in (448 S, 512 S) saturate); 1 byte each. Decoded x̂_i = S v_i.
//   bound  : |x - x̂| <= max(2^-4 |x|, 2^-10 S) when |x| <= 448 S (E4M3 rounds relatively by
//            <= 2^-4, subnormals absolutely by half their spacing 2^-9), |x| - 448 S (< 64 S)
//            beyond.                                 8.25 bits per value (1.94x under bf16).
#pragma once

#include <cstdint>
#include <string_view>

namespace masskv::kv {

enum class KeyFormat : std::uint8_t { bf16, int4, mxfp4, nvfp4, mxfp8 };

// The largest magnitude an nvfp4 row may hold: 6 (E2M1) * 448 (E4M3) at tensor scale 1.
inline constexpr float kNvfp4Max = 2688.0f;

std::string_view to_string(KeyFormat f) noexcept;
// Parses "bf16" | "int4" | "mxfp4" | "nvfp4" | "mxfp8"; throws Error(invalid_argument, argument).
KeyFormat parse_key_format(std::string_view name, std::string_view argument);

// Values per block: a row's d must be a positive multiple.
constexpr int key_block(KeyFormat f) {
  return f == KeyFormat::bf16 ? 1 : f == KeyFormat::nvfp4 ? 16 : 32;
}
constexpr int code_bytes(KeyFormat f, int d) {
  return f == KeyFormat::bf16 ? 2 * d : f == KeyFormat::mxfp8 ? d : d / 2;
}
constexpr int scale_bytes(KeyFormat f, int d) {
  switch (f) {
    case KeyFormat::int4:
      return 2 * (d / 32);
    case KeyFormat::mxfp4:
    case KeyFormat::mxfp8:
      return d / 32;
    case KeyFormat::nvfp4:
      return d / 16;
    default:
      return 0;
  }
}
// Bytes of one row: codes plus scales.
constexpr int row_bytes(KeyFormat f, int d) { return code_bytes(f, d) + scale_bytes(f, d); }
constexpr double bytes_per_value(KeyFormat f, int d) {
  return static_cast<double>(row_bytes(f, d)) / d;
}

// Throws Error(invalid_argument, argument) unless d > 0 and d % key_block(f) == 0.
void check_key_dim(KeyFormat f, int d, std::string_view argument);
// Whether a row holding a value of magnitude |x| (finite) can be encoded: the range limits
// above (int4: f16(|x| / 7) finite; bf16: bf16(|x|) finite; nvfp4: |x| <= kNvfp4Max).
bool key_encodable(KeyFormat f, float x);

// Encodes k[0..d) into codes[code_bytes(f, d)] and scales[scale_bytes(f, d)] (bf16: scales
// unused, may be null). Throws Error(invalid_argument, "d") for a d off the block,
// Error(non_finite, "k") on NaN/inf and Error(out_of_range, "k") beyond the format's range.
void quantize_row(KeyFormat f, const float* k, int d, std::uint8_t* codes, std::uint8_t* scales);
// x̂ as f32 (tests and references; the kernels never materialise it).
void dequantize_row(KeyFormat f, const std::uint8_t* codes, const std::uint8_t* scales, int d,
                    float* out);
// sum_i q_i x̂_i computed on the codes, no decoded copy: per block the code values (a table
// of the E2M1 values, the int4 integers, or the bf16 bits) times q, summed in f32, times the
// block scale. AVX2 when the CPU has it. Throws Error(invalid_argument, "d") like quantize_row.
float dot_row(KeyFormat f, const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
              int d);
// The kernel dot_row enters for format f (AVX2 or scalar, chosen once), for loops over many
// rows: no argument checks, d must already satisfy check_key_dim.
using DotRowFn = float (*)(const float* q, const std::uint8_t* codes, const std::uint8_t* scales,
                           int d);
DotRowFn dot_row_kernel(KeyFormat f);

// Scalar conversions of the FP4 formats' parts (OCP MX v1.0 §5.3, OCP FP8 E4M3).
namespace fp {

// E2M1 code (s.ee.m) of x: RNE, saturating to +-6, the sign of -0 kept. Throws
// Error(non_finite, "x") on NaN/inf.
std::uint8_t f32_to_e2m1(float x);
float e2m1_to_f32(std::uint8_t code);  // the low 4 bits
// E4M3 (bias 7, no inf; S.1111.111 is NaN; largest 448, smallest subnormal 2^-9) code of x:
// RNE, saturating to +-448 (PTX's satfinite). Throws Error(non_finite, "x") on NaN/inf.
std::uint8_t f32_to_e4m3(float x);
float e4m3_to_f32(std::uint8_t code);  // NaN for 0x7f / 0xff
// E8M0 (2^(code - 127), code 0..254; 0xff is NaN) of 2^e, e clamped to [-127, 127].
std::uint8_t e8m0_of_exponent(int e);
// E8M0 of x >= 0 rounded toward zero (the largest power of two <= x, as the MX scale rule
// takes it; PTX's cvt.rz.ue8m0), clamped to [2^-127, 2^127]; 0 gives 2^-127. Throws
// Error(non_finite, "x") on NaN/inf, Error(invalid_argument, "x") when x < 0.
std::uint8_t f32_to_e8m0(float x);
float e8m0_to_f32(std::uint8_t code);  // NaN for 0xff

}  // namespace fp

}  // namespace masskv::kv
