// Pointer kernels of the §2.4 Gaussian page model (gaussian_model.hpp): no std templates, so
// the AVX2 translation unit can include this alone.
#pragma once

#include <cstddef>

namespace masskv::select::detail {

// Closed-form kernels (alpha 2: kind 2, alpha 1.5: kind 1) over pages with b > 0:
// f += sum n E(tau), df += sum n dE/dtau. Portable and AVX2 (4 lanes; glibc's libmvec erfc
// and exp, within 4 ulp of the scalar functions) versions; the AVX2 one needs count % 4 == 0
// of its caller (the portable one takes the rest).
void gaussian_sums_portable(const double* a, const double* b, const double* n, std::size_t count,
                            int kind, double tau, double& f, double& df);
void gaussian_sums_avx2(const double* a, const double* b, const double* n, std::size_t count,
                        int kind, double tau, double& f, double& df);
// out[i] = n_i E_i(tau) (b > 0).
void gaussian_masses_portable(const double* a, const double* b, const double* n,
                              std::size_t count, int kind, double tau, double* out);
void gaussian_masses_avx2(const double* a, const double* b, const double* n, std::size_t count,
                          int kind, double tau, double* out);

}  // namespace masskv::select::detail
