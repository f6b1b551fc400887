// The learned selector's key cache (DESIGN.md §2.8, §2.9): per token and selector group one
// row of d_s projected key values, kept beside the paged KV in the same pages (so forks share
// it and copy it on write exactly like the KV). The row format is the one thing that changes
// with quantisation: every read and write of a row goes through encode_row / score_rows here,
// so a new format (INT4, MXFP4, NVFP4 of §2.9) is one more case of RowFormat in key_rows.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace masskv::kv {

enum class RowFormat : std::uint8_t { f32, bf16 };
std::string_view to_string(RowFormat f) noexcept;
// "f32" | "bf16"; throws Error(invalid_argument, argument) otherwise.
RowFormat parse_row_format(std::string_view name, std::string_view argument);

// Bytes of one encoded row of `dim` values.
std::size_t row_bytes(RowFormat f, int dim) noexcept;
// Encodes x[0..dim) (finite) into dst[row_bytes(f, dim)]; bf16 rounds to nearest even.
void encode_row(RowFormat f, const float* x, int dim, std::byte* dst) noexcept;
// The stored values as f32 (tests and references).
void decode_row(RowFormat f, const std::byte* src, int dim, float* out) noexcept;
// out[r] = Σ_c q_c x̂_rc for `rows` rows at src + r * stride_bytes, in f64: every product of
// two floats is exact in f64 and the sum runs in 8 lanes, so the AVX2 and the portable paths
// give the same bits (select/row_kernels.hpp); any dim.
void score_rows(RowFormat f, const float* q, const std::byte* src, std::int64_t stride_bytes,
                int rows, int dim, double* out) noexcept;

// Rows of a pool laid out [page][group][slot][row_bytes]: one group's page is one burst.
struct KeyRowsView {
  const std::byte* data = nullptr;
  RowFormat format = RowFormat::f32;
  int num_pages = 0, groups = 0, page_size = 0, dim = 0;

  bool empty() const { return data == nullptr; }
  std::size_t row_bytes() const { return kv::row_bytes(format, dim); }
  const std::byte* row(std::int32_t page, int group, int slot) const {
    const auto r = (static_cast<std::size_t>(page) * static_cast<std::size_t>(groups) +
                    static_cast<std::size_t>(group)) *
                       static_cast<std::size_t>(page_size) +
                   static_cast<std::size_t>(slot);
    return data + r * row_bytes();
  }
};

}  // namespace masskv::kv
