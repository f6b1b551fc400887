// Row formats of the learned selector's key cache (kv/key_rows.hpp). The score kernels are the
// selectors' f64 row kernels (select/row_kernels.hpp): one summation order for every path.
#include "masskv/kv/key_rows.hpp"

#include <cstring>

#include "core/cpu_features.hpp"
#include "masskv/dtype.hpp"
#include "masskv/error.hpp"
#include "select/row_kernels.hpp"

namespace masskv::kv {

std::string_view to_string(RowFormat f) noexcept {
  switch (f) {
    case RowFormat::f32:
      return "f32";
    case RowFormat::bf16:
      return "bf16";
  }
  return "?";
}

RowFormat parse_row_format(std::string_view name, std::string_view argument) {
  if (name == "f32") return RowFormat::f32;
  if (name == "bf16") return RowFormat::bf16;
  fail(ErrorCode::invalid_argument, argument, "unknown selector key format '", name,
       "' (f32, bf16)");
}

std::size_t row_bytes(RowFormat f, int dim) noexcept {
  return static_cast<std::size_t>(dim) * (f == RowFormat::f32 ? 4 : 2);
}

void encode_row(RowFormat f, const float* x, int dim, std::byte* dst) noexcept {
  if (f == RowFormat::f32) {
    std::memcpy(dst, x, static_cast<std::size_t>(dim) * sizeof(float));
    return;
  }
  for (int c = 0; c < dim; ++c) {
    const std::uint16_t b = f32_to_bf16(x[c]).bits;
    std::memcpy(dst + 2 * c, &b, 2);
  }
}

void decode_row(RowFormat f, const std::byte* src, int dim, float* out) noexcept {
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
  using namespace select::detail;
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
