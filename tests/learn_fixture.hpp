// Small synthetic learned-selector problems for the trainer and file tests: a model shape, an
// activation set of random inputs and targets, and random weights.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "masskv/learn/activations.hpp"
#include "masskv/learn/train.hpp"
#include "masskv/model/model.hpp"

namespace masskv::test {

struct LearnShape {
  int n_head = 4, n_head_kv = 2, head_dim = 8, n_embd = 12;
};

inline model::ModelConfig learn_config(const LearnShape& s) {
  model::ModelConfig c;
  c.n_layer = 4;
  c.n_embd = s.n_embd;
  c.n_head = s.n_head;
  c.n_head_kv = s.n_head_kv;
  c.head_dim = s.head_dim;
  c.rope_dims = s.head_dim;
  c.rope_base = 500;  // small: visible rotation over a few dozen positions
  c.attn_scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  c.is_local.assign(4, 0);
  return c;
}

// Random inputs; targets the softmax of random scores over each query's prefix. Query j of a
// sequence sits at length - 1 - 5j (mod length).
inline learn::LayerActivations random_activations(const LearnShape& s, learn::Input input,
                                                  int groups, const std::vector<int>& lengths,
                                                  int queries_per_seq, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  learn::LayerActivations a;
  learn::ActivationHeader& h = a.header;
  h.input = input;
  h.layer = 2;
  h.groups = groups;
  h.q_width = input == learn::Input::qk ? s.n_head * s.head_dim : s.n_embd;
  h.k_width = input == learn::Input::qk ? s.n_head_kv * s.head_dim : s.n_embd;
  h.n_head_kv = s.n_head_kv;
  h.page_size = 4;
  h.budget_den = 4;
  h.n_layer = 4;
  h.n_embd = s.n_embd;
  h.n_head = s.n_head;
  h.head_dim = s.head_dim;
  for (std::size_t si = 0; si < lengths.size(); ++si) {
    learn::ActivationSequence seq;
    seq.length = lengths[si];
    seq.keys.resize(static_cast<std::size_t>(seq.length * h.k_width));
    for (float& v : seq.keys) v = normal(rng);
    a.sequences.push_back(std::move(seq));
    for (int j = 0; j < queries_per_seq; ++j) {
      learn::ActivationQuery q;
      q.seq = static_cast<int>(si);
      q.pos = lengths[si] - 1 - (j * 5) % lengths[si];
      q.x.resize(static_cast<std::size_t>(h.q_width));
      for (float& v : q.x) v = normal(rng);
      q.quest.assign(static_cast<std::size_t>(s.n_head_kv), 0.5f);
      const std::size_t n = static_cast<std::size_t>(q.pos + 1);
      q.target.resize(static_cast<std::size_t>(groups) * n);
      for (int g = 0; g < groups; ++g) {
        std::vector<double> e(n);
        double z = 0;
        for (std::size_t t = 0; t < n; ++t) z += (e[t] = std::exp(1.5 * normal(rng)));
        for (std::size_t t = 0; t < n; ++t) q.target[static_cast<std::size_t>(g) * n + t] = static_cast<float>(e[t] / z);
      }
      a.queries.push_back(std::move(q));
    }
  }
  return a;
}

template <class T>
learn::Weights<T> random_weights(const learn::Geometry& geo, unsigned seed, double sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, sigma);
  learn::Weights<T> w;
  w.wq.resize(static_cast<std::size_t>(geo.groups * geo.dim * geo.q_in));
  w.wk.resize(static_cast<std::size_t>(geo.groups * geo.dim * geo.k_in));
  for (T& v : w.wq) v = static_cast<T>(normal(rng));
  for (T& v : w.wk) v = static_cast<T>(normal(rng));
  return w;
}

}  // namespace masskv::test
