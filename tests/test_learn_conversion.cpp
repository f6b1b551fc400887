// Entmax conversion (learn/conversion.hpp, docs/design.md §2.10) and the per-head score multipliers
// it runs through (SessionOptions::score_multipliers):
// - the proxies against an f64 reference built here (entmax by bisection, plain sums), the
//   Fenchel–Young loss's zero and gradient, the 1-D search on known functions;
// - the fit recovers a known temperature where one exists (two-score rows: softmax(s) equals
//   entmax_α(t*·s) exactly at a closed-form t*), and elsewhere beats t = 1 and its neighbours;
// - the file round-trips, malformed files and other models are rejected;
// - on SmolLM2 (skipped when absent): multipliers of 1 give the same bits, a multiplier scales
//   exactly its own head's q, certified sparse decoding of the converted model equals its dense
//   decoding, and a fit on a little real text lowers the next-token KL against t = 1.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "expect_error.hpp"
#include "installed_model.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/learn/selector.hpp"
#include "masskv/mapping.hpp"
#include "masskv/model/gguf.hpp"

namespace fs = std::filesystem;
namespace masskv::learn {
namespace {

using test::expect_error;

// ---- f64 references ---------------------------------------------------------------------

// entmax_α(θ) by bisection on τ over the §2.1 bracket, 200 rounds (independent of the
// library's sort-based and Halley solvers).
std::vector<double> ref_entmax(const std::vector<double>& theta, double alpha) {
  const double a1 = alpha - 1;
  std::vector<double> z(theta.size());
  for (std::size_t i = 0; i < z.size(); ++i) z[i] = a1 * theta[i];
  const double mx = *std::max_element(z.begin(), z.end());
  const auto mass = [&](double tau) {
    double f = 0;
    for (const double x : z) f += x > tau ? std::pow(x - tau, 1 / a1) : 0.0;
    return f;
  };
  double lo = mx - 1, hi = mx;
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (mass(mid) >= 1 ? lo : hi) = mid;
  }
  std::vector<double> p(z.size());
  double sum = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    p[i] = z[i] > lo ? std::pow(z[i] - lo, 1 / a1) : 0.0;
    sum += p[i];
  }
  for (double& x : p) x /= sum;
  return p;
}

std::vector<double> ref_softmax(const std::vector<double>& s) {
  const double mx = *std::max_element(s.begin(), s.end());
  std::vector<double> y(s.size());
  double sum = 0;
  for (std::size_t i = 0; i < s.size(); ++i) sum += y[i] = std::exp(s[i] - mx);
  for (double& x : y) x /= sum;
  return y;
}

double ref_tsallis(const std::vector<double>& p, double alpha) {
  double s = 0;
  for (const double x : p) s += x > 0 ? std::pow(x, alpha) : 0.0;
  return (1 - s) / (alpha * (alpha - 1));
}

double ref_fy(const std::vector<double>& theta, const std::vector<double>& y, double alpha) {
  const std::vector<double> p = ref_entmax(theta, alpha);
  double d = 0;
  for (std::size_t i = 0; i < p.size(); ++i) d += theta[i] * (p[i] - y[i]);
  return d + ref_tsallis(p, alpha) - ref_tsallis(y, alpha);
}

double ref_proxy(Proxy proxy, const std::vector<double>& s, double alpha, double t) {
  std::vector<double> theta(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) theta[i] = t * s[i];
  const std::vector<double> y = ref_softmax(s);
  if (proxy == Proxy::fenchel_young) return ref_fy(theta, y, alpha);
  const std::vector<double> p = ref_entmax(theta, alpha);
  double kl = 0;
  for (std::size_t i = 0; i < p.size(); ++i) kl += p[i] > 0 ? p[i] * std::log(p[i] / y[i]) : 0.0;
  return kl;
}

std::vector<double> random_row(std::mt19937& rng, std::size_t n, double spread) {
  std::normal_distribution<double> normal(0.0, spread);
  std::vector<double> s(n);
  for (double& x : s) x = normal(rng);
  return s;
}

constexpr Proxy kProxies[] = {Proxy::kl, Proxy::fenchel_young};
constexpr double kAlphas[] = {1.25, 1.5, 2.0};

// ---- proxies and search --------------------------------------------------------------------

TEST(EntmaxFit, ProxiesMatchAnF64ReferenceOnRandomRows) {
  std::mt19937 rng(11);
  for (const std::size_t n : {1, 2, 3, 7, 33, 200}) {
    for (const double spread : {0.3, 2.0, 8.0}) {
      const std::vector<double> s = random_row(rng, n, spread);
      for (const double alpha : kAlphas) {
        for (const double t : {0.1, 0.45, 1.0, 3.0}) {
          for (const Proxy proxy : kProxies) {
            const double want = ref_proxy(proxy, s, alpha, t);
            EXPECT_NEAR(proxy_loss(proxy, s, alpha, t), want, 1e-9 * (1 + std::abs(want)))
                << to_string(proxy) << " n " << n << " spread " << spread << " α " << alpha
                << " t " << t;
          }
        }
      }
    }
  }
}

TEST(EntmaxFit, FenchelYoungIsZeroAtEntmaxPositiveElsewhereWithGradientPMinusY) {
  std::mt19937 rng(5);
  for (const double alpha : kAlphas) {
    for (const std::size_t n : {2, 9, 64}) {
      const std::vector<double> theta = random_row(rng, n, 2.0);
      const std::vector<double> p = ref_entmax(theta, alpha);
      EXPECT_NEAR(entmax_fenchel_young(theta, p, alpha), 0.0, 1e-10);
      const std::vector<double> y = ref_softmax(random_row(rng, n, 1.0));
      const double l = entmax_fenchel_young(theta, y, alpha);
      EXPECT_GT(l, 1e-6);
      EXPECT_NEAR(l, ref_fy(theta, y, alpha), 1e-9 * (1 + l));
      // d/dt L(tθ; y) at t = 1 is ⟨θ, p − y⟩ (∇Ω* = entmax).
      const double h = 1e-5;
      std::vector<double> up(theta), down(theta);
      for (std::size_t i = 0; i < n; ++i) {
        up[i] *= 1 + h;
        down[i] *= 1 - h;
      }
      const double numeric =
          (entmax_fenchel_young(up, y, alpha) - entmax_fenchel_young(down, y, alpha)) / (2 * h);
      double grad = 0;
      for (std::size_t i = 0; i < n; ++i) grad += theta[i] * (p[i] - y[i]);
      EXPECT_NEAR(numeric, grad, 1e-5 * (1 + std::abs(grad))) << "α " << alpha << " n " << n;
    }
  }
  const std::vector<double> two = {0.0, 1.0};
  expect_error([&] { entmax_fenchel_young(two, std::vector<double>{1.0}, 1.5); },
               ErrorCode::shape_mismatch, "y");
  expect_error([&] { entmax_fenchel_young(two, two, 1.0); }, ErrorCode::invalid_argument, "alpha");
  expect_error([&] { proxy_loss(Proxy::kl, two, 1.5, 0.0); }, ErrorCode::invalid_argument, "t");
  expect_error([&] { proxy_loss(Proxy::kl, std::vector<double>{}, 1.5, 1.0); },
               ErrorCode::invalid_argument, "scores");
}

TEST(EntmaxFit, Minimize1dFindsKnownMinima) {
  struct Case {
    std::function<double(double)> f;
    double lo, hi, x;
  };
  const std::vector<Case> cases = {
      {[](double x) { return (x - 0.37) * (x - 0.37); }, -3, 5, 0.37},
      {[](double x) { return std::exp(x) - 2 * x; }, -4, 4, std::log(2.0)},
      {[](double x) { return std::abs(x - 1.234); }, -2, 6, 1.234},
      {[](double x) { return x; }, 0, 1, 0},                      // at the lower end
      {[](double x) { return -std::log(x) + x / 7; }, 0.5, 3, 3},  // at the upper end
  };
  for (const Case& c : cases) {
    const Minimum m = minimize_1d(c.f, c.lo, c.hi, 17, 1e-7);
    EXPECT_NEAR(m.x, c.x, 1e-6);
    EXPECT_NEAR(m.f, c.f(c.x), 1e-6);
    EXPECT_LT(m.evaluations, 17 + 60);
  }
  const auto f = [](double x) { return x * x; };
  expect_error([&] { minimize_1d(f, 0, 1, 2, 1e-3); }, ErrorCode::invalid_argument, "grid");
  expect_error([&] { minimize_1d(f, 1, 1, 5, 1e-3); }, ErrorCode::invalid_argument, "hi");
  expect_error([&] { minimize_1d(f, 0, 1, 5, 0); }, ErrorCode::invalid_argument, "tol");
}

// Rows of two scores {0, d}: softmax gives σ(d) to the larger; entmax_α(t·s) gives p with
// p2^{α−1} − p1^{α−1} = (α−1)·t·d, so t* = (σ^{α−1} − (1−σ)^{α−1}) / ((α−1)·d) matches
// exactly and both proxies are 0 there.
TEST(EntmaxFit, FitRecoversTheExactTemperatureOfTwoScoreRows) {
  const double ds[] = {1.3, 2.1, 0.4};
  CalibrationScores sc;
  sc.n_layer = 1;
  sc.n_head = 3;
  sc.heads.resize(3);
  for (std::size_t h = 0; h < 3; ++h) {
    for (int r = 0; r < 5; ++r) {
      sc.heads[h].add_row(std::vector<double>{r % 2 ? ds[h] : 0.0, r % 2 ? 0.0 : ds[h]});
    }
  }
  for (const double alpha : kAlphas) {
    for (const Proxy proxy : kProxies) {
      const std::vector<float> t = fit_temperatures(sc, alpha, proxy);
      for (std::size_t h = 0; h < 3; ++h) {
        const double d = ds[h], sig = 1 / (1 + std::exp(-d));
        const double want =
            (std::pow(sig, alpha - 1) - std::pow(1 - sig, alpha - 1)) / ((alpha - 1) * d);
        EXPECT_NEAR(t[h], want, 2e-4 * want) << to_string(proxy) << " α " << alpha << " d " << d;
        EXPECT_NEAR(mean_proxy(sc.heads[h], proxy, alpha, want), 0.0, 1e-12);
      }
    }
  }
}

TEST(EntmaxFit, FittedTemperatureBeatsOneAndItsNeighboursOnRandomRows) {
  std::mt19937 rng(3);
  CalibrationScores sc;
  sc.n_layer = 2;
  sc.n_head = 2;
  sc.heads.resize(4);
  const double spreads[] = {1.5, 2.0, 4.0, 9.0};
  for (std::size_t h = 0; h < 4; ++h) {
    for (const std::size_t n : {5, 40, 120}) sc.heads[h].add_row(random_row(rng, n, spreads[h]));
  }
  for (const double alpha : {1.5, 2.0}) {
    for (const Proxy proxy : kProxies) {
      const std::vector<float> t = fit_temperatures(sc, alpha, proxy);
      for (std::size_t h = 0; h < 4; ++h) {
        const auto f = [&](double x) { return mean_proxy(sc.heads[h], proxy, alpha, x); };
        const double at = f(t[h]);
        EXPECT_LE(at, f(t[h] * 1.01) + 1e-12) << to_string(proxy) << " head " << h;
        EXPECT_LE(at, f(t[h] / 1.01) + 1e-12) << to_string(proxy) << " head " << h;
        EXPECT_LT(at, f(1.0)) << to_string(proxy) << " head " << h;
      }
    }
  }
}

TEST(EntmaxFit, ScoreRowsAreSortedDescending) {
  ScoreRows rows;
  rows.add_row(std::vector<double>{0.5, -1, 3, 2});
  rows.add_row(std::vector<double>{7});
  ASSERT_EQ(rows.rows(), 2u);
  const std::vector<float> r0(rows.row(0).begin(), rows.row(0).end());
  EXPECT_EQ(r0, (std::vector<float>{3, 2, 0.5f, -1}));
  EXPECT_EQ(rows.row(1).size(), 1u);
}

// ---- file ---------------------------------------------------------------------------------

EntmaxConversion small_conversion() {
  EntmaxConversion c;
  c.alpha = 1.25;
  c.architecture = "llama";
  c.model_name = "Tiny";
  c.n_layer = 3, c.n_embd = 32, c.n_head = 4, c.n_head_kv = 2, c.head_dim = 8;
  for (int i = 0; i < 12; ++i) c.temperature.push_back(0.1f + 0.37f * static_cast<float>(i));
  c.proxy = "kl";
  c.global_scale = 1.2;
  c.calibration_tokens = 4096;
  c.calibration_kl = 0.25;
  return c;
}

fs::path temp_path(const std::string& name) {
  return fs::temp_directory_path() / ("masskv_test_" + std::to_string(::getpid()) + "_" + name);
}

TEST(EntmaxConversionFile, RoundTripsAndHashesTheBytes) {
  const EntmaxConversion c = small_conversion();
  const fs::path p = temp_path("conv.gguf");
  save(c, p.string());
  const EntmaxConversion r = load_conversion(p.string());
  EXPECT_EQ(r.alpha, c.alpha);
  EXPECT_EQ(r.architecture, c.architecture);
  EXPECT_EQ(r.model_name, c.model_name);
  EXPECT_EQ(r.n_layer, c.n_layer);
  EXPECT_EQ(r.n_embd, c.n_embd);
  EXPECT_EQ(r.n_head, c.n_head);
  EXPECT_EQ(r.n_head_kv, c.n_head_kv);
  EXPECT_EQ(r.head_dim, c.head_dim);
  EXPECT_EQ(r.temperature, c.temperature);
  EXPECT_EQ(r.proxy, c.proxy);
  EXPECT_FLOAT_EQ(static_cast<float>(r.global_scale), 1.2f);
  EXPECT_EQ(r.calibration_tokens, 4096);
  EXPECT_FLOAT_EQ(static_cast<float>(r.calibration_kl), 0.25f);
  EXPECT_NE(r.file_hash, 0u);
  // Any GGUF reader sees the keys and the [layer][head] tensor as dims {n_head, n_layer}.
  const model::GgufFile f = model::GgufFile::open(p.string());
  EXPECT_EQ(f.get<std::string>("general.architecture"), "masskv-entmax");
  const model::GgufTensor& t = f.tensor("entmax.temperature");
  EXPECT_EQ(t.dims[0], 4u);
  EXPECT_EQ(t.dims[1], 3u);
  // Another temperature, another hash.
  EntmaxConversion c2 = c;
  c2.temperature[5] *= 2;
  save(c2, p.string());
  EXPECT_NE(load_conversion(p.string()).file_hash, r.file_hash);
  // apply() sets the converted attention.
  model::SessionOptions so;
  r.apply(so);
  EXPECT_TRUE(so.mapping.is_entmax());
  EXPECT_EQ(so.mapping.alpha, 1.25);
  EXPECT_EQ(so.score_multipliers, c.temperature);
  fs::remove(p);
}

TEST(EntmaxConversionFile, MalformedConversionsAndFilesAreRejected) {
  const auto bad = [](auto edit) {
    EntmaxConversion c = small_conversion();
    edit(c);
    expect_error([&] { c.validate(); }, ErrorCode::invalid_argument, "conversion");
    expect_error([&] { save(c, temp_path("never.gguf").string()); }, ErrorCode::invalid_argument,
                 "conversion");
  };
  bad([](EntmaxConversion& c) { c.alpha = 1.0; });
  bad([](EntmaxConversion& c) { c.alpha = 2.5; });
  bad([](EntmaxConversion& c) { c.temperature.pop_back(); });
  bad([](EntmaxConversion& c) { c.temperature[3] = 0; });
  bad([](EntmaxConversion& c) { c.temperature[3] = -1; });
  bad([](EntmaxConversion& c) { c.temperature[3] = std::nanf(""); });
  bad([](EntmaxConversion& c) { c.n_head_kv = 3; });
  expect_error([] { load_conversion(temp_path("missing.gguf").string()); }, ErrorCode::io, "path");
  // A selector file is a GGUF, but not a conversion.
  Selector s;
  s.architecture = "llama";
  s.n_layer = 1, s.n_embd = 8, s.n_head = 2, s.n_head_kv = 1, s.head_dim = 4;
  const fs::path p = temp_path("sel_not_conv.gguf");
  save(s, p.string());
  expect_error([&] { load_conversion(p.string()); }, ErrorCode::invalid_argument, "path",
               "not a masskv entmax conversion");
  // Truncated: the GGUF reader reports it as I/O.
  save(small_conversion(), p.string());
  fs::resize_file(p, fs::file_size(p) - 20);
  expect_error([&] { load_conversion(p.string()); }, ErrorCode::io, "path", "past the end");
  fs::remove(p);
}

// ---- on the real model ----------------------------------------------------------------------

std::vector<model::TokenId> text_tokens(const model::Model& m, int copies) {
  std::string text;
  for (int i = 0; i < copies; ++i) {
    text += "Every package must specify the dependency information about other packages that "
            "are required for the first to work correctly. The maintainer scripts run as root. ";
  }
  return m.tokenizer().encode(text, m.tokenizer().add_bos_default());
}

EntmaxConversion conversion_for(const model::Model& m, std::vector<float> t, double alpha) {
  EntmaxConversion conv = EntmaxConversion::identity(m, alpha);
  EXPECT_EQ(conv.temperature, std::vector<float>(t.size(), 1.0f));
  conv.temperature = std::move(t);
  return conv;
}

std::vector<float> all_logits(const model::Model& m, const model::SessionOptions& so,
                              std::span<const model::TokenId> toks) {
  model::Session s(m, so);
  std::vector<float> out;
  s.prefill(toks, {}, &out);
  const auto V = static_cast<std::size_t>(m.config().n_vocab);
  std::vector<float> lg(V);
  s.decode(toks.front(), lg);  // and one decode step
  out.insert(out.end(), lg.begin(), lg.end());
  return out;
}

TEST(ScoreMultipliers, OnesGiveTheSameBitsAndBadValuesThrow) {
  REQUIRE_MODEL(m, "smollm2");
  const auto toks = text_tokens(*m, 1);
  const std::size_t n = static_cast<std::size_t>(m->config().n_layer * m->config().n_head);
  for (const Mapping mapping : {Mapping::softmax(), Mapping::entmax(1.5)}) {
    model::SessionOptions so;
    so.max_tokens = 64;
    so.mapping = mapping;
    const auto plain = all_logits(*m, so, toks);
    so.score_multipliers.assign(n, 1.0f);
    EXPECT_EQ(all_logits(*m, so, toks), plain);
  }
  model::SessionOptions so;
  so.score_multipliers.assign(n - 1, 1.0f);
  expect_error([&] { model::Session s(*m, so); }, ErrorCode::shape_mismatch, "score_multipliers");
  for (const float bad : {0.0f, -0.5f, std::nanf(""), INFINITY}) {
    so.score_multipliers.assign(n, 1.0f);
    so.score_multipliers[n / 2] = bad;
    expect_error([&] { model::Session s(*m, so); }, ErrorCode::invalid_argument,
                 "score_multipliers");
  }
}

// Distinct multipliers on the heads of one layer: that layer's q (what attention and the
// selectors score) is exactly fl(c_h · q_h) head by head, the layers before it are untouched,
// so entmax_α(c_h · scale · q·k) is what the head computes.
TEST(ScoreMultipliers, EachMultiplierScalesItsOwnHeadsQueries) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ModelConfig& c = m->config();
  const auto toks = text_tokens(*m, 1);
  const auto H = static_cast<std::size_t>(c.n_head), D = static_cast<std::size_t>(c.head_dim);
  for (const int layer : {0, c.n_layer - 1}) {
    const auto capture_q = [&](const std::vector<float>& mult) {
      std::vector<std::vector<float>> q(static_cast<std::size_t>(c.n_layer));
      model::SessionOptions so;
      so.max_tokens = 64;
      so.mapping = Mapping::entmax(1.5);
      so.score_multipliers = mult;
      so.capture = [&](const model::LayerCapture& cap) {
        auto& dst = q[static_cast<std::size_t>(cap.layer)];
        dst.insert(dst.end(), cap.q.begin(), cap.q.end());
      };
      model::Session s(*m, so);
      s.prefill(toks, {});
      return q;
    };
    std::vector<float> mult(static_cast<std::size_t>(c.n_layer) * H, 1.0f);
    for (std::size_t h = 0; h < H; ++h) {
      mult[static_cast<std::size_t>(layer) * H + h] = 0.3f + 0.17f * static_cast<float>(h);
    }
    const auto ref = capture_q({});
    const auto got = capture_q(mult);
    for (std::size_t l = 0; l < static_cast<std::size_t>(layer); ++l) {
      EXPECT_EQ(got[l], ref[l]) << "layer " << l;
    }
    const auto& g = got[static_cast<std::size_t>(layer)];
    const auto& r = ref[static_cast<std::size_t>(layer)];
    ASSERT_EQ(g.size(), r.size());
    for (std::size_t i = 0; i < g.size(); ++i) {
      const std::size_t h = (i / D) % H;
      ASSERT_EQ(g[i], mult[static_cast<std::size_t>(layer) * H + h] * r[i])
          << "layer " << layer << " head " << h;
    }
  }
}

// The selectors and certificates score the converted q: wherever every selected head is
// certified exact, one sparse decode step gives the dense converted step's logits (had they
// scored the unconverted q, the certificate would not hold for the scores attention uses).
TEST(ScoreMultipliers, CertifiedSparseDecodeOfTheConvertedModelEqualsDense) {
  REQUIRE_MODEL(m, "smollm2");
  const model::ModelConfig& c = m->config();
  const auto toks = text_tokens(*m, 6);
  ASSERT_GT(toks.size(), 140u);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> u(2.5f, 5.0f);
  std::vector<float> t(static_cast<std::size_t>(c.n_layer * c.n_head));
  for (float& x : t) x = u(rng);
  model::SessionOptions so;
  so.max_tokens = 256;
  so.page_size = 8;
  so.kv_dtype = DType::f32;
  so.decode_activations = model::Activations::f32;
  so.fork_pages = 8;
  so.diagnostics = true;
  conversion_for(*m, t, 2.0).apply(so);
  const auto V = static_cast<std::size_t>(c.n_vocab);
  int certified_steps = 0;
  for (const std::size_t prefix : {64u, 100u, 137u}) {
    model::Session root(*m, so);
    root.prefill(std::span<const model::TokenId>(toks).first(prefix), {});
    std::vector<float> dense(V), sparse(V);
    model::Session d = root.fork();
    d.decode(toks[prefix], dense);
    model::Session s = root.fork();
    select::SelectorConfig sel;
    sel.method = select::Method::entmax_support;
    sel.mapping = so.mapping;
    sel.budget.kind = select::Budget::Kind::adaptive;
    sel.budget.tokens = 0;  // no cap: grown until certified
    s.set_selector(sel);
    s.decode(toks[prefix], sparse);
    const model::DecodeStats& st = s.last_decode_stats();
    ASSERT_GT(st.heads, 0);
    if (st.certified < st.heads) continue;
    certified_steps += st.kv_tokens_read < st.kv_tokens_total;
    double diff = 0;
    for (std::size_t i = 0; i < V; ++i) diff = std::max(diff, std::abs(double(dense[i]) - sparse[i]));
    EXPECT_LT(diff, 1e-3) << "prefix " << prefix;
  }
  // Box bounds are loose on 64-dim heads: certifying every head takes nearly every page, but
  // at least one step must certify with fewer than all of them, or nothing was checked.
  EXPECT_GT(certified_steps, 0) << "no sparse step certified: the test checked nothing";
}

TEST(ConvertOnTheRealModel, FitLowersTheNextTokenKlAndTheFileMatchesTheModel) {
  REQUIRE_MODEL(m, "smollm2");
  if (test::kSanitized) GTEST_SKIP() << "too slow under sanitizers; runs in the Release suite";
  const auto toks = text_tokens(*m, 8);
  ASSERT_GE(toks.size(), 192u);
  std::vector<std::vector<model::TokenId>> chunks = {
      {toks.begin(), toks.begin() + 96}, {toks.begin() + 96, toks.begin() + 192}};
  ConvertOptions o;
  o.queries_per_chunk = 8;
  o.global_scales = {1.3};
  const ConvertResult r = convert(*m, chunks, o);
  ASSERT_EQ(r.trials.size(), 3u);  // kl, fenchel_young at 1, the better one at 1.3
  double best = INFINITY;
  for (const ConvertTrial& trial : r.trials) best = std::min(best, trial.kl);
  EXPECT_EQ(r.conversion.calibration_kl, best);
  EXPECT_LT(r.conversion.calibration_kl, r.unconverted_kl);
  EXPECT_EQ(r.conversion.calibration_tokens, 192);
  r.conversion.check_model(*m, "--entmax-conversion");
  // The same KL, measured again, is deterministic.
  const NextTokenKl kl(*m, chunks);
  model::SessionOptions so;
  r.conversion.apply(so);
  EXPECT_EQ(kl(so), kl(so));
  EXPECT_NEAR(kl(so), r.conversion.calibration_kl, 1e-12);
  // Another model's shape is rejected, naming the option.
  EntmaxConversion other = r.conversion;
  other.n_head_kv = 1;
  expect_error([&] { other.check_model(*m, "--entmax-conversion"); }, ErrorCode::invalid_argument,
               "--entmax-conversion");
  other = r.conversion;
  other.model_name = "Some other model";
  expect_error([&] { other.check_model(*m, "--entmax-conversion"); }, ErrorCode::invalid_argument,
               "--entmax-conversion");
  expect_error([&] { convert(*m, std::vector<std::vector<model::TokenId>>{}, o); },
               ErrorCode::invalid_argument, "chunks");
  ConvertOptions bad = o;
  bad.alphas = {2.5};
  expect_error([&] { convert(*m, chunks, bad); }, ErrorCode::invalid_argument, "alpha");
}

}  // namespace
}  // namespace masskv::learn
