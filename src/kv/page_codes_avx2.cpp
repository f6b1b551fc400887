// AVX2 page-code scores (page_codes_kernels.hpp). Rows go across the vector lanes, channels
// stay in order: every row's sum is the scalar one, operation for operation, so the result is
// bit-equal to page_code_score. Blocks of 16 rows: their codes are unpacked to f64 once and
// read by every head, and four independent accumulators keep the adds' latency hidden.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kv/page_codes_kernels.hpp"

namespace masskv::kv::detail {

void encode_page_codes_avx2(const float* x, const float* lo, const float* hi, int d,
                            std::uint8_t* codes) {
  const __m256 zero = _mm256_setzero_ps(), three = _mm256_set1_ps(3.0f);
  const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
  int c = 0;
  for (; c + 8 <= d; c += 8) {
    const __m256 l = _mm256_loadu_ps(lo + c), u = _mm256_loadu_ps(hi + c);
    const __m256 t = _mm256_round_ps(
        _mm256_mul_ps(three, _mm256_div_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), l),
                                           _mm256_sub_ps(u, l))),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    // Clamped to [0, 3], and 0 where the range is empty (the quotient is then inf or NaN).
    const __m256 level = _mm256_and_ps(_mm256_cmp_ps(u, l, _CMP_GT_OQ),
                                       _mm256_min_ps(_mm256_max_ps(t, zero), three));
    // Four 2-bit fields a byte: shift each lane into place, then add (= or) lanes 0-3, 4-7.
    __m256i v = _mm256_sllv_epi32(_mm256_cvtps_epi32(level), shift);
    v = _mm256_hadd_epi32(v, v);
    v = _mm256_hadd_epi32(v, v);
    codes[c >> 2] = static_cast<std::uint8_t>(_mm256_extract_epi32(v, 0));
    codes[(c >> 2) + 1] = static_cast<std::uint8_t>(_mm256_extract_epi32(v, 4));
  }
  if (c < d) encode_page_codes_portable(x + c, lo + c, hi + c, d - c, codes + (c >> 2));
}

void page_code_scores_avx2(const PageCodeScorer* s, int nh, const std::uint8_t* rows,
                           const std::int32_t* slots, int n, int d, double* out,
                           std::size_t out_stride) {
  constexpr int kRows = 16;
  const int bytes = page_code_bytes(d);
  // u[c * kRows + t]: code of channel c of block row t, as f64.
  thread_local std::vector<double> u;
  thread_local std::vector<std::uint8_t> zero;
  u.resize(static_cast<std::size_t>(4 * bytes) * kRows);
  zero.assign(static_cast<std::size_t>(bytes), 0);
  const __m128i three = _mm_set1_epi32(3);
  for (int t0 = 0; t0 < n; t0 += kRows) {
    const int m = std::min(kRows, n - t0);
    const std::uint8_t* r[kRows];
    for (int t = 0; t < kRows; ++t) {
      r[t] = t < m ? rows + static_cast<std::size_t>(slots[t0 + t]) * bytes : zero.data();
    }
    for (int b = 0; b < bytes; ++b) {
      for (int t = 0; t < kRows; t += 4) {
        const __m128i v = _mm_setr_epi32(r[t][b], r[t + 1][b], r[t + 2][b], r[t + 3][b]);
        for (int i = 0; i < 4; ++i) {
          const __m128i code = _mm_and_si128(_mm_srli_epi32(v, 2 * i), three);
          _mm256_storeu_pd(u.data() + static_cast<std::size_t>(4 * b + i) * kRows + t,
                          _mm256_cvtepi32_pd(code));
        }
      }
    }
    for (int h = 0; h < nh; ++h) {
      __m256d acc[4];
      for (auto& a : acc) a = _mm256_set1_pd(s[h].base);
      const double* w = s[h].w;
      for (int c = 0; c < d; ++c) {
        const __m256d wc = _mm256_set1_pd(w[c]);
        const double* uc = u.data() + static_cast<std::size_t>(c) * kRows;
        for (int a = 0; a < 4; ++a) {
          acc[a] = _mm256_add_pd(acc[a], _mm256_mul_pd(wc, _mm256_loadu_pd(uc + 4 * a)));
        }
      }
      alignas(32) double res[kRows];
      for (int a = 0; a < 4; ++a) _mm256_store_pd(res + 4 * a, acc[a]);
      double* o = out + static_cast<std::size_t>(h) * out_stride + t0;
      for (int t = 0; t < m; ++t) o[t] = res[t];
    }
  }
}

void page_code_scorers_avx2(const float* q, int nh, const float* lo, const float* hi, int d,
                            double* w, PageCodeScorer* s) {
  const __m256d three = _mm256_set1_pd(3.0);
  for (int h = 0; h < nh; ++h) {
    const float* qh = q + static_cast<std::size_t>(h) * d;
    double* wh = w + static_cast<std::size_t>(h) * d;
    int c = 0;
    for (; c + 4 <= d; c += 4) {
      const __m256d qc = _mm256_cvtps_pd(_mm_loadu_ps(qh + c));
      const __m256d l = _mm256_cvtps_pd(_mm_loadu_ps(lo + c));
      const __m256d u = _mm256_cvtps_pd(_mm_loadu_ps(hi + c));
      const __m256d v = _mm256_div_pd(_mm256_mul_pd(qc, _mm256_sub_pd(u, l)), three);
      // 0 (+0.0) where the range is empty, as the scalar form.
      _mm256_storeu_pd(wh + c, _mm256_and_pd(_mm256_cmp_pd(u, l, _CMP_GT_OQ), v));
    }
    for (; c < d; ++c) {
      const double qc = qh[c];
      wh[c] = hi[c] > lo[c] ? qc * (static_cast<double>(hi[c]) - lo[c]) / 3.0 : 0.0;
    }
    s[h].w = wh;
  }
  for (int h0 = 0; h0 < nh; h0 += 4) {
    const int m = std::min(4, nh - h0);
    const float* qr[4];
    for (int i = 0; i < 4; ++i) qr[i] = q + static_cast<std::size_t>(h0 + std::min(i, m - 1)) * d;
    __m256d acc = _mm256_setzero_pd();
    for (int c = 0; c < d; ++c) {
      const __m256d qc = _mm256_setr_pd(qr[0][c], qr[1][c], qr[2][c], qr[3][c]);
      acc = _mm256_add_pd(acc, _mm256_mul_pd(qc, _mm256_set1_pd(lo[c])));
    }
    alignas(32) double base[4];
    _mm256_store_pd(base, acc);
    for (int i = 0; i < m; ++i) s[h0 + i].base = base[i];
  }
}

}  // namespace masskv::kv::detail
