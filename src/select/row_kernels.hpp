// Row kernels of the selectors' f64 passes over page summaries, portable and AVX2, with one
// summation order so both give the same bits (the key-row kernels are kv's:
// kv/row_scores.hpp). Pointer kernels only (no std templates): the AVX2 translation units
// include this header alone.
#pragma once

#include <cstdint>

namespace masskv::select::detail {

// Inner loop of all_page_moments for one summary row pair (mean, M2) of d channels and nh q
// heads (rows of qd / q2d, d doubles each: q and q² in f64): sm[i] = Σ_c qd_ic μ_c and
// sv[i] = Σ_c q2d_ic max(M2_c, 0), summed in 8 lanes (lane c % 8) combined as
// ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), each term added by fma: the portable and the
// AVX2 versions give the same bits.
void moments_row_portable(const float* mean, const float* m2, int d, const double* qd,
                          const double* q2d, int nh, double* sm, double* sv);
// AVX2 + FMA; d % 8 == 0. Enter only after cpu::has_avx2().
void moments_row_avx2(const float* mean, const float* m2, int d, const double* qd,
                      const double* q2d, int nh, double* sm, double* sv);

}  // namespace masskv::select::detail
