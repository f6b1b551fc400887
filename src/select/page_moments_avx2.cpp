// AVX2 + FMA row kernel of the §2.4 page moments (see page_scan.hpp). Pointer kernel only:
// this file is compiled with -mavx2 -mfma and entered after a runtime CPU check.
#include <immintrin.h>

#include "select/row_kernels.hpp"

namespace masskv::select::detail {

namespace {

// ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)) of lanes lo = l0..l3, hi = l4..l7.
inline double combine(__m256d lo, __m256d hi) {
  const __m256d r = _mm256_add_pd(lo, hi);
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(r), _mm256_extractf128_pd(r, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

}  // namespace

void moments_row_avx2(const float* mean, const float* m2, int d, const double* qd,
                      const double* q2d, int nh, double* sm, double* sv) {
  const __m256d zero = _mm256_setzero_pd();
  for (int i = 0; i < nh; ++i) {
    const double* a = qd + static_cast<long>(i) * d;
    const double* b = q2d + static_cast<long>(i) * d;
    __m256d m_lo = zero, m_hi = zero, v_lo = zero, v_hi = zero;
    for (int c = 0; c < d; c += 8) {
      const __m256d mu_lo = _mm256_cvtps_pd(_mm_loadu_ps(mean + c));
      const __m256d mu_hi = _mm256_cvtps_pd(_mm_loadu_ps(mean + c + 4));
      // max(x, 0) returns the 0 operand for x = ±0 and for x < 0, as x > 0 ? x : 0 does.
      const __m256d s_lo = _mm256_max_pd(_mm256_cvtps_pd(_mm_loadu_ps(m2 + c)), zero);
      const __m256d s_hi = _mm256_max_pd(_mm256_cvtps_pd(_mm_loadu_ps(m2 + c + 4)), zero);
      m_lo = _mm256_fmadd_pd(_mm256_loadu_pd(a + c), mu_lo, m_lo);
      m_hi = _mm256_fmadd_pd(_mm256_loadu_pd(a + c + 4), mu_hi, m_hi);
      v_lo = _mm256_fmadd_pd(_mm256_loadu_pd(b + c), s_lo, v_lo);
      v_hi = _mm256_fmadd_pd(_mm256_loadu_pd(b + c + 4), s_hi, v_hi);
    }
    sm[i] = combine(m_lo, m_hi);
    sv[i] = combine(v_lo, v_hi);
  }
}

}  // namespace masskv::select::detail
