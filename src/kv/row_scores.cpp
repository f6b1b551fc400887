// Portable row kernels of the f64 key scores (row_scores.hpp).
#include "kv/row_scores.hpp"

#include "masskv/dtype.hpp"

namespace masskv::kv::detail {

namespace {

template <class T>
void portable_rows(const T* k, std::int64_t row_stride, int n, int d, const float* q, double scale,
                   double* out) {
  for (int r = 0; r < n; ++r) {
    const T* row = k + r * row_stride;
    double l[8] = {};
    for (int c = 0; c < d; ++c) {
      l[c % 8] += static_cast<double>(q[c]) * static_cast<double>(to_f32(row[c]));
    }
    out[r] = scale * (((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])));
  }
}

}  // namespace

void score_rows_portable_f32(const float* k, std::int64_t row_stride, int rows, int d,
                             const float* q, double scale, double* out) {
  portable_rows(k, row_stride, rows, d, q, scale, out);
}
void score_rows_portable_f16(const std::uint16_t* k, std::int64_t row_stride, int rows, int d,
                             const float* q, double scale, double* out) {
  portable_rows(reinterpret_cast<const f16*>(k), row_stride, rows, d, q, scale, out);
}
void score_rows_portable_bf16(const std::uint16_t* k, std::int64_t row_stride, int rows, int d,
                              const float* q, double scale, double* out) {
  portable_rows(reinterpret_cast<const bf16*>(k), row_stride, rows, d, q, scale, out);
}

}  // namespace masskv::kv::detail
