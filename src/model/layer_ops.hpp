// Element-wise pieces of the forward pass (model.cpp), one place each.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace masskv::model::ops {

// y = x / sqrt(mean(x^2) + eps) * w over n values; the mean in f64 (as ggml's rms_norm).
inline void rms_norm(const float* x, const float* w, float eps, std::size_t n, float* y) {
  double ss = 0;
  for (std::size_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const auto scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  for (std::size_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// Rotary position embedding (RoFormer): pair j of a head at position pos rotates by
// pos * inv_freq[j]. Adjacent pairs (2j, 2j+1) for llama GGUFs (the converter permuted Q/K
// to that order), NeoX halves (j, j + rope_dims/2) for gemma3. The cos/sin of a pass's rows
// are computed once (in f64, rounded to f32) and shared by every head and layer.
class RopeTable {
 public:
  // One row per position: a prefill block's consecutive positions, or the positions of the
  // sessions of a batched decode step.
  void fill(const std::vector<double>& inv_freq, std::span<const std::int64_t> positions) {
    half_ = inv_freq.size();
    cs_.resize(2 * positions.size() * half_);
    for (std::size_t t = 0; t < positions.size(); ++t) {
      const auto pos = static_cast<double>(positions[t]);
      float* row = &cs_[2 * t * half_];
      for (std::size_t j = 0; j < half_; ++j) {
        const double angle = pos * inv_freq[j];
        row[j] = static_cast<float>(std::cos(angle));
        row[half_ + j] = static_cast<float>(std::sin(angle));
      }
    }
  }
  // Rotates one head of row t (of the filled positions) in place.
  void apply(float* x, std::size_t t, bool neox) const {
    const float* c = &cs_[2 * t * half_];
    const float* s = c + half_;
    for (std::size_t j = 0; j < half_; ++j) {
      const std::size_t i0 = neox ? j : 2 * j;
      const std::size_t i1 = neox ? j + half_ : 2 * j + 1;
      const float a = x[i0], b = x[i1];
      x[i0] = a * c[j] - b * s[j];
      x[i1] = a * s[j] + b * c[j];
    }
  }

 private:
  std::size_t half_ = 0;
  std::vector<float> cs_;  // per token: cos of every pair, then sin
};

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
