// Element-wise pieces of the forward pass (model.cpp), one place each.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

namespace masskv::model::ops {

// y = x / sqrt(mean(x^2) + eps) * w over n values; the mean in f64 (as ggml's rms_norm).
inline void rms_norm(const float* x, const float* w, float eps, std::size_t n, float* y) {
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const auto scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// Rotary position embedding of one head in place (RoFormer): pair j rotates by
// pos * inv_freq[j]. Adjacent pairs (2j, 2j+1) for llama GGUFs (the converter permuted Q/K
// to that order), NeoX halves (j, j + rope_dims/2) for gemma3.
inline void rope(float* x, const std::vector<double>& inv_freq, double pos, bool neox) {
  const std::size_t half = inv_freq.size();
  for (std::size_t j = 0; j < half; ++j) {
    const double angle = pos * inv_freq[j];
    const auto c = static_cast<float>(std::cos(angle));
    const auto s = static_cast<float>(std::sin(angle));
    const std::size_t i0 = neox ? j : 2 * j;
    const std::size_t i1 = neox ? j + half : 2 * j + 1;
    const float a = x[i0], b = x[i1];
    x[i0] = a * c - b * s;
    x[i1] = a * s + b * c;
  }
}

// inv_freq[j] = scale * base^(-2j / dims), j < dims / 2.
inline std::vector<double> rope_inv_freq(double base, int dims, double scale) {
  std::vector<double> f(static_cast<std::size_t>(dims / 2));
  for (std::size_t j = 0; j < f.size(); ++j) {
    f[j] = scale * std::pow(base, -2.0 * static_cast<double>(j) / dims);
  }
  return f;
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// GELU, tanh approximation (Gemma's hidden_activation gelu_pytorch_tanh).
inline float gelu_tanh(float x) {
  constexpr float k = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(k * (x + 0.044715f * x * x * x)));
}

}  // namespace masskv::model::ops
