// Page codes: every stored key, per channel, as one of four levels of its page's range, the
// ranges themselves held on an 8-bit grid (docs/design.md §2.9; the selection lab,
// docs/study.md "Selection lab"). What the token-level selector (select::Method::token_codes,
// and two_stage's token stage) reads: d / 4 bytes a token plus 2 d + 8 bytes a page and kv
// head, 9.6 % of the f16 K+V at page 16, d 64.
//
// Ranges (per page and kv head, from the f32 summary min m_c / max M_c; round_range8): the
// grid lo = min_c m_c, step = the smallest float with fma(255, step, lo) >= max_c M_c (0 when
// the two are equal); per channel the codes a_c = the largest with dequant8(a_c) <= m_c and
// b_c = the smallest with dequant8(b_c) >= M_c (the BoundStore8 rounding of
// select/compact_bounds.hpp, whose home this is). So [l_c, u_c] = [dequant8(a_c),
// dequant8(b_c)] holds every key of the page.
// Codes (encode_page_codes): c_c = RNE(3 (x_c - l_c) / (u_c - l_c)) in {0, 1, 2, 3}; 0 when
//   u_c == l_c. Packing: channel c in byte c / 4, bits 2 (c % 4) .. 2 (c % 4) + 1.
// Decoded key, on the grid's thirds: v_c = 3 a_c + c_c (b_c - a_c) in [0, 765],
//   x̂_c = lo + step v_c / 3.
// Score of a query q (already scaled) against a row, in integers: q's int8 levels
//   q8_c = RNE(q_c · 127 / max_c |q_c|) (all 0 for q = 0), unit = max_c |q_c| / 127,
//   Q = sum_c q8_c, I = sum_c q8_c v_c (exact int32), and in f64, each operation rounded once:
//   score = unit · (lo · Q + (step / 3) · I) ≈ q·x̂.
// The integers are exact on any host or GPU and the last four f64 operations are written out
// in that order everywhere (CPU scalar, AVX2, CUDA), so every implementation gives the same
// scores, bit for bit, and the same lists.
// The ranges widen as a page fills, so the cache re-encodes a page's earlier keys whenever an
// appended key changes its range codes or grid (at most page_size rows, from the stored keys):
// the codes always equal an encoding of the stored keys under the current range.
#pragma once

#include <cstddef>
#include <cstdint>

namespace masskv::kv {

constexpr int page_code_bytes(int head_dim) { return (head_dim + 3) / 4; }

// Code i of a packed run of 2-bit codes (byte i / 4, bits 2 (i % 4)): channel i of a row, or
// slot i of a channel-major word (PageCodesView::chan_codes).
inline int code_of(const std::uint8_t* packed, int i) {
  return (packed[i >> 2] >> (2 * (i & 3))) & 3;
}

// The value of an 8-bit range code: fma(code, step, lo) in f32, one rounding.
float dequant8(std::uint8_t code, float lo, float step);

// One page and kv head's range on its 8-bit grid.
struct PageRange8 {
  float lo = 0, step = 0;
  const std::uint8_t* a = nullptr;  // d min codes
  const std::uint8_t* b = nullptr;  // d max codes
};
// Rounds the f32 summary min m / max M (d values each) onto the grid: a, b (d codes each) and
// grid[0] = lo, grid[1] = step. Non-finite summaries (a page without tokens) give all zeros.
void round_range8(const float* m, const float* M, int d, std::uint8_t* a, std::uint8_t* b,
                  float* grid);
// The range's channel bounds as floats: lo_out[c] = dequant8(a_c), hi_out[c] = dequant8(b_c).
void range_bounds(const PageRange8& r, int d, float* lo_out, float* hi_out);

// Codes of one key row x[0..d) under the channel bounds lo/hi (range_bounds' output).
void encode_page_codes(const float* x, const float* lo, const float* hi, int d,
                       std::uint8_t* codes);
// x̂ of one row (tests and references).
void decode_page_codes(const std::uint8_t* codes, const PageRange8& r, int d, float* out);

// A query's integer form (q8 written to the caller's d int16 values).
struct CodeQuery {
  const std::int16_t* q8 = nullptr;
  std::int32_t sum = 0;  // Q
  double unit = 0;       // max |q| / 127
};
CodeQuery code_query(const float* q, int d, std::int16_t* q8);
// The definition's four f64 operations, in its order, from the integer sums: unit · (lo · Q +
// (step / 3) · I), for a query of scale `unit` whose channels sum to Q (those the sum I covers).
inline double code_score(double unit, std::int32_t Q, const PageRange8& r, std::int32_t I) {
  const double base = static_cast<double>(r.lo) * static_cast<double>(Q);
  const double third = static_cast<double>(r.step) / 3.0;
  return unit * (base + third * static_cast<double>(I));
}
// code_score of n rows of one page: out[t] for the sum I[t] (SIMD where the CPU has it).
void code_scores(double unit, std::int32_t Q, const PageRange8& r, const std::int32_t* I, int n,
                 double* out);
// The score of one row of codes (the reference every batched form equals).
double page_code_score(const CodeQuery& q, const PageRange8& r, const std::uint8_t* codes, int d);
// Many rows of one page under many queries at once, bit-equal to page_code_score (SIMD where
// the CPU has it): out[h * out_stride + t] = the score of query h against row slots[t] (codes
// at rows + slots[t] * page_code_bytes(d)), for h < nh, t < n.
void page_code_scores(const CodeQuery* q, int nh, const PageRange8& r, const std::uint8_t* rows,
                      const std::int32_t* slots, int n, int d, double* out,
                      std::size_t out_stride);

struct PageCodesView;

// The first pass of token_codes' two passes (select::SelectorConfig::code_channels), from the
// channel-major copy: I[i * n + t] += Σ_{c in ch} q[i].q8[c] · v_tc for the n tokens of kv head
// `head` held by pages phys[0..) in logical order (token t in page t / page_size), v_tc the
// decoded level 3 a_c + code_c (b_c − a_c) of the definition above. Exact int32.
void channel_code_sums(const PageCodesView& pc, int head, const std::int32_t* phys,
                       std::int64_t n, const std::int32_t* ch, int r, const CodeQuery* q, int nh,
                       std::int32_t* I);

}  // namespace masskv::kv
