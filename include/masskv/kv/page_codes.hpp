// 2-bit page codes: every stored key, per channel, as one of four levels of its page's own range
// (docs/design.md §2.9; the selection lab, docs/study.md "Selection lab"). The range is the
// page summary's min/max (kv/paged_kv.hpp SummariesView), which the bound-based selectors read
// anyway, so a token's code costs head_dim / 4 bytes and nothing else: 1/16 of its f16 K+V.
// The two-stage selector (select::Method::two_stage) scores the tokens of its candidate pages
// on these codes.
//
// For a key x with page range [lo_c, hi_c] per channel c (lo_c <= x_c <= hi_c):
//   code   : c_c = RNE(3 (x_c - lo_c) / (hi_c - lo_c)), in {0, 1, 2, 3}; 0 when hi_c == lo_c;
//   decoded: x̂_c = lo_c + c_c (hi_c - lo_c) / 3;
//   error  : |x_c - x̂_c| <= (hi_c - lo_c) / 6, up to the f32 rounding of the quotient.
// Packing: channel c in byte c / 4, bits 2 (c % 4) .. 2 (c % 4) + 1.
// The range widens as a page fills, so the cache re-encodes a page's earlier keys whenever an
// appended key moves one of its channels' min or max (at most page_size rows, from the stored
// keys): the codes always equal an encoding of the stored keys under the current summary.
#pragma once

#include <cstddef>
#include <cstdint>

namespace masskv::kv {

constexpr int page_code_bytes(int head_dim) { return (head_dim + 3) / 4; }

// Codes of one key row x[0..d) under the range lo/hi (both d values).
void encode_page_codes(const float* x, const float* lo, const float* hi, int d,
                       std::uint8_t* codes);
// x̂ of one row (tests and references).
void decode_page_codes(const std::uint8_t* codes, const float* lo, const float* hi, int d,
                       float* out);

// Per (page, q vector) the affine form of q·x̂ over the page's rows: q·x̂ = base + sum_c
// w_c c_c with base = sum_c q_c lo_c and w_c = q_c (hi_c - lo_c) / 3, so each row costs d
// multiply-adds of 2-bit integers. f64, like the library's other score references.
struct PageCodeScorer {
  double base = 0;
  const double* w = nullptr;  // d weights, owned by the caller
};
// Fills w[0..d) and returns the scorer for q against the range lo/hi.
PageCodeScorer page_code_scorer(const float* q, const float* lo, const float* hi, int d,
                                double* w);
// q·x̂ of one row of codes.
double page_code_score(const PageCodeScorer& s, const std::uint8_t* codes, int d);
// The scorers of nh q vectors (rows of q, d apart) against one range: s[h] =
// page_code_scorer(q + h * d, lo, hi, d, w + h * d), bit-equal (SIMD where the CPU has it).
void page_code_scorers(const float* q, int nh, const float* lo, const float* hi, int d, double* w,
                       PageCodeScorer* s);
// Many rows under many scorers at once, bit-equal to page_code_score (SIMD where the CPU has
// it): out[h * out_stride + t] = q_h·x̂ of row slots[t] (codes at rows + slots[t] *
// page_code_bytes(d)) for the scorers s[0..nh) and t < n. The scorers share the rows' page.
void page_code_scores(const PageCodeScorer* s, int nh, const std::uint8_t* rows,
                      const std::int32_t* slots, int n, int d, double* out,
                      std::size_t out_stride);

}  // namespace masskv::kv
