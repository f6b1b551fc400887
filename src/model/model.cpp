// Session: the forward pass of model.hpp over a kv::PagedKVCache per layer. Which keys each
// layer attends, and what that costs, is sparse_attention.hpp's (docs/design.md §3, §4).
#include "masskv/model/model.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "layer_ops.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/model/quant.hpp"
#include "model/activations.hpp"
#include "model/sparse_attention.hpp"

namespace masskv::model {

namespace {

// Y[n][rows] = X[n][cols] W^T: matvec for one row (a single decode; activations as given,
// Q8 or f32), the f32 GEMM for more (a prefill block, a batched decode step). They sum in
// different orders: not bit-equal, both within 1e-5 * sum|w x| of the fp64 product for f32
// activations (Matmul.EachTokenAndMatvecMatchFp64).
void linear(const GgufTensor& w, const float* x, std::size_t n, float* y, Activations act) {
  const auto rows = static_cast<std::size_t>(w.rows());
  const auto cols = static_cast<std::size_t>(w.row_width());
  if (n == 1) {
    matvec(w.type, w.data, rows, cols, x, y, act);
  } else {
    matmul(w.type, w.data, rows, cols, x, n, y);
  }
}

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

void check_score_multipliers(std::span<const float> t, const ModelConfig& c) {
  if (t.empty()) return;
  require(t.size() == sz(c.n_layer) * sz(c.n_head), ErrorCode::shape_mismatch, "score_multipliers",
          "has ", t.size(), " values, n_layer × n_head = ", c.n_layer, " × ", c.n_head);
  for (std::size_t i = 0; i < t.size(); ++i) {
    require(std::isfinite(t[i]) && t[i] > 0, ErrorCode::invalid_argument, "score_multipliers",
            "entry ", i, " (layer ", i / sz(c.n_head), ", head ", i % sz(c.n_head), ") is ", t[i],
            ", not a finite positive multiplier");
  }
}

// Scales each q head of n rows by its layer's multiplier: t·q·k is the converted score, and
// every reader of q (selectors, certificates, kernels) then sees it without knowing of t.
void scale_queries(float* q, std::size_t n, std::size_t Hq, std::size_t D,
                   const float* multipliers) {
  for (std::size_t t = 0; t < n; ++t) {
    for (std::size_t h = 0; h < Hq; ++h) {
      float* qh = q + (t * Hq + h) * D;
      for (std::size_t i = 0; i < D; ++i) qh[i] *= multipliers[h];
    }
  }
}

// Activations and attention scratch of one forward pass, sized for its rows (a prefill block,
// or one row per session of a decode step).
struct Scratch {
  std::vector<float> x, xn, q, k, v, att, o, gate, up, logits_rows;
  std::vector<std::int64_t> positions;     // of every row
  ops::RopeTable rope_global, rope_local;  // cos/sin of those positions
  AttentionScratch attention;

  void reserve(const ModelConfig& c, std::size_t n) {
    const std::size_t E = sz(c.n_embd), Dq = sz(c.n_head) * sz(c.head_dim);
    const std::size_t Dkv = sz(c.n_head_kv) * sz(c.head_dim), F = sz(c.n_ff);
    x.resize(n * E);
    xn.resize(n * E);
    q.resize(n * Dq);
    att.resize(n * Dq);
    k.resize(n * Dkv);
    v.resize(n * Dkv);
    o.resize(n * E);
    gate.resize(n * F);
    up.resize(n * F);
  }
};

}  // namespace

struct Session::Impl {
  SessionOptions opt;
  std::int64_t window = 0;  // local layers' sliding window
  // One cache (page pool) per layer, shared with forked sessions; `seqs` are this session's.
  std::shared_ptr<std::vector<kv::PagedKVCache>> caches;
  std::vector<kv::SeqId> seqs;
  std::vector<double> inv_freq_global, inv_freq_local;
  // Per layer the sparse-attention policy (sparse_attention.hpp): its selections, their reuse,
  // the learned selector's entry and the prefill indexer's sums, for this session's sequence.
  std::vector<LayerAttention> attention;
  Scratch scratch;             // of the passes this session runs (or leads, in a batch)
  PrefillStats prefill_stats;  // of the last prefill call
};

Session::Session(const Model& model, SessionOptions options)
    : model_(&model), impl_(std::make_unique<Impl>()) {
  const ModelConfig& c = model.config();
  require(options.max_tokens > 0 && options.max_tokens < (std::int64_t{1} << 31),
          ErrorCode::invalid_argument, "max_tokens", "must be in [1, 2^31), got ",
          options.max_tokens);
  require(options.prefill_block > 0, ErrorCode::invalid_argument, "prefill_block",
          "must be > 0, got ", options.prefill_block);
  options.mapping.validate();
  options.sparse_prefill.validate();
  require(
      options.sparse_prefill.method == select::PrefillMethod::dense || !options.mapping.is_entmax(),
      ErrorCode::invalid_argument, "sparse_prefill",
      "sparse prefill selects by softmax mass: the session's mapping must be softmax");
  require(options.sparse_prefill.method != select::PrefillMethod::learned ||
              options.learned_selector != nullptr,
          ErrorCode::invalid_argument, "sparse_prefill",
          "the learned prefill indexer needs SessionOptions::learned_selector");
  if (options.learned_selector) learn::check_model(*options.learned_selector, c);
  // A two_stage selector here turns the page codes on (below).
  check_selector(options.selector, options.mapping, options.learned_selector, true);
  check_score_multipliers(options.score_multipliers, c);
  require(options.fork_pages >= 0, ErrorCode::invalid_argument, "fork_pages", "must be >= 0, got ",
          options.fork_pages);
  check_reselect(options.reselect_every, options.reselect_cos, options.selection_timing);
  // Checked before the page count below divides by it (page_size 0 was a SIGFPE).
  require(options.page_size >= 1 && options.page_size <= 256 &&
              (options.page_size & (options.page_size - 1)) == 0,
          ErrorCode::invalid_argument, "page_size", "must be a power of two in [1, 256], got ",
          options.page_size);
  kv::CacheConfig cc;
  cc.num_kv_heads = c.n_head_kv;
  cc.head_dim = c.head_dim;
  cc.page_size = options.page_size;
  cc.dtype = options.kv_dtype;
  if (options.selector && select::needs_page_codes(options.selector->method)) {
    options.page_codes = true;  // the selector the session starts with scores on them
  }
  cc.page_codes = options.page_codes;
  cc.capacity_pages =
      static_cast<int>((options.max_tokens + options.page_size - 1) / options.page_size) +
      options.fork_pages;
  cc.validate();
  require(options.sliding_window >= 0, ErrorCode::invalid_argument, "sliding_window",
          "must be >= 0, got ", options.sliding_window);
  impl_->window = options.sliding_window > 0 ? options.sliding_window : c.sliding_window;
  impl_->opt = std::move(options);
  impl_->caches = std::make_shared<std::vector<kv::PagedKVCache>>();
  impl_->attention.reserve(sz(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    kv::CacheConfig layer_cc = cc;
    impl_->attention.emplace_back(c, l, impl_->opt.learned_selector.get());
    if (const learn::LayerSelector* ls = impl_->attention.back().learned()) {
      layer_cc.key_row_groups = ls->groups;
      layer_cc.key_row_dim = ls->dim;
      layer_cc.key_row_format = impl_->opt.learned_key_format;
    }
    impl_->caches->emplace_back(layer_cc);
    impl_->seqs.push_back(impl_->caches->back().create());
  }
  impl_->inv_freq_global = ops::rope_inv_freq(c.rope_base, c.rope_dims, c.rope_freq_scale);
  impl_->inv_freq_local = ops::rope_inv_freq(c.rope_base_local, c.rope_dims, 1.0);
}

Session::~Session() { release(); }

void Session::release() noexcept {
  if (!impl_ || !impl_->caches) return;
  for (std::size_t l = 0; l < impl_->seqs.size(); ++l) (*impl_->caches)[l].free(impl_->seqs[l]);
  impl_->caches.reset();
}

Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&& other) noexcept {
  if (this != &other) {
    release();
    model_ = other.model_;
    impl_ = std::move(other.impl_);
    position_ = other.position_;
    stats_ = other.stats_;
  }
  return *this;
}

Session::Session(const Model& model, std::unique_ptr<Impl> impl, std::int64_t position)
    : model_(&model), impl_(std::move(impl)), position_(position) {}

Session Session::fork() const {
  auto child = std::make_unique<Impl>();
  child->opt = impl_->opt;
  child->window = impl_->window;
  child->caches = impl_->caches;
  child->inv_freq_global = impl_->inv_freq_global;
  child->inv_freq_local = impl_->inv_freq_local;
  // The same prefix, so the same selections (page ids are logical: valid in the fork) and
  // indexer sums; the learned entries point into opt.learned_selector, which forks share.
  child->attention = impl_->attention;
  for (std::size_t l = 0; l < impl_->seqs.size(); ++l) {
    child->seqs.push_back((*impl_->caches)[l].fork(impl_->seqs[l]));
  }
  return Session(*model_, std::move(child), position_);
}

void Session::set_selector(std::optional<select::SelectorConfig> selector) {
  check_selector(selector, impl_->opt.mapping, impl_->opt.learned_selector,
                 impl_->opt.page_codes);
  impl_->opt.selector = std::move(selector);
  for (LayerAttention& a : impl_->attention) a.forget_selection();
}

void Session::set_reselect(int every, double min_cos, SelectionTiming timing) {
  check_reselect(every, min_cos, timing);
  impl_->opt.reselect_every = every;
  impl_->opt.reselect_cos = min_cos;
  impl_->opt.selection_timing = timing;
  for (LayerAttention& a : impl_->attention) a.forget_selection();
}

double Session::kv_bytes_per_token() const {
  double b = 0;
  for (const auto& cache : *impl_->caches) b += cache.kv_bytes_per_token();
  return b;
}

double Session::summary_bytes_per_token() const {
  double b = 0;
  for (const auto& cache : *impl_->caches) b += cache.summary_bytes_per_token();
  return b;
}

double Session::learned_key_bytes_per_token() const {
  double b = 0;
  for (const auto& cache : *impl_->caches) b += cache.key_row_bytes_per_token();
  return b;
}

double Session::kv_bytes() const {
  return (kv_bytes_per_token() + summary_bytes_per_token() + learned_key_bytes_per_token()) *
         static_cast<double>(position_);
}

namespace {

// The rows of one forward pass that belong to one session: n consecutive tokens from pos0.
// A prefill block is one segment; a batched decode step has one segment (n = 1) per session.
struct Segment {
  Session::Impl* s;
  std::int64_t pos0;
  std::size_t n;
  DecodeStats* stats;  // the session's counters of this step (decode path)
};

// One forward pass: `tokens` are the rows, segment after segment.
struct Pass {
  std::span<const TokenId> tokens;
  std::span<const Segment> segments;
  bool decode_path;         // one token per segment through attn::decode (and the selector)
  std::size_t logits_from;  // rows [logits_from, n) get logits ...
  float* logits;            // ... here, [n - logits_from][n_vocab]; nullptr: no head
};

// Runs the pass's rows through every layer. The linear layers and the element-wise steps see
// all rows at once (matvec for one row, the GEMM for more); each segment then appends its
// k/v to its own session's caches and attends under that session's settings.
void forward(const Model& model, Scratch& w, const Pass& p) {
  const ModelConfig& c = model.config();
  const std::size_t n = p.tokens.size(), E = sz(c.n_embd), D = sz(c.head_dim);
  const std::size_t Hq = sz(c.n_head), Hkv = sz(c.n_head_kv), F = sz(c.n_ff);
  const auto ln = static_cast<std::int64_t>(n);
  // Prefill stays f32 even for a one-token block (or its last row's logits), like matmul; a
  // one-row decode takes its session's activations (a batched step runs the f32 GEMM).
  const Activations act =
      p.decode_path ? p.segments.front().s->opt.decode_activations : Activations::f32;
  w.reserve(c, n);
  const GgufTensor& emb = model.token_embd();
  const std::size_t emb_row = row_bytes(emb.type, E);
  for (std::size_t t = 0; t < n; ++t) {
    dequantize_row(emb.type, emb.data + sz(p.tokens[t]) * emb_row, &w.x[t * E], E);
    if (c.embd_scale != 1.0f) {
      for (std::size_t i = 0; i < E; ++i) w.x[t * E + i] *= c.embd_scale;
    }
  }
  w.positions.clear();
  for (const Segment& seg : p.segments) {
    for (std::size_t t = 0; t < seg.n; ++t)
      w.positions.push_back(seg.pos0 + static_cast<std::int64_t>(t));
  }
  // Every session of a pass runs the same model, hence the same frequencies.
  const Session::Impl& lead = *p.segments.front().s;
  w.rope_global.fill(lead.inv_freq_global, w.positions);
  if (std::find(c.is_local.begin(), c.is_local.end(), 1) != c.is_local.end()) {
    w.rope_local.fill(lead.inv_freq_local, w.positions);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model.layer(l);
    const bool local = c.is_local[sz(l)] != 0;
    const ops::RopeTable& rope = local ? w.rope_local : w.rope_global;
    const float* w_attn_norm = model.norm_weights(*L.attn_norm);
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::int64_t t = 0; t < ln; ++t) {
      ops::rms_norm(&w.x[sz(t) * E], w_attn_norm, c.rms_eps, E, &w.xn[sz(t) * E]);
    }
    linear(*L.wq, w.xn.data(), n, w.q.data(), act);
    linear(*L.wk, w.xn.data(), n, w.k.data(), act);
    linear(*L.wv, w.xn.data(), n, w.v.data(), act);
    const float* wqn = c.qk_norm ? model.norm_weights(*L.q_norm) : nullptr;
    const float* wkn = c.qk_norm ? model.norm_weights(*L.k_norm) : nullptr;
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::int64_t t = 0; t < ln; ++t) {
      for (std::size_t h = 0; h < Hq; ++h) {
        float* qh = &w.q[(sz(t) * Hq + h) * D];
        if (wqn != nullptr) ops::rms_norm(qh, wqn, c.rms_eps, D, qh);
        rope.apply(qh, sz(t), c.rope_neox);
      }
      for (std::size_t h = 0; h < Hkv; ++h) {
        float* kh = &w.k[(sz(t) * Hkv + h) * D];
        if (wkn != nullptr) ops::rms_norm(kh, wkn, c.rms_eps, D, kh);
        rope.apply(kh, sz(t), c.rope_neox);
      }
    }
    std::size_t row0 = 0;
    for (const Segment& seg : p.segments) {
      Session::Impl& s = *seg.s;
      if (!s.opt.score_multipliers.empty()) {
        scale_queries(w.q.data() + row0 * Hq * D, seg.n, Hq, D,
                      s.opt.score_multipliers.data() + sz(l) * Hq);
      }
      const std::span<const float> q(w.q.data() + row0 * Hq * D, seg.n * Hq * D);
      const std::span<const float> k(w.k.data() + row0 * Hkv * D, seg.n * Hkv * D);
      const std::span<const float> v(w.v.data() + row0 * Hkv * D, seg.n * Hkv * D);
      if (s.opt.capture) {
        const std::span<const float> x(w.xn.data() + row0 * E, seg.n * E);
        s.opt.capture({l, seg.pos0, static_cast<int>(seg.n), q, k, v, x});
      }
      const float* hidden = w.xn.data() + row0 * E;
      const auto positions = std::span<const std::int64_t>(w.positions).subspan(row0, seg.n);
      LayerAttention& attention = s.attention[sz(l)];
      kv::PagedKVCache& cache = (*s.caches)[sz(l)];
      // The selector key cache: this segment's projected keys, appended with its KV.
      cache.append(s.seqs[sz(l)], k, v, static_cast<int>(seg.n),
                   attention.key_rows(k, hidden, positions, w.attention));
      const AttentionCall call{
          c,
          s.opt,
          cache,
          s.seqs[sz(l)],
          s.window,
          seg.pos0,
          View3<float>::contiguous(w.q.data() + row0 * Hq * D, static_cast<int>(seg.n),
                                   c.n_head, c.head_dim),
          View3<float>::contiguous(w.att.data() + row0 * Hq * D, static_cast<int>(seg.n),
                                   c.n_head, c.head_dim),
          hidden,
          positions};
      // Timed per row so a batch can charge each session its own attention (DecodeStats).
      const auto t0 = std::chrono::steady_clock::now();
      if (p.decode_path) {
        attention.decode(call, w.attention, *seg.stats);
        seg.stats->attention_seconds += seconds_since(t0);
      } else {
        attention.prefill(call, w.attention, s.prefill_stats);
        s.prefill_stats.attention_seconds += seconds_since(t0);
      }
      row0 += seg.n;
    }
    linear(*L.wo, w.att.data(), n, w.o.data(), act);
    if (c.post_norms) {
      const float* wn = model.norm_weights(*L.post_attn_norm);
      for (std::size_t t = 0; t < n; ++t) ops::rms_norm(&w.o[t * E], wn, c.rms_eps, E, &w.o[t * E]);
    }
    for (std::size_t i = 0; i < n * E; ++i) w.x[i] += w.o[i];

    const float* w_ffn_norm = model.norm_weights(*L.ffn_norm);
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::int64_t t = 0; t < ln; ++t) {
      ops::rms_norm(&w.x[sz(t) * E], w_ffn_norm, c.rms_eps, E, &w.xn[sz(t) * E]);
    }
    linear(*L.ffn_gate, w.xn.data(), n, w.gate.data(), act);
    linear(*L.ffn_up, w.xn.data(), n, w.up.data(), act);
    ops::glu(c.gelu_ffn, w.gate.data(), w.up.data(), n * F);
    linear(*L.ffn_down, w.gate.data(), n, w.o.data(), act);
    if (c.post_norms) {
      const float* wn = model.norm_weights(*L.post_ffn_norm);
      for (std::size_t t = 0; t < n; ++t) ops::rms_norm(&w.o[t * E], wn, c.rms_eps, E, &w.o[t * E]);
    }
    for (std::size_t i = 0; i < n * E; ++i) w.x[i] += w.o[i];
  }
  if (p.logits == nullptr || p.logits_from >= n) return;
  const std::size_t m = n - p.logits_from;
  const float* w_out_norm = model.norm_weights(model.output_norm());
  for (std::size_t t = 0; t < m; ++t) {
    ops::rms_norm(&w.x[(p.logits_from + t) * E], w_out_norm, c.rms_eps, E, &w.xn[t * E]);
  }
  const std::size_t V = sz(c.n_vocab);
  linear(model.output(), w.xn.data(), m, p.logits, act);
  if (c.final_softcap > 0) {
    for (std::size_t i = 0; i < m * V; ++i) {
      p.logits[i] = c.final_softcap * std::tanh(p.logits[i] / c.final_softcap);
    }
  }
}

// Every layer's pool must hold the appends before any layer takes one: a failure half-way
// through the layers (or the batch) would leave sessions inconsistent. Sessions forked from
// one another share a pool, so their needs are counted together.
void check_pools(std::span<Session::Impl* const> sessions, std::int64_t n) {
  std::map<const std::vector<kv::PagedKVCache>*, std::vector<const Session::Impl*>> by_pool;
  for (const Session::Impl* s : sessions) by_pool[s->caches.get()].push_back(s);
  std::vector<kv::SeqId> seqs;
  for (const auto& [pool, members] : by_pool) {
    for (std::size_t l = 0; l < pool->size(); ++l) {
      const kv::PagedKVCache& cache = (*pool)[l];
      seqs.clear();
      for (const Session::Impl* s : members) seqs.push_back(s->seqs[l]);
      const std::int64_t need = cache.pages_needed(seqs, n);
      require(need <= cache.free_pages(), ErrorCode::out_of_memory, "fork_pages", "appending ", n,
              " tokens to ", members.size(), " session(s) of one pool needs ", need,
              " free pages per layer, ", cache.free_pages(),
              " are free (forks share the pool: raise SessionOptions::fork_pages)");
    }
  }
}

void check_tokens(std::span<const TokenId> tokens, int n_vocab) {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    require(tokens[i] >= 0 && tokens[i] < n_vocab, ErrorCode::out_of_range, "tokens", "id ",
            tokens[i], " at index ", i, " is outside the vocabulary [0, ", n_vocab, ")");
  }
}

}  // namespace

void Session::prefill(std::span<const TokenId> tokens, std::span<float> logits_last,
                      std::vector<float>* all_logits,
                      const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const ModelConfig& c = model_->config();
  const auto V = sz(c.n_vocab);
  check_tokens(tokens, c.n_vocab);
  require(position_ + static_cast<std::int64_t>(tokens.size()) <= impl_->opt.max_tokens,
          ErrorCode::out_of_range, "tokens", position_, " + ", tokens.size(),
          " tokens exceed the session's max_tokens ", impl_->opt.max_tokens);
  require(logits_last.empty() || logits_last.size() == V, ErrorCode::shape_mismatch, "logits_last",
          "has ", logits_last.size(), " values, the vocabulary ", V);
  Impl* self = impl_.get();
  check_pools(std::span<Impl* const>(&self, 1), static_cast<std::int64_t>(tokens.size()));
  if (all_logits != nullptr) all_logits->assign(tokens.size() * V, 0.0f);
  Scratch& w = impl_->scratch;
  const std::size_t B = sz(impl_->opt.prefill_block);
  DecodeStats unused;
  impl_->prefill_stats = {};
  const auto t_start = std::chrono::steady_clock::now();
  for (std::size_t start = 0; start < tokens.size(); start += B) {
    const std::size_t n = std::min(B, tokens.size() - start);
    const bool last = start + n == tokens.size();
    const Segment seg{self, position_, n, &unused};
    Pass pass{tokens.subspan(start, n), std::span<const Segment>(&seg, 1), false, n, nullptr};
    if (all_logits != nullptr) {
      pass.logits = all_logits->data() + start * V;
      pass.logits_from = 0;
    } else if (last && !logits_last.empty()) {
      w.logits_rows.resize(V);
      pass.logits = w.logits_rows.data();
      pass.logits_from = n - 1;
    }
    forward(*model_, w, pass);
    position_ += static_cast<std::int64_t>(n);
    if (last && !logits_last.empty()) {
      const float* src = all_logits != nullptr ? all_logits->data() + (tokens.size() - 1) * V
                                               : w.logits_rows.data();
      std::copy(src, src + V, logits_last.begin());
    }
    if (progress) {
      progress(static_cast<std::int64_t>(start + n), static_cast<std::int64_t>(tokens.size()));
    }
  }
  impl_->prefill_stats.seconds = seconds_since(t_start);
}

const PrefillStats& Session::last_prefill_stats() const noexcept { return impl_->prefill_stats; }

void Session::decode(TokenId token, std::span<float> logits) {
  Session* self = this;
  decode_batch(std::span<Session* const>(&self, 1), std::span<const TokenId>(&token, 1), logits);
}

void decode_batch(std::span<Session* const> sessions, std::span<const TokenId> tokens,
                  std::span<float> logits) {
  require(!sessions.empty(), ErrorCode::invalid_argument, "sessions", "the batch is empty");
  const std::size_t B = sessions.size();
  for (std::size_t i = 0; i < B; ++i) {
    require(sessions[i] != nullptr && sessions[i]->impl_ != nullptr, ErrorCode::invalid_argument,
            "sessions", "entry ", i, " is null or a moved-from session");
  }
  const Model& model = *sessions[0]->model_;
  const ModelConfig& c = model.config();
  std::vector<Session::Impl*> impls(B);
  for (std::size_t i = 0; i < B; ++i) {
    const Session& s = *sessions[i];
    require(s.model_ == &model, ErrorCode::invalid_argument, "sessions", "session ", i,
            " runs another model than session 0");
    require(s.position_ + 1 <= s.impl_->opt.max_tokens, ErrorCode::out_of_range, "tokens",
            "session ", i, " is full (max_tokens ", s.impl_->opt.max_tokens, ")");
    impls[i] = s.impl_.get();
  }
  std::vector<Session*> sorted(sessions.begin(), sessions.end());
  std::sort(sorted.begin(), sorted.end());
  require(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(),
          ErrorCode::invalid_argument, "sessions", "a session appears twice in the batch");
  require(tokens.size() == B, ErrorCode::shape_mismatch, "tokens", "has ", tokens.size(),
          " ids for ", B, " sessions");
  check_tokens(tokens, c.n_vocab);
  require(logits.size() == B * sz(c.n_vocab), ErrorCode::shape_mismatch, "logits", "has ",
          logits.size(), " values, sessions × the vocabulary = ", B * sz(c.n_vocab));
  check_pools(impls, 1);
  std::vector<Segment> segs(B);
  for (std::size_t i = 0; i < B; ++i) {
    Session& s = *sessions[i];
    s.stats_ = {};
    segs[i] = {impls[i], s.position_, 1, &s.stats_};
  }
  forward(model, impls[0]->scratch, {tokens, segs, true, 0, logits.data()});
  for (Session* s : sessions) s->position_ += 1;
}

}  // namespace masskv::model
