// Activation collection for learned selectors (learn/activations.hpp): the file round-trips and
// rejects what is out of order or truncated; query positions; on SmolLM2 and real text, the
// collected targets are distributions equal to an f64 recomputation from the captured q/k, and
// a selector distilled from them beats a random one in held-out recall.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "installed_model.hpp"
#include "learn_fixture.hpp"
#include "masskv/learn/activations.hpp"
#include "masskv/learn/recall.hpp"
#include "masskv/learn/train.hpp"
#include "policy_text.hpp"

namespace fs = std::filesystem;
namespace learn = masskv::learn;
namespace model = masskv::model;
using masskv::ErrorCode;
using masskv::test::expect_error;

namespace {

fs::path temp_dir(const std::string& name) {
  const fs::path p =
      fs::temp_directory_path() / ("masskv_test_" + std::to_string(::getpid()) + "_" + name);
  fs::create_directories(p);
  return p;
}

std::vector<learn::ActivationQuery> sorted_queries(std::vector<learn::ActivationQuery> q) {
  std::stable_sort(q.begin(), q.end(), [](const auto& x, const auto& y) {
    return std::pair(x.seq, x.pos) < std::pair(y.seq, y.pos);
  });
  return q;
}

// Writes `a` in the file's order: per sequence its key rows in blocks of `block`, each query
// right after the block holding its position.
void write(const learn::LayerActivations& a, const std::string& path, int block) {
  learn::ActivationWriter w(path, a.header);
  const auto kw = static_cast<std::size_t>(a.header.k_width);
  for (std::size_t si = 0; si < a.sequences.size(); ++si) {
    const auto& s = a.sequences[si];
    w.begin_sequence(s.length);
    for (std::int64_t p0 = 0; p0 < s.length; p0 += block) {
      const int n = static_cast<int>(std::min<std::int64_t>(block, s.length - p0));
      w.keys(p0, n, std::span<const float>(&s.keys[static_cast<std::size_t>(p0) * kw], n * kw));
      for (const auto& q : sorted_queries(a.queries)) {
        if (q.seq == static_cast<int>(si) && q.pos >= p0 && q.pos < p0 + n) {
          w.query(q.pos, q.x, q.quest, q.target);
        }
      }
    }
  }
  w.close();
}

}  // namespace

TEST(LearnActivations, FileRoundTripsAndRejectsBadStreams) {
  const masskv::test::LearnShape s;
  const fs::path dir = temp_dir("acts");
  for (const auto input : {learn::Input::qk, learn::Input::hidden}) {
    const auto a = masskv::test::random_activations(s, input, s.n_head_kv, {30, 13}, 4, 8);
    const std::string path = learn::activation_path(dir.string(), a.header.layer);
    EXPECT_EQ(fs::path(path).filename(), "layer02.mkva");
    write(a, path, 7);
    EXPECT_FALSE(fs::exists(path + ".part"));
    const learn::LayerActivations b = learn::read_activations(path);
    EXPECT_EQ(b.header.k_width, a.header.k_width);
    EXPECT_EQ(b.header.groups, a.header.groups);
    EXPECT_EQ(b.header.input, input);
    ASSERT_EQ(b.sequences.size(), 2u);
    for (std::size_t i = 0; i < 2; ++i) EXPECT_EQ(b.sequences[i].keys, a.sequences[i].keys);
    const auto want = sorted_queries(a.queries);
    ASSERT_EQ(b.queries.size(), want.size());
    for (std::size_t j = 0; j < want.size(); ++j) {
      EXPECT_EQ(b.queries[j].seq, want[j].seq);
      EXPECT_EQ(b.queries[j].pos, want[j].pos);
      EXPECT_EQ(b.queries[j].x, want[j].x);
      EXPECT_EQ(b.queries[j].target, want[j].target);
      EXPECT_EQ(b.queries[j].quest, want[j].quest);
    }
    // A file cut anywhere is rejected, as is another file.
    const auto size = fs::file_size(path);
    for (const std::uintmax_t cut : {size - 4, size - 9, size / 2, std::uintmax_t{10}}) {
      const std::string cut_path = (dir / "cut.mkva").string();
      fs::copy_file(path, cut_path, fs::copy_options::overwrite_existing);
      fs::resize_file(cut_path, cut);
      expect_error([&] { learn::read_activations(cut_path); }, ErrorCode::invalid_argument, "path");
    }
    std::ofstream((dir / "junk.mkva").string()) << "not an activation file at all";
    expect_error([&] { learn::read_activations((dir / "junk.mkva").string()); },
                 ErrorCode::invalid_argument, "path");
    expect_error([&] { learn::read_activations((dir / "absent.mkva").string()); }, ErrorCode::io,
                 "path");
  }
  // Records out of order.
  const auto a = masskv::test::random_activations(s, learn::Input::qk, 1, {10}, 1, 2);
  const auto kw = static_cast<std::size_t>(a.header.k_width);
  const std::string path = (dir / "order.mkva").string();
  {
    learn::ActivationWriter w(path, a.header);
    expect_error([&] { w.keys(0, 1, std::span<const float>(a.sequences[0].keys.data(), kw)); },
                 ErrorCode::invalid_argument, "pos0");
    w.begin_sequence(10);
    w.keys(0, 2, std::span<const float>(a.sequences[0].keys.data(), 2 * kw));
    expect_error([&] { w.keys(3, 1, std::span<const float>(a.sequences[0].keys.data(), kw)); },
                 ErrorCode::invalid_argument, "pos0");
    const auto& q = a.queries[0];
    std::vector<float> t3(3, 1.0f / 3);
    expect_error([&] { w.query(5, q.x, q.quest, std::vector<float>(6, 1.0f / 6)); },
                 ErrorCode::invalid_argument, "pos");
    expect_error([&] { w.query(2, q.x, q.quest, t3); }, ErrorCode::invalid_argument, "pos");
    expect_error([&] { w.query(1, q.x, q.quest, t3); }, ErrorCode::shape_mismatch, "target");
    w.query(1, q.x, q.quest, std::vector<float>(2, 0.5f));
    expect_error([&] { w.query(1, q.x, q.quest, std::vector<float>(2, 0.5f)); },
                 ErrorCode::invalid_argument, "pos");
    expect_error([&] { w.close(); }, ErrorCode::invalid_argument, "length");
  }
  EXPECT_FALSE(fs::exists(path));  // never closed: only the .part file
  fs::remove_all(dir);
}

TEST(LearnActivations, QueryPositionsAreDistinctAscendingAndFavourLongPrefixes) {
  const auto p = learn::sample_query_positions(10000, 400, 64, 3);
  ASSERT_EQ(p.size(), 400u);
  for (std::size_t i = 0; i < p.size(); ++i) {
    EXPECT_GE(p[i], 64);
    EXPECT_LT(p[i], 10000);
    if (i > 0) {
      EXPECT_LT(p[i - 1], p[i]);
    }
  }
  // Density ∝ t on [64, 10000): the median is near 10000/√2 ≈ 7071 (uniform: 5032).
  EXPECT_GT(p[200], 6300);
  EXPECT_LT(p[200], 7800);
  EXPECT_EQ(learn::sample_query_positions(10000, 400, 64, 3), p);
  EXPECT_NE(learn::sample_query_positions(10000, 400, 64, 4), p);
  EXPECT_EQ(learn::sample_query_positions(70, 400, 64, 3),
            (std::vector<std::int64_t>{64, 65, 66, 67, 68, 69}));
  EXPECT_TRUE(learn::sample_query_positions(64, 10, 64, 3).empty());
  expect_error([] { learn::sample_query_positions(100, 0, 0, 1); }, ErrorCode::invalid_argument,
               "queries");
}

// What a plain capture of the same prefill sees of one layer.
struct Captured {
  std::vector<float> q, k, x;
};

std::map<int, Captured> capture(const model::Model& m, const std::vector<model::TokenId>& ids,
                                const std::vector<int>& layers) {
  std::map<int, Captured> out;
  model::SessionOptions so;
  so.max_tokens = static_cast<std::int64_t>(ids.size());
  so.capture = [&](const model::LayerCapture& cap) {
    if (std::find(layers.begin(), layers.end(), cap.layer) == layers.end()) return;
    Captured& c = out[cap.layer];
    c.q.insert(c.q.end(), cap.q.begin(), cap.q.end());
    c.k.insert(c.k.end(), cap.k.begin(), cap.k.end());
    c.x.insert(c.x.end(), cap.x.begin(), cap.x.end());
  };
  model::Session session(m, so);
  session.prefill(ids, {});
  return out;
}

TEST(LearnActivations, TargetsAreTheDenseAttentionOfTheCapturedQK) {
  REQUIRE_MODEL(m, "smollm2");
  REQUIRE_TEXT();
  const model::ModelConfig& c = m->config();
  const auto seqs = learn::text_sequences(m->tokenizer(), masskv::test::policy_text(), 2, 100);
  const std::vector<int> layers = {1, 7};
  std::vector<std::map<int, Captured>> captured;
  for (const auto& s : seqs) captured.push_back(capture(*m, s, layers));
  const fs::path dir = temp_dir("collect");
  const int D = c.head_dim, Hq = c.n_head, Hkv = c.n_head_kv, hpg = Hq / Hkv;
  // Both input kinds and both target granularities.
  for (const auto& [input, groups] : {std::pair{learn::Input::qk, Hkv}, std::pair{learn::Input::hidden, 1}}) {
    if (masskv::test::kSanitized && input == learn::Input::hidden) continue;  // prefills are slow
    {
      learn::CollectConfig cc;
      cc.layers = layers;
      cc.input = input;
      cc.groups = groups;
      cc.queries = 5;
      cc.min_prefix = 20;
      learn::collect_activations(*m, seqs, cc, dir.string());
      for (const int l : layers) {
        const auto a = learn::read_activations(learn::activation_path(dir.string(), l));
        ASSERT_EQ(a.sequences.size(), 2u);
        ASSERT_EQ(a.queries.size(), 10u);
        for (int si = 0; si < 2; ++si) {
          const Captured& cap = captured[static_cast<std::size_t>(si)].at(l);
          EXPECT_EQ(a.sequences[static_cast<std::size_t>(si)].keys,
                    input == learn::Input::qk ? cap.k : cap.x);
          for (const auto& q : a.queries) {
            if (q.seq != si) continue;
            const auto pos = static_cast<std::size_t>(q.pos);
            const std::size_t n = pos + 1;
            const std::vector<float>& rows = input == learn::Input::qk ? cap.q : cap.x;
            const std::size_t w = q.x.size();
            EXPECT_TRUE(std::equal(q.x.begin(), q.x.end(), rows.begin() + static_cast<std::ptrdiff_t>(pos * w)));
            // f64 softmax per head, then the mean over the group's (or all) heads.
            std::vector<double> want(static_cast<std::size_t>(groups) * n, 0.0), head(n);
            std::vector<std::vector<double>> group_mean(static_cast<std::size_t>(Hkv), std::vector<double>(n, 0.0));
            for (int h = 0; h < Hq; ++h) {
              double mx = -1e300, z = 0;
              for (std::size_t t = 0; t < n; ++t) {
                double dot = 0;
                for (int d = 0; d < D; ++d) {
                  dot += static_cast<double>(cap.q[(pos * Hq + h) * D + d]) *
                         cap.k[(t * Hkv + h / hpg) * D + d];
                }
                head[t] = dot * c.attn_scale;
                mx = std::max(mx, head[t]);
              }
              for (double& v : head) z += (v = std::exp(v - mx));
              const int g = groups == 1 ? 0 : h / hpg;
              for (std::size_t t = 0; t < n; ++t) {
                want[static_cast<std::size_t>(g) * n + t] += head[t] / z / (groups == 1 ? Hq : hpg);
                group_mean[static_cast<std::size_t>(h / hpg)][t] += head[t] / z / hpg;
              }
            }
            for (int g = 0; g < groups; ++g) {
              const auto p = q.target_of(g);
              double sum = 0, err = 0;
              for (std::size_t t = 0; t < n; ++t) {
                sum += p[t];
                err = std::max(err, std::abs(p[t] - want[static_cast<std::size_t>(g) * n + t]));
              }
              EXPECT_NEAR(sum, 1.0, 1e-5) << "layer " << l << " pos " << q.pos;
              EXPECT_LT(err, 1e-6) << "layer " << l << " pos " << q.pos;
            }
            // Quest never covers more than the best pages under the same rule.
            for (int g = 0; g < Hkv; ++g) {
              std::vector<float> pg(group_mean[static_cast<std::size_t>(g)].begin(),
                                    group_mean[static_cast<std::size_t>(g)].end());
              std::vector<float> page_mass((n + 15) / 16, 0.0f);
              for (std::size_t t = 0; t < n; ++t) page_mass[t / 16] += pg[t];
              const double best = learn::covered_mass(page_mass, 1, pg, 16, 16);
              EXPECT_GE(q.quest[static_cast<std::size_t>(g)], 0.0f);
              EXPECT_LE(q.quest[static_cast<std::size_t>(g)], best + 1e-5);
            }
          }
        }
      }
    }
  }
  fs::remove_all(dir);
}

TEST(LearnActivations, DistilledSelectorBeatsRandomOnRealText) {
  REQUIRE_MODEL(m, "smollm2");
  REQUIRE_TEXT();
  if (masskv::test::kSanitized) GTEST_SKIP() << "too slow under sanitizers";
  const auto seqs = learn::text_sequences(m->tokenizer(), masskv::test::policy_text(), 3, 320);
  const fs::path dir = temp_dir("distill");
  learn::CollectConfig cc;
  cc.layers = {9};
  cc.queries = 48;
  learn::collect_activations(*m, seqs, cc, dir.string());
  const auto a = learn::read_activations(learn::activation_path(dir.string(), 9));
  learn::TrainConfig cfg;
  cfg.dim = 16;
  cfg.steps = 100;
  cfg.batch = 16;
  cfg.eval_every = 50;
  learn::LayerReport r;
  learn::train_layer(a, m->config(), cfg, r);
  EXPECT_LT(r.trained.kl, r.init.kl);
  EXPECT_LT(r.trained.kl, r.random.kl);
  // At 1/16 of ~300 tokens (two pages) even the oracle covers little: the distilled selector
  // must close most of the gap between a random one and the oracle.
  ASSERT_GT(r.trained.oracle, r.random.recall + 0.03);
  EXPECT_GT(r.trained.recall, r.random.recall + 0.5 * (r.trained.oracle - r.random.recall))
      << "trained " << r.trained.recall << " random " << r.random.recall;
  EXPECT_LE(r.trained.recall, r.trained.oracle + 1e-6);
  std::printf("layer 9, 2 x 320 tokens: held-out KL %.3f (pca init %.3f, random init %.3f), "
              "recall at 1/16 %.3f (random init %.3f, Quest %.3f, oracle %.3f)\n",
              r.trained.kl, r.init.kl, r.random.kl, r.trained.recall, r.random.recall,
              r.trained.quest, r.trained.oracle);
  fs::remove_all(dir);
}
