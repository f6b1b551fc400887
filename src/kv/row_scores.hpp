// Row kernels of the f64 scores q·k over stored key rows, portable and AVX2, with one
// summation order so both give the same bits (docs/design.md §2.2, §2.9). They live in kv
// because they read the cache's row formats: the selectors' exact scores (select/
// exact_scores.cpp) and the selector key cache (kv/key_rows.cpp) both call them. Pointer
// kernels only (no std templates): the AVX2 translation unit includes this header alone.
#pragma once

#include <cstdint>

namespace masskv::kv::detail {

// out[r] = scale * sum_c q_c k_rc for `rows` key rows at k + r * row_stride. Each product is
// exact in f64 (two floats); the sum runs in 8 lanes (lane c % 8) combined as
// ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)), so the portable and the AVX2 versions agree to
// the bit. `k` is f32, f16 or bf16 bits by the suffix.
void score_rows_portable_f32(const float* k, std::int64_t row_stride, int rows, int d,
                             const float* q, double scale, double* out);
void score_rows_portable_f16(const std::uint16_t* k, std::int64_t row_stride, int rows, int d,
                             const float* q, double scale, double* out);
void score_rows_portable_bf16(const std::uint16_t* k, std::int64_t row_stride, int rows, int d,
                              const float* q, double scale, double* out);
// AVX2 + FMA + F16C; d % 8 == 0. Enter only after cpu::has_avx2().
void score_rows_avx2_f32(const float* k, std::int64_t row_stride, int rows, int d, const float* q,
                         double scale, double* out);
void score_rows_avx2_f16(const std::uint16_t* k, std::int64_t row_stride, int rows, int d,
                         const float* q, double scale, double* out);
void score_rows_avx2_bf16(const std::uint16_t* k, std::int64_t row_stride, int rows, int d,
                          const float* q, double scale, double* out);

}  // namespace masskv::kv::detail
