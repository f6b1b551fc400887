// 2-bit page codes (kv/page_codes.hpp).
#include "masskv/kv/page_codes.hpp"

#include <cmath>

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

void encode_page_codes(const float* x, const float* lo, const float* hi, int d,
                       std::uint8_t* codes) {
  for (int b = 0; b < page_code_bytes(d); ++b) codes[b] = 0;
  for (int c = 0; c < d; ++c) {
    codes[c >> 2] = static_cast<std::uint8_t>(codes[c >> 2] | (level(x[c], lo[c], hi[c]) << (2 * (c & 3))));
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

}  // namespace masskv::kv
