// The learned selector's key cache (docs/design.md §2.8, §2.9): per token and selector group one
// row of d_s projected key values, kept beside the paged KV in the same pages (so forks share
// it and copy it on write exactly like the KV). The row format is the one thing that changes
// with quantisation: every read and write of a row goes through encode_row / score_rows here,
// and the 4-bit formats of §2.9 (INT4, MXFP4, NVFP4: kv/key_formats.hpp, codes then scales in
// one row) are cases of RowFormat next to f32 and bf16.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace masskv::kv {

enum class RowFormat : std::uint8_t { f32, bf16, int4, mxfp4, nvfp4, mxfp8 };
std::string_view to_string(RowFormat f) noexcept;
// "f32" | "bf16" | "int4" | "mxfp4" | "nvfp4" | "mxfp8"; throws Error(invalid_argument,
// argument).
RowFormat parse_row_format(std::string_view name, std::string_view argument);
// Throws Error(invalid_argument, argument) unless dim > 0 fits the format's blocks (the
// block formats: a multiple of 32, NVFP4 of 16).
void check_row_dim(RowFormat f, int dim, std::string_view argument);

// Bytes of one encoded row of `dim` values.
std::size_t row_bytes(RowFormat f, int dim) noexcept;
// Encodes x[0..dim) (finite) into dst[row_bytes(f, dim)]; bf16 rounds to nearest even, the
// 4-bit formats quantise as kv::quantize_row (Error(out_of_range, "k") beyond their range).
void encode_row(RowFormat f, const float* x, int dim, std::byte* dst);
// The stored values as f32 (tests and references).
void decode_row(RowFormat f, const std::byte* src, int dim, float* out);
// out[r] = Σ_c q_c x̂_rc for `rows` rows at src + r * stride_bytes. f32/bf16: in f64 (every
// product of two floats is exact in f64 and the sum runs in 8 lanes, so the AVX2 and the
// portable paths give the same bits, kv/row_scores.hpp; any dim). 4-bit formats: on the
// codes, without decoding (kv::dot_row_kernel, f32 sums per block).
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
