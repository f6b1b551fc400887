// AVX2 row kernels of the f64 key scores (row_scores.hpp). Pointer kernels only: this file is
// compiled with -mavx2 -mfma -mf16c and entered after a runtime CPU check.
#include <immintrin.h>

#include "kv/row_scores.hpp"

namespace masskv::kv::detail {

namespace {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8_f16(const std::uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8_bf16(const std::uint16_t* p) {
  const __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
}

// Lanes l0..l3 in lo, l4..l7 in hi: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
inline double combine(__m256d lo, __m256d hi) {
  const __m256d r = _mm256_add_pd(lo, hi);
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(r), _mm256_extractf128_pd(r, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

template <class Load, class T>
__attribute__((always_inline)) inline void rows(const T* k, std::int64_t row_stride, int n, int d,
                                                const float* q, double scale, double* out,
                                                Load load) {
  for (int r = 0; r < n; ++r) {
    const T* row = k + r * row_stride;
    __m256d lo = _mm256_setzero_pd(), hi = lo;
    for (int c = 0; c < d; c += 8) {
      const __m256 kv = load(row + c), qv = _mm256_loadu_ps(q + c);
      // Products of two floats are exact in f64, so fmadd adds them as the portable sum does.
      lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(qv)),
                           _mm256_cvtps_pd(_mm256_castps256_ps128(kv)), lo);
      hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(qv, 1)),
                           _mm256_cvtps_pd(_mm256_extractf128_ps(kv, 1)), hi);
    }
    out[r] = scale * combine(lo, hi);
  }
}

}  // namespace

void score_rows_avx2_f32(const float* k, std::int64_t row_stride, int n, int d, const float* q,
                         double scale, double* out) {
  rows(k, row_stride, n, d, q, scale, out, [](const float* p) { return load8(p); });
}
void score_rows_avx2_f16(const std::uint16_t* k, std::int64_t row_stride, int n, int d,
                         const float* q, double scale, double* out) {
  rows(k, row_stride, n, d, q, scale, out, [](const std::uint16_t* p) { return load8_f16(p); });
}
void score_rows_avx2_bf16(const std::uint16_t* k, std::int64_t row_stride, int n, int d,
                          const float* q, double scale, double* out) {
  rows(k, row_stride, n, d, q, scale, out, [](const std::uint16_t* p) { return load8_bf16(p); });
}

}  // namespace masskv::kv::detail
