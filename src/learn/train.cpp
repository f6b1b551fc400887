// The training loop of learned selectors (include/masskv/learn/train.hpp): the split into
// training and held-out sequences, Adam with a cosine step size, the loss curve and the
// held-out measures.
#include <chrono>
#include <cmath>
#include <numeric>

#include "eval/rng.hpp"
#include "learn/kl_pass.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/project.hpp"
#include "masskv/learn/recall.hpp"
#include "masskv/learn/train.hpp"

namespace masskv::learn {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Adam (Kingma & Ba 2015) on one weight vector.
struct Adam {
  std::vector<float> m, v;
  void step(std::vector<float>& w, const std::vector<float>& g, double lr, int t) {
    constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
    m.resize(w.size(), 0.0f);
    v.resize(w.size(), 0.0f);
    const double c1 = 1.0 - std::pow(b1, t), c2 = 1.0 - std::pow(b2, t);
    for (std::size_t i = 0; i < w.size(); ++i) {
      m[i] = static_cast<float>(b1 * m[i] + (1 - b1) * g[i]);
      v[i] = static_cast<float>(b2 * v[i] + (1 - b2) * static_cast<double>(g[i]) * g[i]);
      w[i] -= static_cast<float>(lr * (m[i] / c1) / (std::sqrt(v[i] / c2) + eps));
    }
  }
};

// Page sums of a distribution over a prefix (the page scores of covered_mass).
template <class T>
std::vector<float> page_sums(std::span<const T> p, int page_size) {
  const std::size_t ps = sz(page_size);
  std::vector<float> out((p.size() + ps - 1) / ps, 0.0f);
  for (std::size_t i = 0; i < out.size(); ++i) {
    double s = 0;
    for (std::size_t t = i * ps; t < std::min(p.size(), (i + 1) * ps); ++t) s += p[t];
    out[i] = static_cast<float>(s);
  }
  return out;
}

}  // namespace

void TrainConfig::validate(Input input) const {
  using enum ErrorCode;
  require(dim >= 1, invalid_argument, "dim", "must be >= 1, got ", dim);
  require(!rope || input == Input::hidden, invalid_argument, "rope",
          "applies to hidden input only (qk inputs carry the model's RoPE already)");
  require(!rope || dim % 2 == 0, invalid_argument, "dim", "must be even with rope, got ", dim);
  require(steps >= 0, invalid_argument, "steps", "must be >= 0, got ", steps);
  require(std::isfinite(lr) && lr > 0, invalid_argument, "lr", "must be > 0, got ", lr);
  require(std::isfinite(lr_final) && lr_final > 0 && lr_final <= 1, invalid_argument, "lr_final",
          "must be in (0, 1], got ", lr_final);
  require(batch >= 1, invalid_argument, "batch", "must be >= 1, got ", batch);
  require(heldout >= 1, invalid_argument, "heldout", "must be >= 1, got ", heldout);
  require(eval_every >= 1, invalid_argument, "eval_every", "must be >= 1, got ", eval_every);
}

Geometry make_geometry(const LayerActivations& data, const model::ModelConfig& c, int dim,
                       bool rope) {
  const ActivationHeader& h = data.header;
  require(h.n_layer == c.n_layer && h.n_embd == c.n_embd && h.n_head == c.n_head &&
              h.n_head_kv == c.n_head_kv && h.head_dim == c.head_dim,
          ErrorCode::invalid_argument, "data", "activations of another model (layers ", h.n_layer,
          ", embd ", h.n_embd, ", heads ", h.n_head, "/", h.n_head_kv, ")");
  require(dim >= 1, ErrorCode::invalid_argument, "dim", "must be >= 1, got ", dim);
  require(!rope || h.input == Input::hidden, ErrorCode::invalid_argument, "rope",
          "applies to hidden input only");
  require(!rope || dim % 2 == 0, ErrorCode::invalid_argument, "dim", "must be even with rope");
  Geometry g;
  g.input = h.input;
  g.groups = h.groups;
  g.dim = dim;
  g.q_in = h.input == Input::qk ? c.n_head / h.groups * c.head_dim : c.n_embd;
  g.k_in = h.input == Input::qk ? c.n_head_kv / h.groups * c.head_dim : c.n_embd;
  g.q_width = h.q_width;
  g.k_width = h.k_width;
  g.rope = rope;
  g.attn_scale = c.attn_scale;
  g.heads_per_kv = c.n_head / c.n_head_kv;
  g.head_dim = c.head_dim;
  if (rope) {
    g.inv_freq = rope_inv_freq(c, h.layer, dim);
    std::int64_t longest = 0;
    for (const ActivationSequence& s : data.sequences) longest = std::max(longest, s.length);
    const std::size_t half = g.inv_freq.size();
    g.rope_cs.resize(sz(longest) * 2 * half);
    for (std::int64_t t = 0; t < longest; ++t) {
      for (std::size_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(t) * g.inv_freq[i];
        g.rope_cs[(sz(t) * half + i) * 2] = std::cos(a);
        g.rope_cs[(sz(t) * half + i) * 2 + 1] = std::sin(a);
      }
    }
  }
  return g;
}

Measures evaluate(const LayerActivations& data, const Geometry& geo,
                  std::span<const std::size_t> queries, const Weights<float>& w) {
  const std::size_t G = sz(geo.groups);
  const int ps = data.header.page_size, den = data.header.budget_den;
  std::vector<double> recall(queries.size() * G), oracle(queries.size() * G);
  const Observer<float> observe = [&](std::size_t j, int g, std::span<const float> probs) {
    const std::span<const float> p = data.queries[queries[j]].target_of(g);
    recall[j * G + sz(g)] = covered_mass(page_sums(probs, ps), 1, p, ps, den);
    oracle[j * G + sz(g)] = covered_mass(page_sums(p, ps), 1, p, ps, den);
  };
  Measures m;
  m.kl = kl_pass<float>(data, geo, queries, w, nullptr, &observe);
  for (std::size_t i = 0; i < recall.size(); ++i) {
    m.recall += recall[i];
    m.oracle += oracle[i];
  }
  for (const std::size_t j : queries) {
    const std::vector<float>& quest = data.queries[j].quest;
    // Collapsed: the mean over kv groups of each group's own Quest selection.
    if (G == 1) {
      double s = 0;
      for (const float v : quest) s += v;
      m.quest += s / static_cast<double>(quest.size());
    } else {
      for (std::size_t g = 0; g < G; ++g) m.quest += quest[g];
    }
  }
  const auto n = static_cast<double>(recall.size());
  m.recall /= n;
  m.oracle /= n;
  m.quest /= n;
  return m;
}

LayerSelector train_layer(const LayerActivations& data, const model::ModelConfig& config,
                          const TrainConfig& cfg, LayerReport& report,
                          const std::function<void(int, double)>& step_done) {
  const auto t0 = std::chrono::steady_clock::now();
  cfg.validate(data.header.input);
  const Geometry geo = make_geometry(data, config, cfg.dim, cfg.rope);
  const auto n_seq = static_cast<int>(data.sequences.size());
  require(cfg.heldout < n_seq, ErrorCode::invalid_argument, "heldout", cfg.heldout,
          " held-out sequences leave none of the ", n_seq, " for training");
  std::vector<std::size_t> train, held;
  for (std::size_t i = 0; i < data.queries.size(); ++i) {
    (data.queries[i].seq < n_seq - cfg.heldout ? train : held).push_back(i);
  }
  require(!train.empty() && !held.empty(), ErrorCode::invalid_argument, "heldout",
          "the split leaves ", train.size(), " training and ", held.size(), " held-out queries");
  report = LayerReport{};
  report.layer = data.header.layer;
  report.train_queries = train.size();
  report.heldout_queries = held.size();

  Weights<float> w = initial_weights(data, geo, train, cfg.init, cfg.seed);
  report.init = evaluate(data, geo, held, w);
  report.random = cfg.init == Init::random
                      ? report.init
                      : evaluate(data, geo, held,
                                 initial_weights(data, geo, train, Init::random, cfg.seed));
  report.curve.push_back({0, report.init.kl, report.init.kl});

  eval::Rng rng(cfg.seed * 0xD1B54A32D192ED03ull + static_cast<std::uint64_t>(report.layer));
  const std::size_t B = std::min(sz(cfg.batch), train.size());
  std::vector<std::size_t> pool = train, batch(B);
  Adam adam_q, adam_k;
  Weights<float> grad;
  double since = 0;
  int count = 0;
  constexpr double pi = 3.14159265358979323846;
  for (int step = 1; step <= cfg.steps; ++step) {
    // B distinct training queries: a partial Fisher-Yates shuffle of the pool.
    for (std::size_t i = 0; i < B; ++i) {
      std::swap(pool[i], pool[i + rng.below(pool.size() - i)]);
      batch[i] = pool[i];
    }
    const double loss = kl_loss<float>(data, geo, batch, w, &grad);
    const double frac = cfg.steps > 1 ? static_cast<double>(step - 1) / (cfg.steps - 1) : 0.0;
    const double lr =
        cfg.lr * (cfg.lr_final + (1 - cfg.lr_final) * 0.5 * (1 + std::cos(pi * frac)));
    adam_q.step(w.wq, grad.wq, lr, step);
    adam_k.step(w.wk, grad.wk, lr, step);
    since += loss;
    ++count;
    if (step_done) step_done(step, loss);
    if (step % cfg.eval_every == 0 || step == cfg.steps) {
      report.curve.push_back({step, since / count, kl_loss<float>(data, geo, held, w, nullptr)});
      since = 0;
      count = 0;
    }
  }
  report.trained = evaluate(data, geo, held, w);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  LayerSelector out;
  out.layer = data.header.layer;
  out.groups = geo.groups;
  out.dim = geo.dim;
  out.q_in = geo.q_in;
  out.k_in = geo.k_in;
  out.rope = geo.rope;
  out.wq = std::move(w.wq);
  out.wk = std::move(w.wk);
  return out;
}

}  // namespace masskv::learn
