// Page codes (kv/page_codes.hpp): the 8-bit ranges, the 2-bit codes and their integer scores.
#include "masskv/kv/page_codes.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/cpu_features.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "kv/page_codes_kernels.hpp"
#include "kv/page_codes_math.hpp"

namespace masskv::kv {

using codes_math::level;

float dequant8(std::uint8_t code, float lo, float step) {
  return codes_math::dequant8(code, lo, step);
}

void round_range8(const float* m, const float* M, int d, std::uint8_t* a, std::uint8_t* b,
                  float* grid) {
  codes_math::round_range8(m, M, d, a, b, grid);
}

void range_bounds(const PageRange8& r, int d, float* lo_out, float* hi_out) {
  for (int c = 0; c < d; ++c) {
    lo_out[c] = dequant8(r.a[c], r.lo, r.step);
    hi_out[c] = dequant8(r.b[c], r.lo, r.step);
  }
}

namespace detail {

void encode_page_codes_portable(const float* x, const float* lo, const float* hi, int d,
                                std::uint8_t* codes) {
  for (int b = 0; b < page_code_bytes(d); ++b) codes[b] = 0;
  for (int c = 0; c < d; ++c) {
    codes[c >> 2] = static_cast<std::uint8_t>(codes[c >> 2] | (level(x[c], lo[c], hi[c]) << (2 * (c & 3))));
  }
}

void page_code_scores_portable(const CodeQuery* q, int nh, const PageRange8& r,
                               const std::uint8_t* rows, const std::int32_t* slots, int n, int d,
                               double* out, std::size_t out_stride) {
  const std::size_t bytes = static_cast<std::size_t>(page_code_bytes(d));
  for (int h = 0; h < nh; ++h) {
    for (int t = 0; t < n; ++t) {
      out[static_cast<std::size_t>(h) * out_stride + static_cast<std::size_t>(t)] =
          page_code_score(q[h], r, rows + static_cast<std::size_t>(slots[t]) * bytes, d);
    }
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

void decode_page_codes(const std::uint8_t* codes, const PageRange8& r, int d, float* out) {
  for (int c = 0; c < d; ++c) {
    const int v = 3 * r.a[c] + code_of(codes, c) * (r.b[c] - r.a[c]);
    out[c] = static_cast<float>(r.lo + static_cast<double>(r.step) * v / 3.0);
  }
}

CodeQuery code_query(const float* q, int d, std::int16_t* q8) {
  float m = 0;
  for (int c = 0; c < d; ++c) m = std::max(m, std::fabs(q[c]));
  CodeQuery cq;
  cq.q8 = q8;
  if (!(m > 0) || !std::isfinite(m)) {  // q = 0 (or not finite): every score 0
    std::fill_n(q8, d, std::int16_t{0});
    return cq;
  }
  const float r = 127.0f / m;
  for (int c = 0; c < d; ++c) {
    const float t = std::rint(q[c] * r);
    q8[c] = static_cast<std::int16_t>(t < -127 ? -127 : t > 127 ? 127 : t);
    cq.sum += q8[c];
  }
  cq.unit = static_cast<double>(m) / 127.0;
  return cq;
}

double page_code_score(const CodeQuery& q, const PageRange8& r, const std::uint8_t* codes, int d) {
  std::int32_t I = 0;
  for (int c = 0; c < d; ++c) {
    I += q.q8[c] * (3 * r.a[c] + code_of(codes, c) * (r.b[c] - r.a[c]));
  }
  return code_score(q.unit, q.sum, r, I);
}

namespace detail {

void channel_code_sums_portable(const PageCodesView& pc, int head, const std::int32_t* phys,
                       std::int64_t n, const std::int32_t* ch, int r, const CodeQuery* q, int nh,
                       std::int32_t* I) {
  const int P = pc.page_size, wb = pc.chan_word_bytes();
  const std::int64_t pages = (n + P - 1) / P;
  for (int k = 0; k < r; ++k) {  // channel by channel: each a contiguous run of words
    const int c = ch[k];
    const std::uint8_t* words = pc.chan_row(head, c);
    const std::uint8_t* ranges = pc.chan_range_row(head, c);
    for (std::int64_t j = 0; j < pages; ++j) {
      const std::int64_t at = phys[j];
      const std::uint8_t* w = words + at * wb;
      const int a = ranges[2 * at], width = ranges[2 * at + 1] - a;
      const int slots = static_cast<int>(std::min<std::int64_t>(P, n - j * P));
      for (int i = 0; i < nh; ++i) {
        const int qc = q[i].q8[c];
        if (qc == 0) continue;
        std::int32_t* out = I + static_cast<std::int64_t>(i) * n + j * P;
        for (int t = 0; t < slots; ++t) {
          const int v = 3 * a + code_of(w, t) * width;
          out[t] += qc * v;
        }
      }
    }
  }
}

void code_scores_portable(double unit, std::int32_t Q, const PageRange8& r,
                          const std::int32_t* I, int n, double* out) {
  for (int t = 0; t < n; ++t) out[t] = code_score(unit, Q, r, I[t]);
}

}  // namespace detail

void code_scores(double unit, std::int32_t Q, const PageRange8& r, const std::int32_t* I, int n,
                 double* out) {
  if (cpu::has_avx2() && cpu::simd_allowed()) {
    detail::code_scores_avx2(unit, Q, r, I, n, out);
  } else {
    detail::code_scores_portable(unit, Q, r, I, n, out);
  }
}

void channel_code_sums(const PageCodesView& pc, int head, const std::int32_t* phys,
                       std::int64_t n, const std::int32_t* ch, int r, const CodeQuery* q, int nh,
                       std::int32_t* I) {
  if (pc.page_size % 8 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    detail::channel_code_sums_avx2(pc, head, phys, n, ch, r, q, nh, I);
  } else {
    detail::channel_code_sums_portable(pc, head, phys, n, ch, r, q, nh, I);
  }
}

void page_code_scores(const CodeQuery* q, int nh, const PageRange8& r, const std::uint8_t* rows,
                      const std::int32_t* slots, int n, int d, double* out,
                      std::size_t out_stride) {
  if (d % 16 == 0 && cpu::has_avx2() && cpu::simd_allowed()) {
    detail::page_code_scores_avx2(q, nh, r, rows, slots, n, d, out, out_stride);
  } else {
    detail::page_code_scores_portable(q, nh, r, rows, slots, n, d, out, out_stride);
  }
}

}  // namespace masskv::kv
