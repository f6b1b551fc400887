// f64 building blocks of the references: dot products on stored KV rows and one attention
// row (softmax or entmax by plain bisection). Independent of the fast kernels and solvers.
#pragma once

#include <span>
#include <vector>

#include "masskv/dtype.hpp"
#include "masskv/mapping.hpp"

namespace masskv::attn::detail {

// Stored rows converted exactly to f64, [rows.size()][d].
std::vector<double> ref_rows(std::span<const void* const> rows, DType dtype, int d);
double ref_dot(const double* q, const double* k, int d);

// Entmax threshold on z = (alpha-1)*s by >= 100 bisection rounds in f64 (docs/design.md §2.1).
double ref_entmax_tau(std::span<const double> s, double alpha);

// o = sum_i p_i v_i with p = map(s); entries of s equal to -inf are masked (p = 0).
// Returns the lse (softmax) or tau (entmax). No finite entry: o = 0, -inf / NaN.
double ref_attend(std::span<const double> s, std::span<const double* const> v, int d,
                  const Mapping& mapping, double* o);

}  // namespace masskv::attn::detail
