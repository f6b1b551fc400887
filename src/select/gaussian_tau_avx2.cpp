// AVX2 closed forms of the §2.4 Gaussian page model (see gaussian_model.hpp) and the vector
// exp of vec_math.hpp: 4 pages per step, Φ and φ from glibc's vector erfc and exp (libmvec, AVX2 variants). Pointer kernels
// only: this file is compiled with -mavx2 -mfma and entered after a runtime CPU check.
#include <immintrin.h>

#include "select/gaussian_kernels.hpp"
#include "select/vec_math.hpp"

#ifdef MASSKV_HAVE_LIBMVEC
extern "C" __m256d _ZGVdN4v_erfc(__m256d x);  // glibc >= 2.35
extern "C" __m256d _ZGVdN4v_exp(__m256d x);

namespace masskv::select::detail {

namespace {

struct PhiPhi {
  __m256d d, P, p;  // a - tau, Φ(t), φ(t) with t = d / b
};

inline PhiPhi phis(const double* a, const double* b, std::size_t j, double tau) {
  const __m256d d = _mm256_sub_pd(_mm256_loadu_pd(a + j), _mm256_set1_pd(tau));
  const __m256d t = _mm256_div_pd(d, _mm256_loadu_pd(b + j));
  const __m256d P = _mm256_mul_pd(
      _mm256_set1_pd(0.5), _ZGVdN4v_erfc(_mm256_mul_pd(t, _mm256_set1_pd(-0.70710678118654752440))));
  const __m256d p =
      _mm256_mul_pd(_mm256_set1_pd(0.39894228040143267794),
                    _ZGVdN4v_exp(_mm256_mul_pd(_mm256_set1_pd(-0.5), _mm256_mul_pd(t, t))));
  return {d, P, p};
}

inline double hsum(__m256d v) {
  const __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

}  // namespace

void gaussian_sums_avx2(const double* a, const double* b, const double* n, std::size_t count,
                        int kind, double tau, double& f, double& df) {
  __m256d F = _mm256_setzero_pd(), D = F;
  for (std::size_t j = 0; j < count; j += 4) {
    const PhiPhi x = phis(a, b, j, tau);
    const __m256d bj = _mm256_loadu_pd(b + j), nj = _mm256_loadu_pd(n + j);
    const __m256d first = _mm256_fmadd_pd(x.d, x.P, _mm256_mul_pd(bj, x.p));  // E[(Y-tau)_+]
    if (kind == 2) {
      F = _mm256_fmadd_pd(nj, first, F);
      D = _mm256_fnmadd_pd(nj, x.P, D);
    } else {
      const __m256d second = _mm256_fmadd_pd(
          _mm256_fmadd_pd(x.d, x.d, _mm256_mul_pd(bj, bj)), x.P, _mm256_mul_pd(_mm256_mul_pd(x.d, bj), x.p));
      F = _mm256_fmadd_pd(nj, second, F);
      D = _mm256_fnmadd_pd(_mm256_add_pd(nj, nj), first, D);
    }
  }
  f += hsum(F);
  df += hsum(D);
}

void gaussian_masses_avx2(const double* a, const double* b, const double* n, std::size_t count,
                          int kind, double tau, double* out) {
  for (std::size_t j = 0; j < count; j += 4) {
    const PhiPhi x = phis(a, b, j, tau);
    const __m256d bj = _mm256_loadu_pd(b + j), nj = _mm256_loadu_pd(n + j);
    const __m256d e =
        kind == 2 ? _mm256_fmadd_pd(x.d, x.P, _mm256_mul_pd(bj, x.p))
                  : _mm256_fmadd_pd(_mm256_fmadd_pd(x.d, x.d, _mm256_mul_pd(bj, bj)), x.P,
                                    _mm256_mul_pd(_mm256_mul_pd(x.d, bj), x.p));
    _mm256_storeu_pd(out + j, _mm256_mul_pd(nj, e));
  }
}

void exp_inplace_avx2(double* x, std::size_t n) {
  for (std::size_t j = 0; j < n; j += 4) _mm256_storeu_pd(x + j, _ZGVdN4v_exp(_mm256_loadu_pd(x + j)));
}

}  // namespace masskv::select::detail

#else  // no vector erfc: the dispatcher never calls these

namespace masskv::select::detail {
void gaussian_sums_avx2(const double*, const double*, const double*, std::size_t, int, double,
                        double&, double&) {}
void gaussian_masses_avx2(const double*, const double*, const double*, std::size_t, int, double,
                          double*) {}
void exp_inplace_avx2(double*, std::size_t) {}
}  // namespace masskv::select::detail

#endif
