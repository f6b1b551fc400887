// Inner loops of the page codes (kv/page_codes.hpp), portable and AVX2, shared by
// page_codes.cpp and the tests that hold them bit-equal.
#pragma once

#include <cstddef>
#include <cstdint>

#include "masskv/kv/page_codes.hpp"
#include "masskv/kv/paged_kv.hpp"

namespace masskv::kv::detail {

// encode_page_codes: the portable loop, and AVX2 eight channels at a time (the same f32
// quotient, product and round-to-nearest-even), bit-equal to it.
void encode_page_codes_portable(const float* x, const float* lo, const float* hi, int d,
                                std::uint8_t* codes);
void encode_page_codes_avx2(const float* x, const float* lo, const float* hi, int d,
                            std::uint8_t* codes);

// page_code_scores: row by row through page_code_score, and AVX2 (d % 16 == 0): eight rows at
// a time, each row's codes unpacked once to 16-bit v_c for every query, I by 16-bit
// multiply-adds (exact: |q8 v| <= 127 * 765), then the definition's four f64 operations in
// its order (no FMA: the file is compiled with -ffp-contract=off). Enter the AVX2 one only
// after cpu::has_avx2().
void page_code_scores_portable(const CodeQuery* q, int nh, const PageRange8& r,
                               const std::uint8_t* rows, const std::int32_t* slots, int n, int d,
                               double* out, std::size_t out_stride);
void page_code_scores_avx2(const CodeQuery* q, int nh, const PageRange8& r,
                           const std::uint8_t* rows, const std::int32_t* slots, int n, int d,
                           double* out, std::size_t out_stride);

// code_scores: code_score per row, and AVX2 four rows at a time (bit-equal).
void code_scores_portable(double unit, std::int32_t Q, const PageRange8& r,
                          const std::int32_t* I, int n, double* out);
void code_scores_avx2(double unit, std::int32_t Q, const PageRange8& r, const std::int32_t* I,
                      int n, double* out);

// channel_code_sums: channel by channel over every page, and AVX2 (page_size 8 to 64; other
// sizes go to the portable loop): page by page and head by head, the page's slots in 1–8
// vectors of eight held in registers across the chosen channels (each 2-bit code shifted into
// its lane), += q8_c (3 a_c) + code · q8_c (b_c − a_c), stored once: the same exact int32
// sums. Enter the AVX2 one only after cpu::has_avx2().
void channel_code_sums_portable(const PageCodesView& pc, int head, const std::int32_t* phys,
                                std::int64_t n, const std::int32_t* ch, int r, const CodeQuery* q,
                                int nh, std::int32_t* I);
void channel_code_sums_avx2(const PageCodesView& pc, int head, const std::int32_t* phys,
                            std::int64_t n, const std::int32_t* ch, int r, const CodeQuery* q,
                            int nh, std::int32_t* I);

}  // namespace masskv::kv::detail
