// Fitting an entmax conversion (include/masskv/learn/conversion.hpp, docs/design.md §2.10).
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>

#include "masskv/error.hpp"
#include "masskv/learn/conversion.hpp"
#include "masskv/mapping.hpp"

namespace masskv::learn {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

void report(const FitProgress& progress, std::string_view phase, std::int64_t done,
            std::int64_t total) {
  if (progress) progress(phase, done, total);
}

// Tsallis α-entropy (1 − Σ p^α) / (α(α − 1)): the regulariser whose argmax is entmax (§2.1).
double tsallis_entropy(std::span<const double> p, double alpha) {
  double s = 0;
  for (const double x : p) {
    if (x > 0) s += std::pow(x, alpha);
  }
  return (1.0 - s) / (alpha * (alpha - 1.0));
}

// L(θ; y) from its parts: ⟨θ, p⟩ − ⟨θ, y⟩ + H(p) − H(y), clamped at its infimum 0 (rounding).
double fenchel_young(double theta_p, double theta_y, double h_p, double h_y) {
  return std::max(0.0, theta_p - theta_y + h_p - h_y);
}

// What a row's proxies need of the softmax target y = softmax(s), independent of t.
struct Target {
  double lse = 0;  // log Σ e^s: log y_i = s_i − lse
  double sy = 0;   // ⟨s, y⟩
  double hy = 0;   // H_α(y)
};

Target make_target(std::span<const double> s, double alpha, std::vector<double>& y) {
  y.resize(s.size());
  Target tg;
  tg.lse = softmax(s, y);
  for (std::size_t i = 0; i < s.size(); ++i) tg.sy += s[i] * y[i];
  tg.hy = tsallis_entropy(y, alpha);
  return tg;
}

// The proxy of one row at temperature t; `theta` and `p` are scratch.
double row_loss(std::span<const double> s, const Target& tg, Proxy proxy, double alpha, double t,
                std::vector<double>& theta, std::vector<double>& p) {
  theta.resize(s.size());
  p.resize(s.size());
  for (std::size_t i = 0; i < s.size(); ++i) theta[i] = t * s[i];
  entmax(std::span<const double>(theta), alpha, std::span<double>(p));
  if (proxy == Proxy::kl) {
    // KL(p ‖ y) = Σ_{p_i > 0} p_i (log p_i − log y_i): finite, entmax's zeros add nothing.
    double kl = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (p[i] > 0) kl += p[i] * (std::log(p[i]) - (s[i] - tg.lse));
    }
    return std::max(0.0, kl);
  }
  double theta_p = 0;
  for (std::size_t i = 0; i < s.size(); ++i) theta_p += theta[i] * p[i];
  return fenchel_young(theta_p, t * tg.sy, tsallis_entropy(p, alpha), tg.hy);
}

// mean_proxy of one head as a function of t, the targets computed once.
class HeadObjective {
 public:
  HeadObjective(const ScoreRows& rows, Proxy proxy, double alpha)
      : rows_(&rows), proxy_(proxy), alpha_(alpha) {
    targets_.reserve(rows.rows());
    for (std::size_t r = 0; r < rows.rows(); ++r) {
      load(r);
      targets_.push_back(make_target(s_, alpha, y_));
    }
  }
  double operator()(double t) {
    double sum = 0;
    for (std::size_t r = 0; r < rows_->rows(); ++r) {
      load(r);
      sum += row_loss(s_, targets_[r], proxy_, alpha_, t, theta_, p_);
    }
    return rows_->rows() > 0 ? sum / static_cast<double>(rows_->rows()) : 0.0;
  }

 private:
  void load(std::size_t r) {
    const std::span<const float> row = rows_->row(r);
    s_.assign(row.begin(), row.end());
  }
  const ScoreRows* rows_;
  Proxy proxy_;
  double alpha_;
  std::vector<Target> targets_;
  std::vector<double> s_, y_, theta_, p_;
};

void check_alpha(double alpha) {
  require(std::isfinite(alpha) && alpha > 1.0 && alpha <= 2.0, ErrorCode::invalid_argument,
          "alpha", "entmax needs a finite alpha in (1, 2], got ", alpha);
}

void check_chunks(std::span<const std::vector<model::TokenId>> chunks) {
  require(!chunks.empty(), ErrorCode::invalid_argument, "chunks", "no calibration chunks");
  for (std::size_t i = 0; i < chunks.size(); ++i) {
    require(chunks[i].size() >= 16, ErrorCode::invalid_argument, "chunks", "chunk ", i, " has ",
            chunks[i].size(), " tokens, fewer than 16");
  }
}

// Runs `chunk` through a session with `options` (mapping and multipliers) and hands the logits
// after each token of its second half to `visit(pos, logits)`; the first half is prefilled
// without the head. Blocks of prefill_block keep the logits buffer small (Gemma's vocabulary
// is 262K).
void second_half_logits(const model::Model& model, const model::SessionOptions& options,
                        const std::vector<model::TokenId>& chunk,
                        const std::function<void(std::size_t, std::span<const float>)>& visit) {
  model::SessionOptions so;
  so.max_tokens = static_cast<std::int64_t>(chunk.size());
  so.mapping = options.mapping;
  so.score_multipliers = options.score_multipliers;
  model::Session session(model, so);
  const std::span<const model::TokenId> all(chunk);
  const std::size_t first = chunk.size() / 2;
  session.prefill(all.first(first), {});
  const auto V = sz(model.config().n_vocab);
  const auto block = sz(so.prefill_block);
  std::vector<float> logits;
  for (std::size_t b = first; b < chunk.size(); b += block) {
    const std::size_t n = std::min(block, chunk.size() - b);
    session.prefill(all.subspan(b, n), {}, &logits);
    for (std::size_t i = 0; i < n; ++i) visit(b + i, std::span<const float>(logits).subspan(i * V, V));
  }
}

// log-softmax in f64 of one row of logits.
void log_softmax(std::span<const float> logits, std::vector<double>& out) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (const float x : logits) sum += std::exp(static_cast<double>(x) - mx);
  const double lse = mx + std::log(sum);
  out.resize(logits.size());
  for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - lse;
}

std::vector<float> scaled(const std::vector<float>& t, double g) {
  std::vector<float> out(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) out[i] = static_cast<float>(g * t[i]);
  return out;
}

}  // namespace

std::string_view to_string(Proxy proxy) {
  return proxy == Proxy::kl ? "kl" : "fenchel_young";
}

double entmax_fenchel_young(std::span<const double> theta, std::span<const double> y,
                            double alpha) {
  check_alpha(alpha);
  require(!theta.empty() && y.size() == theta.size(), ErrorCode::shape_mismatch, "y", "has ",
          y.size(), " values for ", theta.size(), " scores");
  std::vector<double> p(theta.size());
  entmax(theta, alpha, std::span<double>(p));
  double theta_p = 0, theta_y = 0;
  for (std::size_t i = 0; i < theta.size(); ++i) {
    theta_p += theta[i] * p[i];
    theta_y += theta[i] * y[i];
  }
  return fenchel_young(theta_p, theta_y, tsallis_entropy(p, alpha), tsallis_entropy(y, alpha));
}

double proxy_loss(Proxy proxy, std::span<const double> scores, double alpha, double t) {
  check_alpha(alpha);
  require(!scores.empty(), ErrorCode::invalid_argument, "scores", "is empty");
  require(std::isfinite(t) && t > 0, ErrorCode::invalid_argument, "t", "must be finite and > 0");
  std::vector<double> y, theta, p;
  const Target tg = make_target(scores, alpha, y);
  return row_loss(scores, tg, proxy, alpha, t, theta, p);
}

Minimum minimize_1d(const std::function<double(double)>& f, double lo, double hi, int grid,
                    double tol) {
  require(grid >= 3, ErrorCode::invalid_argument, "grid", "needs >= 3 points, got ", grid);
  require(std::isfinite(lo) && std::isfinite(hi) && lo < hi, ErrorCode::invalid_argument, "hi",
          "the interval [", lo, ", ", hi, "] is empty or not finite");
  require(tol > 0, ErrorCode::invalid_argument, "tol", "must be > 0");
  Minimum best;
  best.f = std::numeric_limits<double>::infinity();
  const auto eval = [&](double x) {
    const double v = f(x);
    ++best.evaluations;
    if (v < best.f) {
      best.f = v;
      best.x = x;
    }
    return v;
  };
  const double step = (hi - lo) / (grid - 1);
  int at = 0;
  double f_at = std::numeric_limits<double>::infinity();
  for (int i = 0; i < grid; ++i) {
    const double v = eval(lo + step * i);
    if (v < f_at) {
      f_at = v;
      at = i;
    }
  }
  // The grid's best point and its neighbours bracket the minimum of a unimodal f.
  double a = lo + step * std::max(0, at - 1), b = lo + step * std::min(grid - 1, at + 1);
  const double r = (std::sqrt(5.0) - 1.0) / 2.0;
  double c = b - r * (b - a), d = a + r * (b - a);
  double fc = eval(c), fd = eval(d);
  while (b - a > tol) {
    if (fc <= fd) {
      b = d;
      d = c;
      fd = fc;
      c = b - r * (b - a);
      fc = eval(c);
    } else {
      a = c;
      c = d;
      fc = fd;
      d = a + r * (b - a);
      fd = eval(d);
    }
  }
  return best;
}

void ScoreRows::add_row(std::span<const double> scores) {
  const std::size_t start = values.size();
  for (const double s : scores) values.push_back(static_cast<float>(s));
  std::sort(values.begin() + static_cast<std::ptrdiff_t>(start), values.end(), std::greater<>());
  begin.push_back(values.size());
}

CalibrationScores collect_scores(const model::Model& model,
                                 std::span<const std::vector<model::TokenId>> chunks,
                                 int queries_per_chunk, const FitProgress& progress) {
  check_chunks(chunks);
  require(queries_per_chunk >= 1, ErrorCode::invalid_argument, "queries_per_chunk",
          "must be >= 1, got ", queries_per_chunk);
  const model::ModelConfig& c = model.config();
  const std::size_t L = sz(c.n_layer), Hq = sz(c.n_head), Hkv = sz(c.n_head_kv),
                    D = sz(c.head_dim), group = Hq / Hkv;
  CalibrationScores out;
  out.n_layer = c.n_layer;
  out.n_head = c.n_head;
  out.heads.resize(L * Hq);
  for (std::size_t ci = 0; ci < chunks.size(); ++ci) {
    const std::vector<model::TokenId>& chunk = chunks[ci];
    const std::size_t n = chunk.size();
    const std::size_t Q = std::min(n, sz(queries_per_chunk));
    std::vector<std::size_t> queries;  // ascending, the last position included
    for (std::size_t i = Q; i-- > 0;) queries.push_back(n - 1 - i * n / Q);
    std::vector<std::vector<float>> keys(L), qs(L);  // [n][Hkv][D], [Q][Hq][D] per layer
    model::SessionOptions so;
    so.max_tokens = static_cast<std::int64_t>(n);
    so.capture = [&](const model::LayerCapture& cap) {
      const std::size_t l = sz(cap.layer);
      keys[l].insert(keys[l].end(), cap.k.begin(), cap.k.end());
      for (int t = 0; t < cap.n; ++t) {
        const auto pos = sz(cap.pos0 + t);
        if (!std::binary_search(queries.begin(), queries.end(), pos)) continue;
        const auto row = cap.q.subspan(sz(t) * Hq * D, Hq * D);
        qs[l].insert(qs[l].end(), row.begin(), row.end());
      }
    };
    model::Session session(model, so);
    session.prefill(chunk, {});
    const std::int64_t W = c.sliding_window;
#pragma omp parallel for schedule(dynamic)
    for (std::int64_t lh = 0; lh < static_cast<std::int64_t>(L * Hq); ++lh) {
      const std::size_t l = sz(lh) / Hq, h = sz(lh) % Hq, kvh = h / group;
      const bool local = c.is_local[l] != 0;
      std::vector<double> s;
      for (std::size_t qi = 0; qi < queries.size(); ++qi) {
        const std::size_t p = queries[qi];
        const std::size_t first =
            local && static_cast<std::int64_t>(p) >= W ? p - sz(W) + 1 : 0;
        const float* q = &qs[l][(qi * Hq + h) * D];
        s.clear();
        for (std::size_t j = first; j <= p; ++j) {
          const float* k = &keys[l][(j * Hkv + kvh) * D];
          double dot = 0;
          for (std::size_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
          s.push_back(static_cast<double>(c.attn_scale) * dot);
        }
        out.heads[sz(lh)].add_row(s);
      }
    }
    report(progress, "scores", static_cast<std::int64_t>(ci + 1),
           static_cast<std::int64_t>(chunks.size()));
  }
  return out;
}

double mean_proxy(const ScoreRows& rows, Proxy proxy, double alpha, double t) {
  check_alpha(alpha);
  return HeadObjective(rows, proxy, alpha)(t);
}

double support_fraction(const ScoreRows& rows, double alpha, double t) {
  check_alpha(alpha);
  std::vector<double> theta, p;
  double sum = 0;
  for (std::size_t r = 0; r < rows.rows(); ++r) {
    const std::span<const float> s = rows.row(r);
    theta.resize(s.size());
    p.resize(s.size());
    for (std::size_t i = 0; i < s.size(); ++i) theta[i] = t * static_cast<double>(s[i]);
    const EntmaxThreshold th = entmax(std::span<const double>(theta), alpha, std::span<double>(p));
    sum += static_cast<double>(th.support) / static_cast<double>(s.size());
  }
  return rows.rows() > 0 ? sum / static_cast<double>(rows.rows()) : 0.0;
}

std::vector<float> fit_temperatures(const CalibrationScores& scores, double alpha, Proxy proxy,
                                    const FitProgress& progress) {
  check_alpha(alpha);
  const auto n = static_cast<std::int64_t>(scores.heads.size());
  std::vector<float> t(scores.heads.size());
  std::int64_t done = 0;
  const std::string phase = std::string("fit ") + std::string(to_string(proxy));
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t i = 0; i < n; ++i) {
    HeadObjective objective(scores.heads[sz(i)], proxy, alpha);
    // log t on [log 2^-8, log 2^8], grid step 0.35 (a factor 1.4), then golden section.
    const Minimum m = minimize_1d([&](double x) { return objective(std::exp(x)); },
                                  -8 * std::log(2.0), 8 * std::log(2.0), 33, 1e-4);
    t[sz(i)] = static_cast<float>(std::exp(m.x));
#pragma omp critical(masskv_fit_progress)
    report(progress, phase, ++done, n);
  }
  return t;
}

NextTokenKl::NextTokenKl(const model::Model& model, std::vector<std::vector<model::TokenId>> chunks,
                         std::size_t max_bytes, const FitProgress& progress)
    : model_(&model), chunks_(std::move(chunks)) {
  check_chunks(chunks_);
  const auto V = sz(model.config().n_vocab);
  std::size_t total = 0;
  for (const auto& ch : chunks_) total += ch.size() - ch.size() / 2;
  const std::size_t keep = std::clamp<std::size_t>(max_bytes / (V * sizeof(float)), 1, total);
  const std::size_t stride = (total + keep - 1) / keep;
  std::size_t index = 0;
  std::vector<double> lp;
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    second_half_logits(model, model::SessionOptions{}, chunks_[ci],
                       [&](std::size_t pos, std::span<const float> logits) {
                         if (index++ % stride != 0) return;
                         where_.push_back({ci, pos});
                         log_softmax(logits, lp);
                         for (const double x : lp) log_probs_.push_back(static_cast<float>(x));
                       });
    report(progress, "reference logits", static_cast<std::int64_t>(ci + 1),
           static_cast<std::int64_t>(chunks_.size()));
  }
}

double NextTokenKl::operator()(const model::SessionOptions& converted,
                               const FitProgress& progress) const {
  const auto V = sz(model_->config().n_vocab);
  double sum = 0;
  std::size_t w = 0;
  std::vector<double> lq;
  for (std::size_t ci = 0; ci < chunks_.size(); ++ci) {
    second_half_logits(*model_, converted, chunks_[ci],
                       [&](std::size_t pos, std::span<const float> logits) {
                         if (w == where_.size() || where_[w].chunk != ci || where_[w].pos != pos) {
                           return;
                         }
                         log_softmax(logits, lq);
                         const float* lp = &log_probs_[w * V];
                         double kl = 0;
                         for (std::size_t i = 0; i < V; ++i) {
                           const double a = lp[i];
                           kl += std::exp(a) * (a - lq[i]);
                         }
                         sum += std::max(0.0, kl);
                         ++w;
                       });
    report(progress, "next-token KL", static_cast<std::int64_t>(ci + 1),
           static_cast<std::int64_t>(chunks_.size()));
  }
  return sum / static_cast<double>(where_.size());
}

ConvertResult convert(const model::Model& model, std::span<const std::vector<model::TokenId>> chunks,
                      const ConvertOptions& options, const FitProgress& progress) {
  check_chunks(chunks);
  require(!options.alphas.empty(), ErrorCode::invalid_argument, "alpha", "no α to fit");
  for (const double a : options.alphas) check_alpha(a);
  require(!options.proxies.empty(), ErrorCode::invalid_argument, "proxies", "no proxy to fit");
  for (const double g : options.global_scales) {
    require(std::isfinite(g) && g > 0, ErrorCode::invalid_argument, "global_scales",
            "multiplier ", g, " is not finite and > 0");
  }
  const CalibrationScores scores = collect_scores(model, chunks, options.queries_per_chunk, progress);
  const NextTokenKl kl(model, {chunks.begin(), chunks.end()}, options.kl_max_bytes, progress);
  const auto evaluate = [&](double alpha, const std::vector<float>& t) {
    model::SessionOptions so;
    so.mapping = Mapping::entmax(alpha);
    so.score_multipliers = t;
    return kl(so, progress);
  };

  ConvertResult result;
  std::vector<float> best_t;
  double best_kl = std::numeric_limits<double>::infinity();
  const auto consider = [&](const ConvertTrial& trial, const std::vector<float>& t) {
    result.trials.push_back(trial);
    if (trial.kl < best_kl) {
      best_kl = trial.kl;
      best_t = t;
      result.conversion.alpha = trial.alpha;
      result.conversion.proxy = std::string(to_string(trial.proxy));
      result.conversion.global_scale = trial.global_scale;
    }
  };
  for (const double alpha : options.alphas) {
    std::vector<float> alpha_t;
    ConvertTrial alpha_best;
    alpha_best.kl = std::numeric_limits<double>::infinity();
    for (const Proxy proxy : options.proxies) {
      std::vector<float> t = fit_temperatures(scores, alpha, proxy, progress);
      const ConvertTrial trial{alpha, proxy, 1.0, evaluate(alpha, t)};
      consider(trial, t);
      if (trial.kl < alpha_best.kl) {
        alpha_best = trial;
        alpha_t = std::move(t);
      }
    }
    for (const double g : options.global_scales) {
      if (g == 1.0) continue;
      const std::vector<float> t = scaled(alpha_t, g);
      consider({alpha, alpha_best.proxy, g, evaluate(alpha, t)}, t);
    }
  }
  EntmaxConversion& conv = result.conversion;
  {
    EntmaxConversion chosen = EntmaxConversion::identity(model, conv.alpha);
    chosen.proxy = conv.proxy;
    chosen.global_scale = conv.global_scale;
    conv = std::move(chosen);
  }
  conv.temperature = std::move(best_t);
  conv.calibration_tokens = 0;
  for (const auto& ch : chunks) conv.calibration_tokens += static_cast<std::int64_t>(ch.size());
  conv.calibration_kl = best_kl;
  conv.validate();
  result.unconverted_kl = evaluate(conv.alpha, std::vector<float>(conv.temperature.size(), 1.0f));
  std::vector<double> support(scores.heads.size()), plain(scores.heads.size());
#pragma omp parallel for schedule(dynamic)
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(support.size()); ++i) {
    support[sz(i)] = support_fraction(scores.heads[sz(i)], conv.alpha, conv.temperature[sz(i)]);
    plain[sz(i)] = support_fraction(scores.heads[sz(i)], conv.alpha, 1.0);
  }
  const auto n_heads = static_cast<double>(support.size());
  result.support = std::accumulate(support.begin(), support.end(), 0.0) / n_heads;
  result.unconverted_support = std::accumulate(plain.begin(), plain.end(), 0.0) / n_heads;
  return result;
}

}  // namespace masskv::learn
