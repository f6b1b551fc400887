// Vector exp for the selectors' mass estimates: x[i] = exp(x[i]). AVX2 with glibc's libmvec
// exp (within 4 ulp of std::exp) when both are there, std::exp otherwise.
#pragma once

#include <cstddef>

namespace masskv::select::detail {

void exp_inplace(double* x, std::size_t n);
// AVX2 part: n % 4 == 0. Enter only after cpu::has_avx2() (and with MASSKV_HAVE_LIBMVEC).
void exp_inplace_avx2(double* x, std::size_t n);

}  // namespace masskv::select::detail
