// The log-sum-exp of GroupRule::log_prob (docs/design.md §3: a kv group's q heads pooled into
// one ranking by the max over heads of score − the head's LSE over the sequence). One rule,
// host and device: the CPU rule (select/group.cpp) and the CUDA token_codes kernels
// (cuda/two_stage.cu) must compute the same LSE to the last bit, or a near tie between two heads'
// tokens could be broken differently and the selections would disagree. So:
//  - exp and log are fixed polynomials of IEEE operations, each rounded once (no library exp/log,
//    whose last bits differ between glibc and CUDA; no mul-add contracted into an fma: device
//    code uses the _rn intrinsics, host files including this are built -ffp-contract=off);
//  - the sum of the exponentials is an integer (each term rounded to units of 2^-40), so any
//    summation order (a CTA tree, atomics, a loop) gives the same total.
// Accuracy is not the point (the LSE is off by at most n · 2^-41 for n tokens, from the
// rounding of the terms; the polynomials are good to ~1e-15); determinism is.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/host_device.hpp"

namespace masskv::select {

namespace log_prob_detail {

// The f64 operations rounded once each (core/host_device.hpp).
using hd::add;
using hd::div;
using hd::mul;

// x rounded to an integer, to nearest with ties to even, for |x| < 2^51: x + 1.5 · 2^52 lands
// where doubles are integers (the addition rounds as rint would), and the subtraction is
// exact. Two additions: no library call, so the CPU's loop vectorises.
MASSKV_HD inline double round_even(double x) {
  constexpr double kMagic = 0x1.8p52;
  return add(add(x, kMagic), -kMagic);
}

// 2^n for n in [-1022, 1023], from its bits (exact).
MASSKV_HD inline double pow2(int n) {
  const auto bits = static_cast<std::uint64_t>(n + 1023) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  return std::bit_cast<double>(bits);
#endif
}

// ln 2 split for the range reduction: kLn2Hi has 32 significant bits, so k · kLn2Hi is exact
// for the |k| <= 64 used here.
inline constexpr double kLn2Hi = 0x1.62e42fee00000p-1;
inline constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
inline constexpr double kLn2 = 0x1.62e42fefa39efp-1;
inline constexpr double kLog2e = 0x1.71547652b82fep+0;
inline constexpr double kSqrtHalf = 0x1.6a09e667f3bcdp-1;

// e^r's Taylor coefficients to r^12, Horner's order: 1/12!, 1/11!, ..., 1/2!, 1, 1 (one list
// for exp_reduced and the AVX2 sum, log_prob_avx2.cpp, which must run the same operations).
inline constexpr int kExpTerms = 13;
MASSKV_HD constexpr double exp_coeff(int i) {
  constexpr double c[kExpTerms] = {
      0x1.1eed8eff8d898p-29, 0x1.ae64567f544e4p-26, 0x1.27e4fb7789f5cp-22, 0x1.71de3a556c734p-19,
      0x1.a01a01a01a01ap-16, 0x1.a01a01a01a01ap-13, 0x1.6c16c16c16c17p-10, 0x1.1111111111111p-7,
      0x1.5555555555555p-5,  0x1.5555555555555p-3,  0x1.0000000000000p-1,  1.0,
      1.0};
  return c[i];
}

// e^r for |r| <= ln2 / 2: Taylor to r^12 (truncation < 3e-17), Horner.
MASSKV_HD inline double exp_reduced(double r) {
  double p = exp_coeff(0);
  for (int i = 1; i < kExpTerms; ++i) p = add(mul(p, r), exp_coeff(i));
  return p;
}

// log f for f in [√½, √2): 2 atanh(u), u = (f − 1)/(f + 1), |u| <= 0.172; the odd series to
// u^23 (truncation < 1e-19).
MASSKV_HD inline double log_reduced(double f) {
  const double u = div(add(f, -1.0), add(f, 1.0));
  const double u2 = mul(u, u);
  double s = 0x1.642c8590b2164p-5;  // 1/23
  s = add(mul(s, u2), 0x1.8618618618618p-5);
  s = add(mul(s, u2), 0x1.af286bca1af28p-5);
  s = add(mul(s, u2), 0x1.e1e1e1e1e1e1ep-5);
  s = add(mul(s, u2), 0x1.1111111111111p-4);
  s = add(mul(s, u2), 0x1.3b13b13b13b14p-4);
  s = add(mul(s, u2), 0x1.745d1745d1746p-4);
  s = add(mul(s, u2), 0x1.c71c71c71c71cp-4);
  s = add(mul(s, u2), 0x1.2492492492492p-3);
  s = add(mul(s, u2), 0x1.999999999999ap-3);
  s = add(mul(s, u2), 0x1.5555555555555p-2);
  s = add(mul(s, u2), 1.0);
  return mul(mul(2.0, u), s);
}

}  // namespace log_prob_detail

// Fixed-point units of the sum: 2^-40. With the head's best token at e^0 = 2^40 units, a
// sequence of up to 2^23 tokens sums below 2^63.
inline constexpr int kLseFracBits = 40;

// e^x in units of 2^-40, rounded to nearest (ties to even), for x = a token's score minus the
// head's max (x <= 0). Terms below half a unit (x < −28.42) and NaN give 0.
// The same as a double (an integer in [0, 2^40], exact): a loop of these sums exactly in any
// order while its total stays below 2^53 (lse_sum_units), and vectorises on the CPU.
MASSKV_HD inline double lse_units(double x) {
  using namespace log_prob_detail;
  const bool live = x > -28.5;  // false for NaN too
  const double xc = live ? (x > 0 ? 0.0 : x) : 0.0;
  const double k = round_even(mul(xc, kLog2e));  // in [−41, 0]
  const double r = add(add(xc, -mul(k, kLn2Hi)), -mul(k, kLn2Lo));
  const double e = exp_reduced(r);  // e^x = 2^k · e
  const double units = round_even(mul(e, pow2(static_cast<int>(k) + kLseFracBits)));
  return live ? units : 0.0;
}
MASSKV_HD inline std::uint64_t lse_term(double x) {
  return static_cast<std::uint64_t>(lse_units(x));
}

// Σ_j lse_term(v[j] − m) over n values, on the host (portable: lse_sum in group.cpp picks the
// AVX2 form where it runs): blocks of 4096 summed as doubles (each block's total < 2^53:
// exact), the blocks as integers. The GPU's integer sums give the same.
inline std::uint64_t lse_sum_portable(const double* v, std::int64_t n, double m) {
  std::uint64_t sum = 0;
  for (std::int64_t j0 = 0; j0 < n; j0 += 4096) {
    const std::int64_t j1 = j0 + 4096 < n ? j0 + 4096 : n;
    double block = 0;
    for (std::int64_t j = j0; j < j1; ++j) block += lse_units(log_prob_detail::add(v[j], -m));
    sum += static_cast<std::uint64_t>(block);
  }
  return sum;
}

// The LSE of a head whose best score is m and whose lse_term sum is `sum` (>= 1 unit when m is
// finite: the best token's own term is 2^40): m + log(sum · 2^-40).
MASSKV_HD inline double lse_finish(double m, std::uint64_t sum) {
  using namespace log_prob_detail;
  if (sum == 0) return m;
  int e = 0;
#if defined(__CUDA_ARCH__)
  double f = frexp(__ull2double_rn(sum), &e);  // sum = f · 2^e, f in [½, 1)
#else
  double f = std::frexp(static_cast<double>(sum), &e);
#endif
  if (f < kSqrtHalf) {
    f = mul(f, 2.0);
    e -= 1;
  }
  const double log_sum = add(mul(static_cast<double>(e - kLseFracBits), kLn2), log_reduced(f));
  return add(m, log_sum);
}

namespace detail {
// The AVX2 form of lse_sum_portable (log_prob_avx2.cpp; bit-equal), and the one group.cpp calls:
// AVX2 where the CPU has it (core/cpu_features.hpp), else portable.
std::uint64_t lse_sum_avx2(const double* v, std::int64_t n, double m);
std::uint64_t lse_sum(const double* v, std::int64_t n, double m);
}  // namespace detail

}  // namespace masskv::select
