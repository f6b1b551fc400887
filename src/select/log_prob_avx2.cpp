// AVX2 Σ lse_term (select/log_prob.hpp): four tokens at a time, the same IEEE operations in the
// same order as lse_units (no fused multiply-adds: built -ffp-contract=off), so the same
// integers, and the block sums exact as in lse_sum. Bit-equal to the portable loop
// (tests/test_two_stage.cpp checks it on random rows).
#include <immintrin.h>

#include "select/log_prob.hpp"

namespace masskv::select::detail {

std::uint64_t lse_sum_avx2(const double* v, std::int64_t n, double m) {
  using namespace log_prob_detail;
  const __m256d vm = _mm256_set1_pd(-m), zero = _mm256_setzero_pd(),
                cut = _mm256_set1_pd(-28.5), magic = _mm256_set1_pd(0x1.8p52),
                nmagic = _mm256_set1_pd(-0x1.8p52), log2e = _mm256_set1_pd(kLog2e),
                hi = _mm256_set1_pd(kLn2Hi), lo = _mm256_set1_pd(kLn2Lo);
  const __m128i bias = _mm_set1_epi32(1023 + kLseFracBits);
  // Exact negation (a sign flip, as the portable -x).
  const __m256d sign = _mm256_set1_pd(-0.0);
  std::uint64_t sum = 0;
  const std::int64_t n4 = n - n % 4;
  for (std::int64_t j0 = 0; j0 < n4; j0 += 4096) {  // blocks as lse_sum's: exact doubles
    const std::int64_t j1 = j0 + 4096 < n4 ? j0 + 4096 : n4;
    __m256d block = zero;
    for (std::int64_t j = j0; j < j1; j += 4) {
      const __m256d x = _mm256_add_pd(_mm256_loadu_pd(v + j), vm);
      const __m256d live = _mm256_cmp_pd(x, cut, _CMP_GT_OQ);  // false for NaN
      // Four dead terms add 0: skip them (most of a row that is −inf outside a few items, as
      // the full rows fill_ranked spreads from a subset's).
      if (_mm256_movemask_pd(live) == 0) continue;
      const __m256d xc = _mm256_and_pd(live, _mm256_min_pd(x, zero));  // x > 0 -> 0
      const __m256d k =
          _mm256_add_pd(_mm256_add_pd(_mm256_mul_pd(xc, log2e), magic), nmagic);
      const __m256d r =
          _mm256_add_pd(_mm256_add_pd(xc, _mm256_xor_pd(_mm256_mul_pd(k, hi), sign)),
                        _mm256_xor_pd(_mm256_mul_pd(k, lo), sign));
      __m256d p = _mm256_set1_pd(exp_coeff(0));  // exp_reduced's Horner steps
      for (int i = 1; i < kExpTerms; ++i)
        p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(exp_coeff(i)));
      // 2^(k + 40) from its bits (k is an integer in [-41, 0]: the conversion is exact).
      const __m256i e = _mm256_slli_epi64(
          _mm256_cvtepi32_epi64(_mm_add_epi32(_mm256_cvtpd_epi32(k), bias)), 52);
      const __m256d units = _mm256_add_pd(
          _mm256_add_pd(_mm256_mul_pd(p, _mm256_castsi256_pd(e)), magic), nmagic);
      block = _mm256_add_pd(block, _mm256_and_pd(live, units));
    }
    alignas(32) double lanes[4];
    _mm256_store_pd(lanes, block);
    for (const double l : lanes) sum += static_cast<std::uint64_t>(l);
  }
  for (std::int64_t j = n4; j < n; ++j) sum += lse_term(add(v[j], -m));
  return sum;
}

}  // namespace masskv::select::detail
