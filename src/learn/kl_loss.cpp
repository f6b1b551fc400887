// The distillation loss and its gradient (include/masskv/learn/train.hpp has the formulas).
// One pass serves training (with the gradient) and evaluation (an observer sees softmax(ŝ)).
// Parallel loops own disjoint outputs and sum in a fixed order: the same bits for any number
// of threads.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "learn/kl_pass.hpp"
#include "masskv/error.hpp"

namespace masskv::learn {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Eight independent partial sums (vectorisable without reassociation), combined pairwise.
template <class A, class B>
A dot(const A* a, const B* b, std::size_t n) {
  A acc[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (std::size_t l = 0; l < 8; ++l) acc[l] += a[i + l] * static_cast<A>(b[i + l]);
  }
  for (std::size_t l = 0; i < n; ++i, ++l) acc[l] += a[i] * static_cast<A>(b[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

template <class A, class B>
void axpy(A* y, A a, const B* x, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] += a * static_cast<A>(x[i]);
}

// Rotates adjacent pairs of v (dim values) by ±pos · inv_freq (the selector RoPE).
template <class T>
void rotate(const Geometry& geo, T* v, std::int64_t pos, bool inverse) {
  if (!geo.rope) return;
  const double* cs = geo.rope_table(pos);
  for (std::size_t i = 0; i < geo.inv_freq.size(); ++i) {
    const T c = static_cast<T>(cs[2 * i]);
    const T s = inverse ? -static_cast<T>(cs[2 * i + 1]) : static_cast<T>(cs[2 * i + 1]);
    const T a = v[2 * i], b = v[2 * i + 1];
    v[2 * i] = a * c - b * s;
    v[2 * i + 1] = a * s + b * c;
  }
}

void check_pass(const LayerActivations& data, const Geometry& geo,
                std::span<const std::size_t> queries, std::size_t wq, std::size_t wk) {
  require(!queries.empty(), ErrorCode::invalid_argument, "queries", "empty batch");
  for (const std::size_t j : queries) {
    require(j < data.queries.size(), ErrorCode::out_of_range, "queries", "index ", j, " of ",
            data.queries.size());
  }
  require(geo.groups == data.header.groups && geo.q_width == data.header.q_width &&
              geo.k_width == data.header.k_width,
          ErrorCode::shape_mismatch, "geometry", "does not describe this activation file");
  const std::size_t G = sz(geo.groups), d = sz(geo.dim);
  require(wq == G * d * sz(geo.q_in) && wk == G * d * sz(geo.k_in), ErrorCode::shape_mismatch,
          "w", "weights of ", wq, "/", wk, " values, expected groups x dim x width");
}

}  // namespace

const double* Geometry::rope_table(std::int64_t pos) const {
  return &rope_cs[sz(pos) * 2 * inv_freq.size()];
}

std::size_t Geometry::q_offset(int g) const {
  return input == Input::qk && groups > 1 ? sz(g) * sz(q_in) : 0;
}
std::size_t Geometry::k_offset(int g) const {
  return input == Input::qk && groups > 1 ? sz(g) * sz(k_in) : 0;
}

template <class T>
double kl_pass(const LayerActivations& data, const Geometry& geo,
               std::span<const std::size_t> queries, const Weights<T>& w, Weights<T>* grad,
               const Observer<T>* observe) {
  check_pass(data, geo, queries, w.wq.size(), w.wk.size());
  const std::size_t B = queries.size(), G = sz(geo.groups), d = sz(geo.dim);
  const std::size_t qi = sz(geo.q_in), ki = sz(geo.k_in), kw = sz(geo.k_width);
  const T norm = static_cast<T>(1.0 / static_cast<double>(B * G));
  if (grad != nullptr) {
    grad->wq.assign(w.wq.size(), T(0));
    grad->wk.assign(w.wk.size(), T(0));
  }
  // The batch by sequence (ascending), each in batch order.
  std::map<int, std::vector<std::size_t>> by_seq;
  for (std::size_t j = 0; j < B; ++j) by_seq[data.queries[queries[j]].seq].push_back(j);

  std::vector<double> loss(B * G);
  std::vector<T> qp(B * d), dqp(B * d), kp, dkp;
  std::vector<std::vector<T>> gs(B);  // ∂loss/∂ŝ of each query over its prefix
  const auto nb = static_cast<std::int64_t>(B), nd = static_cast<std::int64_t>(d);
  for (std::size_t g = 0; g < G; ++g) {
    const T* Wq = &w.wq[g * d * qi];
    const T* Wk = &w.wk[g * d * ki];
    const std::size_t q_off = geo.q_offset(static_cast<int>(g));
    const std::size_t k_off = geo.k_offset(static_cast<int>(g));
#pragma omp parallel for schedule(static)
    for (std::int64_t j = 0; j < nb; ++j) {
      const ActivationQuery& q = data.queries[queries[sz(j)]];
      T* v = &qp[sz(j) * d];
      for (std::size_t e = 0; e < d; ++e) v[e] = dot(Wq + e * qi, q.x.data() + q_off, qi);
      rotate(geo, v, q.pos, false);
    }
    std::fill(dqp.begin(), dqp.end(), T(0));
    for (const auto& [s, members] : by_seq) {
      const ActivationSequence& seq = data.sequences[sz(s)];
      std::int64_t len = 0;
      for (const std::size_t j : members) len = std::max(len, data.queries[queries[j]].pos + 1);
      kp.resize(sz(len) * d);
#pragma omp parallel for schedule(static)
      for (std::int64_t t = 0; t < len; ++t) {
        T* v = &kp[sz(t) * d];
        const float* x = &seq.keys[sz(t) * kw + k_off];
        for (std::size_t e = 0; e < d; ++e) v[e] = dot(Wk + e * ki, x, ki);
        rotate(geo, v, t, false);
      }
      const auto nm = static_cast<std::int64_t>(members.size());
#pragma omp parallel for schedule(dynamic, 1)
      for (std::int64_t m = 0; m < nm; ++m) {
        const std::size_t j = members[sz(m)];
        const ActivationQuery& q = data.queries[queries[j]];
        const std::span<const float> p = q.target_of(static_cast<int>(g));
        const std::size_t n = p.size();
        std::vector<T>& gj = gs[j];
        gj.resize(n);
        T mx = -std::numeric_limits<T>::infinity();
        double p_dot_s = 0, p_log_p = 0;
        for (std::size_t t = 0; t < n; ++t) {
          gj[t] = dot(&qp[j * d], &kp[t * d], d);
          mx = std::max(mx, gj[t]);
          p_dot_s += static_cast<double>(p[t]) * static_cast<double>(gj[t]);
          if (p[t] > 0) p_log_p += static_cast<double>(p[t]) * std::log(static_cast<double>(p[t]));
        }
        T z = 0;
        for (std::size_t t = 0; t < n; ++t) z += (gj[t] = std::exp(gj[t] - mx));
        const T inv_z = T(1) / z;
        for (std::size_t t = 0; t < n; ++t) gj[t] *= inv_z;
        loss[j * G + g] = p_log_p - p_dot_s + static_cast<double>(mx) +
                          std::log(static_cast<double>(z));
        if (observe != nullptr) (*observe)(j, static_cast<int>(g), gj);
        if (grad == nullptr) continue;
        T* dq = &dqp[j * d];
        for (std::size_t t = 0; t < n; ++t) {
          gj[t] = (gj[t] - static_cast<T>(p[t])) * norm;
          axpy(dq, gj[t], &kp[t * d], d);
        }
      }
      if (grad == nullptr) continue;
      dkp.assign(sz(len) * d, T(0));
#pragma omp parallel for schedule(static)
      for (std::int64_t t = 0; t < len; ++t) {
        T* v = &dkp[sz(t) * d];
        for (const std::size_t j : members) {
          if (data.queries[queries[j]].pos >= t) axpy(v, gs[j][sz(t)], &qp[j * d], d);
        }
        rotate(geo, v, t, true);
      }
      T* gWk = &grad->wk[g * d * ki];
#pragma omp parallel for schedule(static)
      for (std::int64_t e = 0; e < nd; ++e) {
        for (std::int64_t t = 0; t < len; ++t) {
          axpy(gWk + sz(e) * ki, dkp[sz(t) * d + sz(e)], &seq.keys[sz(t) * kw + k_off], ki);
        }
      }
    }
    if (grad == nullptr) continue;
    for (std::size_t j = 0; j < B; ++j) rotate(geo, &dqp[j * d], data.queries[queries[j]].pos, true);
    T* gWq = &grad->wq[g * d * qi];
#pragma omp parallel for schedule(static)
    for (std::int64_t e = 0; e < nd; ++e) {
      for (std::size_t j = 0; j < B; ++j) {
        axpy(gWq + sz(e) * qi, dqp[j * d + sz(e)], data.queries[queries[j]].x.data() + q_off, qi);
      }
    }
  }
  double total = 0;
  for (const double l : loss) total += l;
  return total / static_cast<double>(B * G);
}

template <class T>
double kl_loss(const LayerActivations& data, const Geometry& geo,
               std::span<const std::size_t> queries, const Weights<T>& w, Weights<T>* grad) {
  return kl_pass<T>(data, geo, queries, w, grad, nullptr);
}

template double kl_pass<float>(const LayerActivations&, const Geometry&,
                               std::span<const std::size_t>, const Weights<float>&,
                               Weights<float>*, const Observer<float>*);
template double kl_loss<float>(const LayerActivations&, const Geometry&,
                               std::span<const std::size_t>, const Weights<float>&,
                               Weights<float>*);
template double kl_loss<double>(const LayerActivations&, const Geometry&,
                                std::span<const std::size_t>, const Weights<double>&,
                                Weights<double>*);

}  // namespace masskv::learn
