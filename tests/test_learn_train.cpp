// The distillation trainer (learn/train.hpp): the hand-written gradient against central finite
// differences in f64, the loss against a plain f64 reference, f32 against f64, the same bits for
// any thread count, the loss going down on a fixed batch, and the CLI values' errors.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "learn_fixture.hpp"
#include "masskv/learn/train.hpp"

namespace learn = masskv::learn;
using masskv::ErrorCode;
using masskv::test::expect_error;
using masskv::test::LearnShape;

namespace {

struct Case {
  learn::Input input;
  int groups;  // 1 or n_head_kv
  bool rope;
  std::string name() const {
    return std::string(input == learn::Input::qk ? "qk" : "hidden") +
           (groups == 1 ? " collapsed" : " per-group") + (rope ? " rope" : "");
  }
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const LearnShape s;
  for (const int groups : {1, s.n_head_kv}) {
    out.push_back({learn::Input::qk, groups, false});
    out.push_back({learn::Input::hidden, groups, false});
    out.push_back({learn::Input::hidden, groups, true});
  }
  return out;
}

std::vector<std::size_t> all_queries(const learn::LayerActivations& a) {
  std::vector<std::size_t> q(a.queries.size());
  for (std::size_t i = 0; i < q.size(); ++i) q[i] = i;
  return q;
}

// The loss from the definition, in plain f64 loops: per query and group, q' and every k' from
// the file rows (the group's heads for qk per group), rotated pair by pair by
// position · s · base^(−2i/dim), then Σ p log p − Σ p ŝ + logsumexp(ŝ).
double reference_loss(const learn::LayerActivations& a, const masskv::model::ModelConfig& c,
                      int dim, bool rope, const learn::Weights<double>& w) {
  const auto& h = a.header;
  const bool qk = h.input == learn::Input::qk;
  const int G = h.groups;
  const int q_in = qk ? c.n_head / G * c.head_dim : c.n_embd;
  const int k_in = qk ? c.n_head_kv / G * c.head_dim : c.n_embd;
  const auto project = [&](const std::vector<double>& W, int g, int in, const float* x,
                           std::int64_t pos) {
    std::vector<double> v(static_cast<std::size_t>(dim), 0.0);
    for (int e = 0; e < dim; ++e) {
      for (int i = 0; i < in; ++i) {
        v[static_cast<std::size_t>(e)] +=
            W[static_cast<std::size_t>((g * dim + e) * in + i)] * x[i];
      }
    }
    if (rope) {
      for (int i = 0; i < dim / 2; ++i) {
        const double angle = static_cast<double>(pos) * c.rope_freq_scale *
                             std::pow(c.rope_base, -2.0 * i / dim);
        const double x0 = v[2 * i], x1 = v[2 * i + 1];
        v[2 * i] = x0 * std::cos(angle) - x1 * std::sin(angle);
        v[2 * i + 1] = x0 * std::sin(angle) + x1 * std::cos(angle);
      }
    }
    return v;
  };
  double total = 0;
  for (const auto& q : a.queries) {
    const auto& seq = a.sequences[static_cast<std::size_t>(q.seq)];
    for (int g = 0; g < G; ++g) {
      const int q_off = qk && G > 1 ? g * q_in : 0, k_off = qk && G > 1 ? g * k_in : 0;
      const auto u = project(w.wq, g, q_in, q.x.data() + q_off, q.pos);
      std::vector<double> s(static_cast<std::size_t>(q.pos + 1));
      double mx = -1e300;
      for (std::int64_t t = 0; t <= q.pos; ++t) {
        const auto v = project(w.wk, g, k_in, &seq.keys[static_cast<std::size_t>(t * h.k_width + k_off)], t);
        double dot = 0;
        for (int e = 0; e < dim; ++e) dot += u[static_cast<std::size_t>(e)] * v[static_cast<std::size_t>(e)];
        s[static_cast<std::size_t>(t)] = dot;
        mx = std::max(mx, dot);
      }
      double z = 0;
      for (const double x : s) z += std::exp(x - mx);
      const double lse = mx + std::log(z);
      // The documented form: lse enters once (the f32 targets sum to 1 within rounding only).
      const auto p = q.target_of(g);
      total += lse;
      for (std::size_t t = 0; t < s.size(); ++t) {
        if (p[t] > 0) total += p[t] * (std::log(static_cast<double>(p[t])) - s[t]);
      }
    }
  }
  return total / static_cast<double>(a.queries.size() * static_cast<std::size_t>(G));
}

template <class T>
learn::Weights<T> cast(const learn::Weights<double>& w) {
  return {std::vector<T>(w.wq.begin(), w.wq.end()), std::vector<T>(w.wk.begin(), w.wk.end())};
}

constexpr int kDim = 4;

}  // namespace

TEST(LearnTrain, GradientMatchesCentralDifferencesInF64) {
  const LearnShape s;
  const auto c = masskv::test::learn_config(s);
  for (const Case& k : cases()) {
    const auto a = masskv::test::random_activations(s, k.input, k.groups, {23, 17}, 3, 11);
    const auto geo = learn::make_geometry(a, c, kDim, k.rope);
    const auto batch = all_queries(a);
    learn::Weights<double> w = masskv::test::random_weights<double>(geo, 5, 0.4), grad;
    learn::kl_loss<double>(a, geo, batch, w, &grad);
    double worst = 0;
    for (const bool q_side : {true, false}) {
      std::vector<double>& W = q_side ? w.wq : w.wk;
      const std::vector<double>& dW = q_side ? grad.wq : grad.wk;
      for (std::size_t i = 0; i < W.size(); i += 7) {
        constexpr double h = 1e-5;
        const double keep = W[i];
        W[i] = keep + h;
        const double up = learn::kl_loss<double>(a, geo, batch, w, nullptr);
        W[i] = keep - h;
        const double down = learn::kl_loss<double>(a, geo, batch, w, nullptr);
        W[i] = keep;
        const double fd = (up - down) / (2 * h);
        EXPECT_NEAR(dW[i], fd, 1e-7 + 1e-6 * std::abs(fd))
            << k.name() << (q_side ? " wq[" : " wk[") << i << "]";
        worst = std::max(worst, std::abs(dW[i]));
      }
    }
    EXPECT_GT(worst, 1e-3) << k.name() << ": the gradient should not vanish";
  }
}

TEST(LearnTrain, LossEqualsPlainF64ReferenceAndF32FollowsF64) {
  const LearnShape s;
  const auto c = masskv::test::learn_config(s);
  for (const Case& k : cases()) {
    const auto a = masskv::test::random_activations(s, k.input, k.groups, {40, 29, 9}, 4, 3);
    const auto geo = learn::make_geometry(a, c, kDim, k.rope);
    const auto batch = all_queries(a);
    const learn::Weights<double> w = masskv::test::random_weights<double>(geo, 9, 0.4);
    learn::Weights<double> gd;
    const double want = reference_loss(a, c, kDim, k.rope, w);
    const double got = learn::kl_loss<double>(a, geo, batch, w, &gd);
    EXPECT_NEAR(got, want, 1e-12 * std::abs(want)) << k.name();
    EXPECT_GT(want, 0.1) << k.name();
    learn::Weights<float> gf;
    const double got32 = learn::kl_loss<float>(a, geo, batch, cast<float>(w), &gf);
    EXPECT_NEAR(got32, want, 1e-5 * std::abs(want) + 1e-6) << k.name();
    double scale = 0;
    for (const double v : gd.wq) scale = std::max(scale, std::abs(v));
    for (const double v : gd.wk) scale = std::max(scale, std::abs(v));
    for (std::size_t i = 0; i < gd.wq.size(); ++i) {
      EXPECT_NEAR(gf.wq[i], gd.wq[i], 1e-5 * scale) << k.name() << " wq[" << i << "]";
    }
    for (std::size_t i = 0; i < gd.wk.size(); ++i) {
      EXPECT_NEAR(gf.wk[i], gd.wk[i], 1e-5 * scale) << k.name() << " wk[" << i << "]";
    }
  }
}

TEST(LearnTrain, SameBitsForAnyThreadCount) {
  const LearnShape s;
  const auto c = masskv::test::learn_config(s);
  const int threads = omp_get_max_threads();
  for (const Case& k : cases()) {
    const auto a = masskv::test::random_activations(s, k.input, k.groups, {70, 45, 30}, 6, 21);
    const auto geo = learn::make_geometry(a, c, kDim, k.rope);
    const auto w = masskv::test::random_weights<float>(geo, 2, 0.4);
    learn::TrainConfig cfg;
    cfg.dim = kDim;
    cfg.rope = k.rope;
    cfg.steps = 4;
    cfg.batch = 5;
    cfg.init = learn::Init::random;
    std::vector<double> loss;
    std::vector<learn::Weights<float>> grads(2);
    std::vector<learn::LayerSelector> trained;
    for (const int n : {1, 3}) {
      omp_set_num_threads(n);
      loss.push_back(learn::kl_loss<float>(a, geo, all_queries(a), w, &grads[loss.size()]));
      learn::LayerReport report;
      trained.push_back(learn::train_layer(a, c, cfg, report));
    }
    omp_set_num_threads(threads);
    EXPECT_EQ(loss[0], loss[1]) << k.name();
    EXPECT_EQ(grads[0].wq, grads[1].wq) << k.name();
    EXPECT_EQ(grads[0].wk, grads[1].wk) << k.name();
    EXPECT_EQ(trained[0].wq, trained[1].wq) << k.name();
    EXPECT_EQ(trained[0].wk, trained[1].wk) << k.name();
  }
}

TEST(LearnTrain, LossDecreasesOnAFixedBatch) {
  const LearnShape s;
  const auto c = masskv::test::learn_config(s);
  for (const Case& k : cases()) {
    // Two sequences, the second held out; the batch is every training query, every step.
    const auto a = masskv::test::random_activations(s, k.input, k.groups, {48, 48}, 8, 5);
    learn::TrainConfig cfg;
    cfg.dim = 8;
    cfg.rope = k.rope;
    cfg.steps = 80;
    cfg.batch = 1000;
    cfg.lr = 0.05;
    cfg.init = learn::Init::random;
    std::vector<double> losses;
    learn::LayerReport report;
    const learn::LayerSelector out =
        learn::train_layer(a, c, cfg, report, [&](int, double l) { losses.push_back(l); });
    ASSERT_EQ(losses.size(), 80u);
    EXPECT_LT(losses.back(), 0.6 * losses.front()) << k.name();
    int ups = 0;
    for (std::size_t i = 1; i < losses.size(); ++i) ups += losses[i] > losses[i - 1] + 1e-6;
    EXPECT_LE(ups, 8) << k.name() << ": Adam on a fixed batch should mostly go down";
    EXPECT_EQ(out.wq.size(), static_cast<std::size_t>(out.groups * out.dim * out.q_in));
    EXPECT_EQ(report.curve.front().step, 0);
    EXPECT_EQ(report.curve.back().step, 80);
  }
}

TEST(LearnTrain, ArgumentErrorsNameTheArgument) {
  expect_error([] { learn::parse_layer_list("5-3", 30); }, ErrorCode::invalid_argument, "--layers");
  expect_error([] { learn::parse_layer_list("0-30", 30); }, ErrorCode::invalid_argument, "--layers");
  expect_error([] { learn::parse_layer_list("1,x", 30); }, ErrorCode::invalid_argument, "--layers");
  expect_error([] { learn::parse_layer_list("", 30); }, ErrorCode::invalid_argument, "--layers");
  expect_error([] { learn::parse_layer_list("3,", 30); }, ErrorCode::invalid_argument, "--layers");
  expect_error([] { learn::parse_layer_list("-1", 30); }, ErrorCode::invalid_argument, "--layers");
  EXPECT_EQ(learn::parse_layer_list("0-3,8,2", 30), (std::vector<int>{0, 1, 2, 3, 8}));
  EXPECT_EQ(learn::parse_layer_list("29", 30), (std::vector<int>{29}));
  expect_error([] { learn::parse_input("keys"); }, ErrorCode::invalid_argument, "--input");
  expect_error([] { learn::parse_init("svd"); }, ErrorCode::invalid_argument, "--init");
  expect_error([] { learn::parse_groups("heads", 3); }, ErrorCode::invalid_argument, "--groups");
  EXPECT_EQ(learn::parse_groups("kv", 3), 3);
  learn::TrainConfig cfg;
  cfg.dim = 0;
  expect_error([&] { cfg.validate(learn::Input::qk); }, ErrorCode::invalid_argument, "dim");
  cfg.dim = -3;
  expect_error([&] { cfg.validate(learn::Input::qk); }, ErrorCode::invalid_argument, "dim");
  cfg.dim = 5;
  cfg.rope = true;
  expect_error([&] { cfg.validate(learn::Input::qk); }, ErrorCode::invalid_argument, "rope");
  expect_error([&] { cfg.validate(learn::Input::hidden); }, ErrorCode::invalid_argument, "dim");
  cfg = {};
  cfg.lr = 0;
  expect_error([&] { cfg.validate(learn::Input::qk); }, ErrorCode::invalid_argument, "lr");
  cfg = {};
  cfg.steps = -1;
  expect_error([&] { cfg.validate(learn::Input::qk); }, ErrorCode::invalid_argument, "steps");

  const LearnShape s;
  const auto c = masskv::test::learn_config(s);
  const auto a = masskv::test::random_activations(s, learn::Input::qk, 1, {20}, 2, 1);
  learn::LayerReport report;
  cfg = {};
  expect_error([&] { learn::train_layer(a, c, cfg, report); }, ErrorCode::invalid_argument,
               "heldout");
  const auto h = masskv::test::random_activations(s, learn::Input::hidden, 1, {20, 20}, 2, 1);
  cfg.init = learn::Init::pca;
  expect_error([&] { learn::train_layer(h, c, cfg, report); }, ErrorCode::invalid_argument, "init");
  auto other = c;
  other.n_embd += 1;
  expect_error([&] { learn::make_geometry(h, other, 4, false); }, ErrorCode::invalid_argument, "data");
}
