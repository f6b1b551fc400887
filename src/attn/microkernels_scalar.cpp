// Scalar micro-kernels: the portable fallback and the `Impl::scalar` path of the harness.
#include <algorithm>
#include <cmath>

#include "attn/microkernels.hpp"
#include "core/cpu_features.hpp"
#include "masskv/dtype.hpp"

namespace masskv::attn::mk {
namespace {

void load_row(int dtype, const void* row, int d, float* out) {
  switch (static_cast<DType>(dtype)) {
    case DType::f32: {
      const float* p = static_cast<const float*>(row);
      for (int c = 0; c < d; ++c) out[c] = p[c];
      return;
    }
    case DType::f16: {
      const f16* p = static_cast<const f16*>(row);
      for (int c = 0; c < d; ++c) out[c] = f16_to_f32(p[c]);
      return;
    }
    case DType::bf16: {
      const bf16* p = static_cast<const bf16*>(row);
      for (int c = 0; c < d; ++c) out[c] = bf16_to_f32(p[c]);
      return;
    }
  }
}

}  // namespace

// The scalar path is the portable baseline: it does not prefetch (pf is ignored).
void scores_scalar(int dtype, const float* q, int g, int d, const void* const* rows, int n,
                   float scale, float* s, std::int64_t ls, const void* const*, int) {
  float k[kMaxHeadDim];
  for (int r = 0; r < n; ++r) {
    load_row(dtype, rows[r], d, k);
    for (int h = 0; h < g; ++h) {
      const float* qh = q + static_cast<std::int64_t>(h) * d;
      // Four partial sums: the same association as a short SIMD loop, and fewer
      // dependent adds.
      float a[4] = {0, 0, 0, 0};
      for (int c = 0; c < d; c += 4) {
        for (int j = 0; j < 4; ++j) a[j] += qh[c + j] * k[c + j];
      }
      s[h * ls + r] = scale * ((a[0] + a[1]) + (a[2] + a[3]));
    }
  }
}

void accumulate_scalar(int dtype, const float* w, std::int64_t lw, int g, int d,
                       const void* const* rows, int n, float* acc, const void* const*, int) {
  float v[kMaxHeadDim];
  for (int r = 0; r < n; ++r) {
    load_row(dtype, rows[r], d, v);
    for (int h = 0; h < g; ++h) {
      const float wr = w[h * lw + r];
      if (wr == 0.0f) continue;
      float* ah = acc + static_cast<std::int64_t>(h) * d;
      for (int c = 0; c < d; ++c) ah[c] += wr * v[c];
    }
  }
}

float exp_sum_scalar(float* x, int n, float m) {
  float sum = 0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  return sum;
}

float max_scalar(const float* x, int n) { return *std::max_element(x, x + n); }

const Kernels& kernels(bool simd) {
  static const Kernels scalar{scores_scalar, accumulate_scalar, exp_sum_scalar, max_scalar,
                              "scalar"};
  static const Kernels avx2{scores_avx2, accumulate_avx2, exp_sum_avx2, max_avx2, "avx2"};
  if (simd && cpu::has_avx2() && cpu::simd_allowed()) return avx2;
  return scalar;
}

}  // namespace masskv::attn::mk
