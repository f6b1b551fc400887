// AVX2+FMA gated activations (activations.hpp). Pointer kernel only: entered after
// cpu::has_avx2(). Tails go through the same vector code on a padded copy.
#include <immintrin.h>

#include <cstddef>

#include "core/exp_avx2.hpp"
#include "model/activations.hpp"

namespace masskv::model::ops::kernels {
namespace {

// exp(x), x clamped to the range of simd::exp_in_range.
__m256 exp_ps(__m256 x) {
  x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(simd::kExpMax)), _mm256_set1_ps(simd::kExpMin));
  return simd::exp_in_range(x);
}

// x / (1 + exp(-x)).
__m256 silu_ps(__m256 x) {
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

// 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), written as x / (1 + exp(-2u))
// (the same function; no cancellation in 1 + tanh for negative x, where libm's form loses
// relative precision).
__m256 gelu_ps(__m256 x) {
  const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
  const __m256 u2 = _mm256_mul_ps(_mm256_set1_ps(-2.0f * 0.7978845608028654f),
                                  _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), x3, x));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp_ps(u2)));
}

__m256 act(bool gelu, __m256 x) { return gelu ? gelu_ps(x) : silu_ps(x); }

}  // namespace

void glu_avx2(bool gelu, float* gate, const float* up, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = act(gelu, _mm256_loadu_ps(gate + i));
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(g, _mm256_loadu_ps(up + i)));
  }
  if (i == n) return;
  alignas(32) float g[8] = {}, u[8] = {};
  for (std::size_t j = 0; i + j < n; ++j) {
    g[j] = gate[i + j];
    u[j] = up[i + j];
  }
  _mm256_store_ps(g, _mm256_mul_ps(act(gelu, _mm256_load_ps(g)), _mm256_load_ps(u)));
  for (std::size_t j = 0; i + j < n; ++j) gate[i + j] = g[j];
}

}  // namespace masskv::model::ops::kernels
