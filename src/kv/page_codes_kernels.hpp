// Inner loop of the page-code scorer (kv/page_codes.hpp page_code_scores), portable and AVX2,
// shared by page_codes.cpp and the test that holds them bit-equal. Both compute each row's
// score as page_code_score does, channel by channel in f64 from s.base, with a separate
// multiply and add (no fused multiply-add: the AVX2 file is compiled with -ffp-contract=off),
// so the AVX2 form only changes how many rows and heads go through the loop at once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "masskv/kv/page_codes.hpp"

namespace masskv::kv::detail {

// encode_page_codes: the portable loop, and AVX2 eight channels at a time (the same f32
// quotient, product and round-to-nearest-even), bit-equal to it for keys within [lo, hi].
void encode_page_codes_portable(const float* x, const float* lo, const float* hi, int d,
                                std::uint8_t* codes);
void encode_page_codes_avx2(const float* x, const float* lo, const float* hi, int d,
                            std::uint8_t* codes);

// out[h * out_stride + t] = page_code_score(s[h], rows + slots[t] * page_code_bytes(d), d)
// for h < nh, t < n.
void page_code_scores_portable(const PageCodeScorer* s, int nh, const std::uint8_t* rows,
                               const std::int32_t* slots, int n, int d, double* out,
                               std::size_t out_stride);
// The same with AVX2, 16 rows at a time (their codes unpacked once for all nh heads). Enter only
// after cpu::has_avx2().
void page_code_scores_avx2(const PageCodeScorer* s, int nh, const std::uint8_t* rows,
                           const std::int32_t* slots, int n, int d, double* out,
                           std::size_t out_stride);

// s[h] = page_code_scorer(q + h * d, lo, hi, d, w + h * d) for h < nh: the portable loop, and
// AVX2 with the weights four channels at a time and the bases of four heads in the lanes (each
// still summed channel by channel), bit-equal to it.
void page_code_scorers_portable(const float* q, int nh, const float* lo, const float* hi, int d,
                                double* w, PageCodeScorer* s);
void page_code_scorers_avx2(const float* q, int nh, const float* lo, const float* hi, int d,
                            double* w, PageCodeScorer* s);

}  // namespace masskv::kv::detail
