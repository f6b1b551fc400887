// The learned selector at inference (model/learned_selector.hpp): its shape checks and its
// projections, on the forward pass's own kernels (quant.hpp's mat-vec and GEMM, layer_ops.hpp's
// RoPE) so a selector scores what the model computes (docs/design.md §2.8).
#include "masskv/model/learned_selector.hpp"

#include <algorithm>
#include <cmath>

#include "masskv/error.hpp"
#include "masskv/model/model.hpp"
#include "masskv/model/quant.hpp"
#include "model/layer_ops.hpp"

namespace masskv::learn {

std::string_view to_string(Input input) noexcept { return input == Input::qk ? "qk" : "hidden"; }

const LayerSelector* Selector::find(int layer) const {
  for (const LayerSelector& l : layers) {
    if (l.layer == layer) return &l;
  }
  return nullptr;
}

void Selector::validate() const {
  const auto bad = [](auto... parts) { fail(ErrorCode::invalid_argument, "selector", parts...); };
  if (n_layer <= 0 || n_embd <= 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 ||
      n_head % n_head_kv != 0) {
    bad("model shape (layers ", n_layer, ", embd ", n_embd, ", heads ", n_head, "/", n_head_kv,
        ", head_dim ", head_dim, ") is not a valid GQA model");
  }
  int previous = -1;
  for (const LayerSelector& l : layers) {
    if (l.layer <= previous || l.layer >= n_layer) {
      bad("layer ", l.layer, " out of order or outside the model's ", n_layer, " layers");
    }
    previous = l.layer;
    if (l.groups != 1 && l.groups != n_head_kv) {
      bad("layer ", l.layer, ": groups ", l.groups, " is neither 1 nor n_head_kv ", n_head_kv);
    }
    if (l.dim <= 0 || (l.rope && l.dim % 2 != 0)) {
      bad("layer ", l.layer, ": dim ", l.dim, " must be positive (even with rope)");
    }
    const int heads_per_group = n_head / l.groups;
    const int kv_per_group = n_head_kv / l.groups;
    const int q_want = input == Input::qk ? heads_per_group * head_dim : n_embd;
    const int k_want = input == Input::qk ? kv_per_group * head_dim : n_embd;
    if (l.q_in != q_want || l.k_in != k_want) {
      bad("layer ", l.layer, ": input widths ", l.q_in, "/", l.k_in, " should be ", q_want, "/",
          k_want, " for input ", to_string(input));
    }
    if (input == Input::qk && l.rope) bad("layer ", l.layer, ": rope applies to hidden input only");
    const auto n = static_cast<std::size_t>(l.groups) * static_cast<std::size_t>(l.dim);
    if (l.wq.size() != n * static_cast<std::size_t>(l.q_in) ||
        l.wk.size() != n * static_cast<std::size_t>(l.k_in)) {
      bad("layer ", l.layer, ": weight sizes ", l.wq.size(), "/", l.wk.size(),
          " do not match groups x dim x width");
    }
  }
}


void check_model(const Selector& s, const model::ModelConfig& c) {
  s.validate();
  const std::string_view arch = model::to_string(c.arch);
  require(s.architecture == arch && s.n_layer == c.n_layer && s.n_embd == c.n_embd &&
              s.n_head == c.n_head && s.n_head_kv == c.n_head_kv && s.head_dim == c.head_dim,
          ErrorCode::invalid_argument, "selector", "distilled on ", s.architecture, " (layers ",
          s.n_layer, ", embd ", s.n_embd, ", heads ", s.n_head, "/", s.n_head_kv, ", head_dim ",
          s.head_dim, "), the model is ", arch, " (layers ", c.n_layer, ", embd ", c.n_embd,
          ", heads ", c.n_head, "/", c.n_head_kv, ", head_dim ", c.head_dim, ")");
}

std::vector<double> rope_inv_freq(const model::ModelConfig& c, int layer, int dim) {
  const bool local = !c.is_local.empty() && c.is_local[static_cast<std::size_t>(layer)] != 0;
  const double base = local ? c.rope_base_local : c.rope_base;
  const double scale = local ? 1.0 : c.rope_freq_scale;
  return model::ops::rope_inv_freq(base, dim, scale);
}

namespace {

// The normalised Walsh-Hadamard transform of each 32-value block of o[0..dim), in f64 with
// one rounding to f32 per value (H / sqrt(32) is orthonormal and its own inverse).
void rotate_blocks(float* o, std::size_t dim) {
  constexpr int B = 32;
  const double norm = 1.0 / std::sqrt(static_cast<double>(B));
  for (std::size_t b0 = 0; b0 + B <= dim; b0 += B) {
    double t[B];
    for (int i = 0; i < B; ++i) t[i] = o[b0 + static_cast<std::size_t>(i)];
    for (int h = 1; h < B; h *= 2) {
      for (int i = 0; i < B; i += 2 * h) {
        for (int j = i; j < i + h; ++j) {
          const double a = t[j], c = t[j + h];
          t[j] = a + c;
          t[j + h] = a - c;
        }
      }
    }
    for (int i = 0; i < B; ++i) o[b0 + static_cast<std::size_t>(i)] = static_cast<float>(t[i] * norm);
  }
}

}  // namespace

void project(const Selector& s, const LayerSelector& l, Side side, const float* x, std::size_t n,
             std::span<const std::int64_t> positions, const std::vector<double>& inv_freq,
             float* out, std::vector<float>& scratch) {
  const bool query = side == Side::query;
  const auto width = static_cast<std::size_t>(query ? l.q_in : l.k_in);
  const auto dim = static_cast<std::size_t>(l.dim), G = static_cast<std::size_t>(l.groups);
  // qk: group g reads its slice of the heads row; hidden: every group reads the whole row.
  const bool sliced = s.input == Input::qk;
  const std::size_t stride = sliced ? G * width : width;
  const std::vector<float>& w = query ? l.wq : l.wk;
  scratch.resize(n * (width + dim));
  float* xs = scratch.data();
  float* ys = scratch.data() + n * width;
  thread_local model::ops::RopeTable rope;  // the model's RoPE: cos/sin per row in f64 -> f32
  if (l.rope) rope.fill(inv_freq, positions.first(n));
  for (std::size_t g = 0; g < G; ++g) {
    const float* wg = w.data() + g * dim * width;
    const float* xg = x + (sliced ? g * width : 0);
    if (n == 1) {
      model::matvec(model::GgmlType::f32, wg, dim, width, xg, ys, model::Activations::f32);
    } else {
      const float* in = xg;
      if (stride != width) {  // the GEMM takes contiguous rows
        for (std::size_t t = 0; t < n; ++t) std::copy_n(xg + t * stride, width, xs + t * width);
        in = xs;
      }
      model::matmul(model::GgmlType::f32, wg, dim, width, in, n, ys);
    }
    for (std::size_t t = 0; t < n; ++t) {
      float* o = out + (t * G + g) * dim;
      std::copy_n(ys + t * dim, dim, o);
      if (l.rope) rope.apply(o, t, /*neox=*/false);
      if (dim % 32 == 0) rotate_blocks(o, dim);
    }
  }
}

}  // namespace masskv::learn
