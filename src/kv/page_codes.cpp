// 2-bit page codes (kv/page_codes.hpp).
#include "masskv/kv/page_codes.hpp"

#include <cmath>

#include "core/cpu_features.hpp"
#include "kv/page_codes_kernels.hpp"

namespace masskv::kv {

namespace {

std::uint8_t level(float x, float lo, float hi) {
  if (!(hi > lo)) return 0;
  // rint: round to nearest even in the default rounding mode; the clamp only guards keys a
  // caller passes outside [lo, hi].
  const float t = std::rint(3.0f * ((x - lo) / (hi - lo)));
  return static_cast<std::uint8_t>(t <= 0 ? 0 : t >= 3 ? 3 : t);
}

int code_at(const std::uint8_t* codes, int c) { return (codes[c >> 2] >> (2 * (c & 3))) & 3; }

}  // namespace

namespace detail {

void encode_page_codes_portable(const float* x, const float* lo, const float* hi, int d,
                                std::uint8_t* codes) {
  for (int b = 0; b < page_code_bytes(d); ++b) codes[b] = 0;
  for (int c = 0; c < d; ++c) {
    codes[c >> 2] = static_cast<std::uint8_t>(codes[c >> 2] | (level(x[c], lo[c], hi[c]) << (2 * (c & 3))));
  }
}

}  // namespace detail

void encode_page_codes(const float* x, const float* lo, const float* hi, int d,
                       std::uint8_t* codes) {
  if (cpu::has_avx2() && cpu::simd_allowed()) {
    detail::encode_page_codes_avx2(x, lo, hi, d, codes);
  } else {
    detail::encode_page_codes_portable(x, lo, hi, d, codes);
  }
}

void decode_page_codes(const std::uint8_t* codes, const float* lo, const float* hi, int d,
                       float* out) {
  for (int c = 0; c < d; ++c) {
    const float step = hi[c] > lo[c] ? (hi[c] - lo[c]) / 3.0f : 0.0f;
    out[c] = lo[c] + static_cast<float>(code_at(codes, c)) * step;
  }
}

PageCodeScorer page_code_scorer(const float* q, const float* lo, const float* hi, int d,
                                double* w) {
  PageCodeScorer s;
  for (int c = 0; c < d; ++c) {
    const double qc = q[c];
    s.base += qc * lo[c];
    w[c] = hi[c] > lo[c] ? qc * (static_cast<double>(hi[c]) - lo[c]) / 3.0 : 0.0;
  }
  s.w = w;
  return s;
}

double page_code_score(const PageCodeScorer& s, const std::uint8_t* codes, int d) {
  double acc = s.base;
  for (int b = 0; b < page_code_bytes(d); ++b) {
    const unsigned byte = codes[b];
    const int c0 = 4 * b;
    // Four channels a byte; the last byte of a d not divisible by 4 holds zero codes.
    for (int i = 0; i < 4 && c0 + i < d; ++i) {
      acc += s.w[c0 + i] * static_cast<double>((byte >> (2 * i)) & 3u);
    }
  }
  return acc;
}

namespace detail {

void page_code_scores_portable(const PageCodeScorer* s, int nh, const std::uint8_t* rows,
                               const std::int32_t* slots, int n, int d, double* out,
                               std::size_t out_stride) {
  const std::size_t bytes = static_cast<std::size_t>(page_code_bytes(d));
  for (int h = 0; h < nh; ++h) {
    for (int t = 0; t < n; ++t) {
      out[static_cast<std::size_t>(h) * out_stride + static_cast<std::size_t>(t)] =
          page_code_score(s[h], rows + static_cast<std::size_t>(slots[t]) * bytes, d);
    }
  }
}

void page_code_scorers_portable(const float* q, int nh, const float* lo, const float* hi, int d,
                                double* w, PageCodeScorer* s) {
  for (int h = 0; h < nh; ++h) {
    const std::size_t off = static_cast<std::size_t>(h) * d;
    s[h] = page_code_scorer(q + off, lo, hi, d, w + off);
  }
}

}  // namespace detail

void page_code_scorers(const float* q, int nh, const float* lo, const float* hi, int d, double* w,
                       PageCodeScorer* s) {
  if (cpu::has_avx2() && cpu::simd_allowed()) {
    detail::page_code_scorers_avx2(q, nh, lo, hi, d, w, s);
  } else {
    detail::page_code_scorers_portable(q, nh, lo, hi, d, w, s);
  }
}

void page_code_scores(const PageCodeScorer* s, int nh, const std::uint8_t* rows,
                      const std::int32_t* slots, int n, int d, double* out,
                      std::size_t out_stride) {
  if (cpu::has_avx2() && cpu::simd_allowed()) {
    detail::page_code_scores_avx2(s, nh, rows, slots, n, d, out, out_stride);
  } else {
    detail::page_code_scores_portable(s, nh, rows, slots, n, d, out, out_stride);
  }
}

}  // namespace masskv::kv
