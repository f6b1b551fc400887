// Activation collection (include/masskv/learn/activations.hpp): one dense prefill per sequence
// with SessionOptions::capture; per chosen layer the model's keys of the sequence stay in memory
// (the targets need every key of the prefix), everything else streams to the layer's file.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <set>

#include "eval/haystack.hpp"
#include "eval/rng.hpp"
#include "masskv/error.hpp"
#include "masskv/learn/activations.hpp"
#include "masskv/learn/recall.hpp"
#include "masskv/select/page_bound.hpp"

namespace masskv::learn {
namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// One layer's state while a sequence runs.
struct LayerState {
  std::unique_ptr<ActivationWriter> writer;
  std::vector<float> k;                  // the model's keys so far [pos][n_head_kv][head_dim]
  std::vector<float> page_min, page_max;  // [page][n_head_kv][head_dim] over the keys so far
};

class Collector {
 public:
  Collector(const model::Model& m, const CollectConfig& cfg, const std::string& dir)
      : c_(m.config()), cfg_(cfg) {
    const int D = c_.head_dim;
    ActivationHeader h;
    h.input = cfg.input;
    h.groups = cfg.groups;
    h.q_width = cfg.input == Input::qk ? c_.n_head * D : c_.n_embd;
    h.k_width = cfg.input == Input::qk ? c_.n_head_kv * D : c_.n_embd;
    h.n_head_kv = c_.n_head_kv;
    h.page_size = cfg.page_size;
    h.budget_den = cfg.budget_den;
    h.n_layer = c_.n_layer;
    h.n_embd = c_.n_embd;
    h.n_head = c_.n_head;
    h.head_dim = D;
    for (const int l : cfg.layers) {
      h.layer = l;
      layers_[l].writer = std::make_unique<ActivationWriter>(activation_path(dir, l), h);
    }
  }

  void begin(std::int64_t length, std::vector<std::int64_t> queries) {
    queries_ = std::move(queries);
    const std::size_t kv_row = sz(c_.n_head_kv) * sz(c_.head_dim);
    const std::size_t pages = sz((length + cfg_.page_size - 1) / cfg_.page_size);
    for (auto& [l, s] : layers_) {
      s.writer->begin_sequence(length);
      s.k.clear();
      s.k.reserve(sz(length) * kv_row);
      s.page_min.assign(pages * kv_row, 0.0f);
      s.page_max.assign(pages * kv_row, 0.0f);
    }
  }

  void capture(const model::LayerCapture& cap) {
    auto it = layers_.find(cap.layer);
    if (it == layers_.end()) return;
    LayerState& s = it->second;
    s.k.insert(s.k.end(), cap.k.begin(), cap.k.end());
    s.writer->keys(cap.pos0, cap.n, cfg_.input == Input::qk ? cap.k : cap.x);
    const std::int64_t end = cap.pos0 + cap.n;
    const auto first = std::lower_bound(queries_.begin(), queries_.end(), cap.pos0);
    for (auto q = first; q != queries_.end() && *q < end; ++q) {
      const std::size_t i = sz(*q - cap.pos0);
      const std::size_t q_row = sz(c_.n_head) * sz(c_.head_dim);
      // The query's own (partial) page holds only the keys up to it.
      refresh_pages(s, *q / cfg_.page_size, *q + 1);
      query(s, *q, cap.q.subspan(i * q_row, q_row),
            cfg_.input == Input::qk ? cap.q.subspan(i * q_row, q_row)
                                    : cap.x.subspan(i * sz(c_.n_embd), sz(c_.n_embd)));
    }
    refresh_pages(s, cap.pos0 / cfg_.page_size, end);
  }

  void close() {
    for (auto& [l, s] : layers_) s.writer->close();
  }

 private:
  // Recomputes the min/max of pages first_page.. over the keys [page start, end).
  void refresh_pages(LayerState& s, std::int64_t first_page, std::int64_t end) {
    const int D = c_.head_dim, Hkv = c_.n_head_kv;
    const std::size_t kv_row = sz(Hkv) * sz(D);
    for (std::int64_t p = first_page; p * cfg_.page_size < end; ++p) {
      float* mn = &s.page_min[sz(p) * kv_row];
      float* mx = &s.page_max[sz(p) * kv_row];
      std::fill(mn, mn + kv_row, std::numeric_limits<float>::infinity());
      std::fill(mx, mx + kv_row, -std::numeric_limits<float>::infinity());
      const std::int64_t stop = std::min(end, (p + 1) * cfg_.page_size);
      for (std::int64_t t = p * cfg_.page_size; t < stop; ++t) {
        const float* k = &s.k[sz(t) * kv_row];
        for (std::size_t j = 0; j < kv_row; ++j) {
          mn[j] = std::min(mn[j], k[j]);
          mx[j] = std::max(mx[j], k[j]);
        }
      }
    }
  }

  // Targets and Quest masses of the query at `pos` (q: its model q heads; x: its x_q).
  void query(LayerState& s, std::int64_t pos, std::span<const float> q, std::span<const float> x) {
    const int D = c_.head_dim, Hq = c_.n_head, Hkv = c_.n_head_kv, hpg = Hq / Hkv;
    const std::size_t n = sz(pos + 1), kv_row = sz(Hkv) * sz(D);
    probs_.resize(sz(Hq) * n);
    // Each head's softmax in f64, one head per thread; the group means then sum heads in order.
#pragma omp parallel for schedule(static)
    for (int h = 0; h < Hq; ++h) {
      const float* qh = &q[sz(h) * sz(D)];
      const std::size_t off = sz(h / hpg) * sz(D);
      double* p = &probs_[sz(h) * n];
      double mx = -std::numeric_limits<double>::infinity();
      for (std::size_t t = 0; t < n; ++t) {
        const float* k = &s.k[t * kv_row + off];
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(qh[d]) * k[d];
        p[t] = dot * c_.attn_scale;
        mx = std::max(mx, p[t]);
      }
      double z = 0;
      for (std::size_t t = 0; t < n; ++t) z += (p[t] = std::exp(p[t] - mx));
      for (std::size_t t = 0; t < n; ++t) p[t] /= z;
    }
    group_mean_.assign(sz(Hkv) * n, 0.0f);
    target_.assign(sz(cfg_.groups) * n, 0.0f);
    std::vector<double> acc(n);
    for (int g = 0; g < Hkv; ++g) {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int h = g * hpg; h < (g + 1) * hpg; ++h) {
        for (std::size_t t = 0; t < n; ++t) acc[t] += probs_[sz(h) * n + t];
      }
      for (std::size_t t = 0; t < n; ++t) group_mean_[sz(g) * n + t] = static_cast<float>(acc[t] / hpg);
    }
    if (cfg_.groups == Hkv) {
      target_ = group_mean_;
    } else {
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int h = 0; h < Hq; ++h) {
        for (std::size_t t = 0; t < n; ++t) acc[t] += probs_[sz(h) * n + t];
      }
      for (std::size_t t = 0; t < n; ++t) target_[t] = static_cast<float>(acc[t] / Hq);
    }
    // Quest: the group's q heads against the page min/max, max over heads, top-k pages.
    const int pages = static_cast<int>((pos + cfg_.page_size) / cfg_.page_size);
    std::vector<std::int32_t> ids(sz(pages));
    for (int i = 0; i < pages; ++i) ids[sz(i)] = i;
    kv::SummariesView view;
    view.min = s.page_min.data();
    view.max = s.page_max.data();
    view.num_pages = pages;
    view.num_kv_heads = Hkv;
    view.head_dim = D;
    std::vector<float> bounds(sz(hpg) * sz(pages)), quest(sz(Hkv));
    for (int g = 0; g < Hkv; ++g) {
      select::page_upper_bounds(view, ids, g, &q[sz(g) * sz(hpg) * sz(D)], hpg, D, c_.attn_scale,
                                bounds);
      quest[sz(g)] = static_cast<float>(covered_mass(
          bounds, hpg, std::span<const float>(&group_mean_[sz(g) * n], n), cfg_.page_size,
          cfg_.budget_den));
    }
    s.writer->query(pos, x, quest, target_);
  }

  const model::ModelConfig& c_;
  CollectConfig cfg_;
  std::map<int, LayerState> layers_;
  std::vector<std::int64_t> queries_;
  std::vector<double> probs_;
  std::vector<float> group_mean_, target_;
};

}  // namespace

std::vector<std::int64_t> sample_query_positions(std::int64_t length, int count,
                                                 std::int64_t min_prefix, std::uint64_t seed) {
  require(count >= 1, ErrorCode::invalid_argument, "queries", "must be >= 1, got ", count);
  require(min_prefix >= 0, ErrorCode::invalid_argument, "min_prefix", "must be >= 0");
  std::set<std::int64_t> picked;
  if (length <= min_prefix) return {};
  if (length - min_prefix <= count) {
    for (std::int64_t t = min_prefix; t < length; ++t) picked.insert(t);
  } else {
    eval::Rng rng(seed);
    const double lo2 = static_cast<double>(min_prefix) * static_cast<double>(min_prefix);
    const double hi2 = static_cast<double>(length) * static_cast<double>(length);
    // Inverse CDF of the density ∝ t on [min_prefix, length); duplicates are drawn again.
    for (int tries = 0; static_cast<int>(picked.size()) < count && tries < 64 * count; ++tries) {
      const double t = std::sqrt(lo2 + rng.uniform() * (hi2 - lo2));
      picked.insert(std::clamp(static_cast<std::int64_t>(t), min_prefix, length - 1));
    }
  }
  return {picked.begin(), picked.end()};
}

std::vector<std::vector<model::TokenId>> text_sequences(const model::Tokenizer& tokenizer,
                                                        std::string_view text, int count,
                                                        std::int64_t tokens) {
  require(count >= 1, ErrorCode::invalid_argument, "sequences", "must be >= 1, got ", count);
  require(tokens >= 2, ErrorCode::invalid_argument, "tokens", "must be >= 2, got ", tokens);
  std::vector<std::vector<model::TokenId>> out;
  for (int i = 0; i < count; ++i) {
    const double start = static_cast<double>(i) / count;
    // A token is a few bytes of English; widen the window until it holds enough tokens.
    for (std::size_t chars = sz(tokens) * 4;; chars = chars * 3 / 2) {
      chars = std::min(chars, text.size());
      std::vector<model::TokenId> ids = tokenizer.encode(eval::text_window(text, start, chars),
                                                         tokenizer.add_bos_default(), false);
      if (static_cast<std::int64_t>(ids.size()) >= tokens) {
        ids.resize(sz(tokens));
        out.push_back(std::move(ids));
        break;
      }
      require(chars < text.size(), ErrorCode::invalid_argument, "text", "has ", ids.size(),
              " tokens, fewer than the ", tokens, " of a sequence");
    }
  }
  return out;
}

void collect_activations(const model::Model& model,
                         std::span<const std::vector<model::TokenId>> sequences,
                         const CollectConfig& cfg, const std::string& dir,
                         const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const model::ModelConfig& c = model.config();
  require(!cfg.layers.empty(), ErrorCode::invalid_argument, "layers", "no layer chosen");
  for (const int l : cfg.layers) {
    require(l >= 0 && l < c.n_layer, ErrorCode::invalid_argument, "layers", "layer ", l,
            " outside the model's ", c.n_layer);
  }
  require(cfg.groups == 1 || cfg.groups == c.n_head_kv, ErrorCode::invalid_argument, "groups",
          cfg.groups, " is neither 1 nor n_head_kv = ", c.n_head_kv);
  require(!sequences.empty(), ErrorCode::invalid_argument, "sequences", "none given");
  require(cfg.page_size >= 1 && cfg.budget_den >= 1, ErrorCode::invalid_argument, "page_size",
          "page size and budget denominator must be >= 1");
  std::int64_t total = 0, done = 0;
  for (const auto& s : sequences) total += static_cast<std::int64_t>(s.size());
  Collector collector(model, cfg, dir);
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    const auto length = static_cast<std::int64_t>(sequences[i].size());
    require(length >= 1, ErrorCode::invalid_argument, "sequences", "sequence ", i, " is empty");
    collector.begin(length, sample_query_positions(length, cfg.queries, cfg.min_prefix,
                                                   cfg.seed * 0x9E3779B97F4A7C15ull + i));
    model::SessionOptions so;
    so.max_tokens = length;
    so.capture = [&](const model::LayerCapture& cap) { collector.capture(cap); };
    model::Session session(model, so);
    session.prefill(sequences[i], {}, nullptr, [&](std::int64_t d, std::int64_t) {
      if (progress) progress(done + d, total);
    });
    done += length;
  }
  collector.close();
}

}  // namespace masskv::learn
