// Initial selector weights (include/masskv/learn/train.hpp, Init): the key subspace of the
// model's own scores (pca) or a scaled random start.
#include <algorithm>
#include <cmath>

#include "eval/rng.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/train.hpp"

namespace masskv::learn {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

double normal(eval::Rng& rng) {
  // Box-Muller; 1 - u keeps the log finite.
  const double u = 1.0 - rng.uniform(), v = rng.uniform();
  return std::sqrt(-2.0 * std::log(u)) * std::cos(2.0 * 3.14159265358979323846 * v);
}

// Mean square of a row slice over the rows the training queries see.
double mean_square_q(const LayerActivations& data, const Geometry& geo,
                     std::span<const std::size_t> train, int g) {
  double s = 0;
  for (const std::size_t j : train) {
    const float* x = data.queries[j].x.data() + geo.q_offset(g);
    for (std::size_t i = 0; i < sz(geo.q_in); ++i) s += static_cast<double>(x[i]) * x[i];
  }
  return s / (static_cast<double>(train.size()) * geo.q_in);
}

// The training sequences (those some training query belongs to), ascending.
std::vector<int> train_sequences(const LayerActivations& data, std::span<const std::size_t> train) {
  std::vector<int> seqs;
  for (const std::size_t j : train) {
    if (seqs.empty() || seqs.back() != data.queries[j].seq) seqs.push_back(data.queries[j].seq);
  }
  std::sort(seqs.begin(), seqs.end());
  seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
  return seqs;
}

double mean_square_k(const LayerActivations& data, const Geometry& geo,
                     const std::vector<int>& seqs, int g) {
  double s = 0, n = 0;
  for (const int si : seqs) {
    const ActivationSequence& seq = data.sequences[sz(si)];
    for (std::int64_t t = 0; t < seq.length; ++t) {
      const float* x = &seq.keys[sz(t) * sz(geo.k_width) + geo.k_offset(g)];
      for (std::size_t i = 0; i < sz(geo.k_in); ++i) s += static_cast<double>(x[i]) * x[i];
    }
    n += static_cast<double>(seq.length) * geo.k_in;
  }
  return s / n;
}

// Fills rows [from, dim) of one group's W (width `in`) with N(0, σ²).
void random_rows(float* w, int from, int dim, int in, double sigma, eval::Rng& rng) {
  for (std::size_t i = sz(from) * sz(in); i < sz(dim) * sz(in); ++i) {
    w[i] = static_cast<float>(sigma * normal(rng));
  }
}

// Top-r eigenvectors (as columns of q, [n][r]) of the symmetric PSD matrix c [n][n]: subspace
// iteration with modified Gram-Schmidt, a fixed number of rounds (deterministic).
void top_eigenvectors(const std::vector<double>& c, std::size_t n, std::size_t r,
                      std::vector<double>& q, eval::Rng& rng) {
  q.resize(n * r);
  for (double& v : q) v = normal(rng);
  std::vector<double> z(n * r);
  for (int round = 0; round < 100; ++round) {
    if (round > 0) {
      std::fill(z.begin(), z.end(), 0.0);
      for (std::size_t i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < n; ++k) {
          const double cik = c[i * n + k];
          for (std::size_t e = 0; e < r; ++e) z[i * r + e] += cik * q[k * r + e];
        }
      }
      q = z;
    }
    for (std::size_t e = 0; e < r; ++e) {
      for (std::size_t f = 0; f < e; ++f) {
        double d = 0;
        for (std::size_t i = 0; i < n; ++i) d += q[i * r + e] * q[i * r + f];
        for (std::size_t i = 0; i < n; ++i) q[i * r + e] -= d * q[i * r + f];
      }
      double norm = 0;
      for (std::size_t i = 0; i < n; ++i) norm += q[i * r + e] * q[i * r + e];
      norm = std::sqrt(norm);
      for (std::size_t i = 0; i < n; ++i) q[i * r + e] = norm > 0 ? q[i * r + e] / norm : 0.0;
    }
  }
}

}  // namespace

Weights<float> initial_weights(const LayerActivations& data, const Geometry& geo,
                               std::span<const std::size_t> train, Init init, std::uint64_t seed) {
  require(init == Init::random || geo.input == Input::qk, ErrorCode::invalid_argument, "init",
          "pca needs input qk (it maps the model's q through its key subspace)");
  require(!train.empty(), ErrorCode::invalid_argument, "train", "no training query");
  const std::size_t G = sz(geo.groups), d = sz(geo.dim), qi = sz(geo.q_in), ki = sz(geo.k_in);
  Weights<float> w;
  w.wq.assign(G * d * qi, 0.0f);
  w.wk.assign(G * d * ki, 0.0f);
  eval::Rng rng(seed * 0x9E3779B97F4A7C15ull + 0x5E1EC7ull + static_cast<std::uint64_t>(data.header.layer));
  const std::vector<int> seqs = train_sequences(data, train);
  for (std::size_t g = 0; g < G; ++g) {
    const int gi = static_cast<int>(g);
    // Unit-variance-ish projections scaled by dim^(-1/4) each: ŝ starts with a spread of ~1.
    const double shrink = std::pow(static_cast<double>(d), -0.25);
    const double sq = shrink / std::sqrt(static_cast<double>(qi) * mean_square_q(data, geo, train, gi));
    const double sk = shrink / std::sqrt(static_cast<double>(ki) * mean_square_k(data, geo, seqs, gi));
    float* wq = &w.wq[g * d * qi];
    float* wk = &w.wk[g * d * ki];
    int from = 0;
    if (init == Init::pca) {
      // Centred key covariance of the group's slice over the training sequences.
      std::vector<double> mean(ki, 0.0), cov(ki * ki, 0.0), x(ki);
      double n = 0;
      for (const int si : seqs) {
        const ActivationSequence& seq = data.sequences[sz(si)];
        for (std::int64_t t = 0; t < seq.length; ++t) {
          const float* row = &seq.keys[sz(t) * sz(geo.k_width) + geo.k_offset(gi)];
          for (std::size_t i = 0; i < ki; ++i) mean[i] += row[i];
        }
        n += static_cast<double>(seq.length);
      }
      for (double& m : mean) m /= n;
      for (const int si : seqs) {
        const ActivationSequence& seq = data.sequences[sz(si)];
        for (std::int64_t t = 0; t < seq.length; ++t) {
          const float* row = &seq.keys[sz(t) * sz(geo.k_width) + geo.k_offset(gi)];
          for (std::size_t i = 0; i < ki; ++i) x[i] = row[i] - mean[i];
          for (std::size_t i = 0; i < ki; ++i) {
            for (std::size_t k = i; k < ki; ++k) cov[i * ki + k] += x[i] * x[k];
          }
        }
      }
      for (std::size_t i = 0; i < ki; ++i) {
        for (std::size_t k = i; k < ki; ++k) cov[k * ki + i] = cov[i * ki + k] /= n;
      }
      const std::size_t r = std::min(d, ki);
      std::vector<double> u;
      top_eigenvectors(cov, ki, r, u, rng);
      // x_q's heads (of head_dim each) score against kv head h / heads_per_kv of the slice; the
      // mean of the model's logits over those heads is c · Σ_h q_h · k_kv(h), c = scale / heads.
      // c is split evenly between the sides (√c each) so Adam's steps, the same size on every
      // weight, move both projections alike.
      const std::size_t D = sz(geo.head_dim), heads = qi / D;
      const double root_c = std::sqrt(geo.attn_scale / static_cast<double>(heads));
      for (std::size_t e = 0; e < r; ++e) {
        for (std::size_t i = 0; i < ki; ++i) {
          wk[e * ki + i] = static_cast<float>(root_c * u[i * r + e]);
        }
        for (std::size_t h = 0; h < heads; ++h) {
          const std::size_t kv = h / sz(geo.heads_per_kv);
          for (std::size_t i = 0; i < D; ++i) {
            wq[e * qi + h * D + i] = static_cast<float>(root_c * u[(kv * D + i) * r + e]);
          }
        }
      }
      from = static_cast<int>(r);
    }
    random_rows(wq, from, geo.dim, geo.q_in, sq, rng);
    random_rows(wk, from, geo.dim, geo.k_in, sk, rng);
  }
  return w;
}

}  // namespace masskv::learn
