#include "masskv/learn/construct.hpp"

#include <cmath>
#include <string>

#include "masskv/error.hpp"

namespace masskv::learn {

namespace {

// Header fields from the model and one empty LayerSelector per chosen layer.
Selector skeleton(const model::ModelConfig& c, Input input, int groups, int dim, bool rope,
                  std::span<const int> layers) {
  require(groups == 1 || groups == c.n_head_kv, ErrorCode::invalid_argument, "groups", "must be 1 or n_head_kv ",
          c.n_head_kv, ", got ", groups);
  Selector s;
  s.input = input;
  s.architecture = std::string(model::to_string(c.arch));
  s.n_layer = c.n_layer;
  s.n_embd = c.n_embd;
  s.n_head = c.n_head;
  s.n_head_kv = c.n_head_kv;
  s.head_dim = c.head_dim;
  const auto add = [&](int layer) {
    require(layer >= 0 && layer < c.n_layer && (s.layers.empty() || layer > s.layers.back().layer),
            ErrorCode::invalid_argument, "layers", "layer ", layer,
            " is out of order or outside the model's ", c.n_layer, " layers");
    LayerSelector l;
    l.layer = layer;
    l.groups = groups;
    l.dim = dim;
    l.rope = rope;
    l.q_in = input == Input::qk ? c.n_head / groups * c.head_dim : c.n_embd;
    l.k_in = input == Input::qk ? c.n_head_kv / groups * c.head_dim : c.n_embd;
    l.wq.assign(static_cast<std::size_t>(groups) * dim * l.q_in, 0.0f);
    l.wk.assign(static_cast<std::size_t>(groups) * dim * l.k_in, 0.0f);
    s.layers.push_back(std::move(l));
  };
  if (layers.empty()) {
    for (int l = 0; l < c.n_layer; ++l) add(l);
  } else {
    for (const int l : layers) add(l);
  }
  return s;
}

}  // namespace

Selector mean_score_selector(const model::ModelConfig& c, int groups, std::span<const int> layers) {
  const int D = c.head_dim, kv_per_group = c.n_head_kv / std::max(groups, 1);
  const int dim = kv_per_group * D;
  Selector s = skeleton(c, Input::qk, groups, dim, false, layers);
  const int heads_per_group = c.n_head / groups, gsize = c.n_head / c.n_head_kv;
  // Within a group, q head i (local) pairs with local kv head i / gsize.
  const float w = c.attn_scale / static_cast<float>(heads_per_group);
  for (LayerSelector& l : s.layers) {
    for (int g = 0; g < groups; ++g) {
      float* wq = l.wq.data() + static_cast<std::size_t>(g) * dim * l.q_in;
      float* wk = l.wk.data() + static_cast<std::size_t>(g) * dim * l.k_in;
      for (int r = 0; r < dim; ++r) wk[static_cast<std::size_t>(r) * l.k_in + r] = 1.0f;
      for (int i = 0; i < heads_per_group; ++i) {
        const int kv = i / gsize;
        for (int x = 0; x < D; ++x) {
          wq[static_cast<std::size_t>(kv * D + x) * l.q_in + static_cast<std::size_t>(i * D + x)] = w;
        }
      }
    }
  }
  s.validate();
  return s;
}

Selector random_selector(const model::ModelConfig& c, Input input, int groups, int dim, bool rope,
                         std::uint64_t seed, std::span<const int> layers) {
  require(dim > 0 && (!rope || dim % 2 == 0), ErrorCode::invalid_argument, "dim",
          "must be positive (even with rope), got ", dim);
  Selector s = skeleton(c, input, groups, dim, rope, layers);
  std::uint64_t state = seed;
  const auto next = [&] {  // SplitMix64
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  const auto fill = [&](std::vector<float>& w, int width) {
    const double a = std::sqrt(3.0 / width);
    for (float& v : w) {
      const double u = static_cast<double>(next() >> 11) * 0x1p-53;  // [0, 1)
      v = static_cast<float>((2 * u - 1) * a);
    }
  };
  for (LayerSelector& l : s.layers) {
    fill(l.wq, l.q_in);
    fill(l.wk, l.k_in);
  }
  s.validate();
  return s;
}

}  // namespace masskv::learn
