// Row formats of the learned selector's key cache (kv/key_rows.hpp). The score kernels are the
// f64 row kernels the selectors' exact scores use too (kv/row_scores.hpp): one summation order
// for every path.
#include "masskv/kv/key_rows.hpp"

#include <cstring>

#include "core/cpu_features.hpp"
#include "kv/row_scores.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/key_formats.hpp"

namespace masskv::kv {

namespace {

bool quantised(RowFormat f) { return f != RowFormat::f32 && f != RowFormat::bf16; }

// The key_formats.hpp format of a quantised row format.
KeyFormat key_format(RowFormat f) {
  return f == RowFormat::int4    ? KeyFormat::int4
         : f == RowFormat::mxfp4 ? KeyFormat::mxfp4
         : f == RowFormat::mxfp8 ? KeyFormat::mxfp8
                                 : KeyFormat::nvfp4;
}

std::uint8_t* bytes(std::byte* p) { return reinterpret_cast<std::uint8_t*>(p); }
const std::uint8_t* bytes(const std::byte* p) { return reinterpret_cast<const std::uint8_t*>(p); }

}  // namespace

std::string_view to_string(RowFormat f) noexcept {
  switch (f) {
    case RowFormat::f32:
      return "f32";
    case RowFormat::bf16:
      return "bf16";
    case RowFormat::int4:
      return "int4";
    case RowFormat::mxfp4:
      return "mxfp4";
    case RowFormat::nvfp4:
      return "nvfp4";
    case RowFormat::mxfp8:
      return "mxfp8";
  }
  return "?";
}

RowFormat parse_row_format(std::string_view name, std::string_view argument) {
  for (RowFormat f : {RowFormat::f32, RowFormat::bf16, RowFormat::int4, RowFormat::mxfp4,
                      RowFormat::nvfp4, RowFormat::mxfp8}) {
    if (name == to_string(f)) return f;
  }
  fail(ErrorCode::invalid_argument, argument, "unknown selector key format '", name,
       "' (f32, bf16, int4, mxfp4, nvfp4, mxfp8)");
}

void check_row_dim(RowFormat f, int dim, std::string_view argument) {
  require(dim > 0, ErrorCode::invalid_argument, argument, "must be > 0, got ", dim);
  if (quantised(f)) check_key_dim(key_format(f), dim, argument);
}

std::size_t row_bytes(RowFormat f, int dim) noexcept {
  if (quantised(f)) return static_cast<std::size_t>(kv::row_bytes(key_format(f), dim));
  return static_cast<std::size_t>(dim) * (f == RowFormat::f32 ? 4 : 2);
}

void encode_row(RowFormat f, const float* x, int dim, std::byte* dst) {
  if (quantised(f)) {
    const KeyFormat k = key_format(f);
    quantize_row(k, x, dim, bytes(dst), bytes(dst) + code_bytes(k, dim));
    return;
  }
  if (f == RowFormat::f32) {
    std::memcpy(dst, x, static_cast<std::size_t>(dim) * sizeof(float));
    return;
  }
  for (int c = 0; c < dim; ++c) {
    const std::uint16_t b = f32_to_bf16(x[c]).bits;
    std::memcpy(dst + 2 * c, &b, 2);
  }
}

void decode_row(RowFormat f, const std::byte* src, int dim, float* out) {
  if (quantised(f)) {
    const KeyFormat k = key_format(f);
    dequantize_row(k, bytes(src), bytes(src) + code_bytes(k, dim), dim, out);
    return;
  }
  if (f == RowFormat::f32) {
    std::memcpy(out, src, static_cast<std::size_t>(dim) * sizeof(float));
    return;
  }
  for (int c = 0; c < dim; ++c) {
    bf16 b;
    std::memcpy(&b.bits, src + 2 * c, 2);
    out[c] = bf16_to_f32(b);
  }
}

void score_rows(RowFormat f, const float* q, const std::byte* src, std::int64_t stride_bytes,
                int rows, int dim, double* out) noexcept {
  using namespace detail;
  if (quantised(f)) {
    const KeyFormat k = key_format(f);
    const DotRowFn dot = dot_row_kernel(k);
    const int codes = code_bytes(k, dim);
    for (int r = 0; r < rows; ++r) {
      const std::uint8_t* row = bytes(src) + r * stride_bytes;
      out[r] = dot(q, row, row + codes, dim);
    }
    return;
  }
  const bool simd = dim % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed();
  // Rows are aligned to their element size: the pool is 64-byte aligned and row_bytes is a
  // multiple of the element size.
  if (f == RowFormat::f32) {
    const auto* k = reinterpret_cast<const float*>(src);
    const std::int64_t stride = stride_bytes / 4;
    (simd ? score_rows_avx2_f32 : score_rows_portable_f32)(k, stride, rows, dim, q, 1.0, out);
    return;
  }
  const auto* k = reinterpret_cast<const std::uint16_t*>(src);
  const std::int64_t stride = stride_bytes / 2;
  (simd ? score_rows_avx2_bf16 : score_rows_portable_bf16)(k, stride, rows, dim, q, 1.0, out);
}

}  // namespace masskv::kv
