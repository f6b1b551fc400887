// Session: the forward pass of model.hpp over a kv::PagedKVCache per layer.
#include "masskv/model/model.hpp"

#include <algorithm>
#include <cmath>

#include "layer_ops.hpp"
#include "masskv/attn/decode.hpp"
#include "masskv/attn/prefill.hpp"
#include "masskv/error.hpp"
#include "masskv/kv/cache.hpp"
#include "masskv/model/quant.hpp"
#include "masskv/select/diagnostics.hpp"
#include "model/activations.hpp"

namespace masskv::model {

namespace {

// Y[n][rows] = X[n][cols] W^T: matvec for one token (activations as given), matmul (f32) for
// a block.
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

void check_selector(const std::optional<select::SelectorConfig>& selector, const Mapping& mapping) {
  if (!selector) return;
  const Mapping& m = selector->mapping;
  require(m.kind == mapping.kind && (!m.is_entmax() || m.alpha == mapping.alpha),
          ErrorCode::invalid_argument, "selector",
          "the selector serves a different attention mapping than the session's");
}

}  // namespace

struct Session::Impl {
  SessionOptions opt;
  std::int64_t window = 0;  // local layers' sliding window
  // One cache (page pool) per layer, shared with forked sessions; `seqs` are this session's.
  std::shared_ptr<std::vector<kv::PagedKVCache>> caches;
  std::vector<kv::SeqId> seqs;
  std::vector<double> inv_freq_global, inv_freq_local;
  ops::RopeTable rope_global, rope_local;  // cos/sin of the current block's positions
  // Scratch, sized for one block of tokens.
  std::vector<float> x, xn, q, k, v, att, o, gate, up, logits_rows;
  select::SelectOutput sel_out;
  std::vector<select::HeadDiagnostics> diag;
  SelectionStorage window_sel;
  kv::PageTableStorage rows_table;

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

Session::Session(const Model& model, SessionOptions options)
    : model_(&model), impl_(std::make_unique<Impl>()) {
  const ModelConfig& c = model.config();
  require(options.max_tokens > 0 && options.max_tokens < (std::int64_t{1} << 31),
          ErrorCode::invalid_argument, "max_tokens", "must be in [1, 2^31), got ",
          options.max_tokens);
  require(options.prefill_block > 0, ErrorCode::invalid_argument, "prefill_block",
          "must be > 0, got ", options.prefill_block);
  options.mapping.validate();
  check_selector(options.selector, options.mapping);
  require(options.fork_pages >= 0, ErrorCode::invalid_argument, "fork_pages", "must be >= 0, got ",
          options.fork_pages);
  kv::CacheConfig cc;
  cc.num_kv_heads = c.n_head_kv;
  cc.head_dim = c.head_dim;
  cc.page_size = options.page_size;
  cc.dtype = options.kv_dtype;
  cc.capacity_pages =
      static_cast<int>((options.max_tokens + options.page_size - 1) / options.page_size) +
      options.fork_pages;
  cc.validate();
  require(options.sliding_window >= 0, ErrorCode::invalid_argument, "sliding_window",
          "must be >= 0, got ", options.sliding_window);
  impl_->window = options.sliding_window > 0 ? options.sliding_window : c.sliding_window;
  impl_->opt = std::move(options);
  impl_->caches = std::make_shared<std::vector<kv::PagedKVCache>>();
  for (int l = 0; l < c.n_layer; ++l) {
    impl_->caches->emplace_back(cc);
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
  for (std::size_t l = 0; l < impl_->seqs.size(); ++l) {
    child->seqs.push_back((*impl_->caches)[l].fork(impl_->seqs[l]));
  }
  return Session(*model_, std::move(child), position_);
}

void Session::set_selector(std::optional<select::SelectorConfig> selector) {
  check_selector(selector, impl_->opt.mapping);
  impl_->opt.selector = std::move(selector);
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

double Session::kv_bytes() const {
  return (kv_bytes_per_token() + summary_bytes_per_token()) * static_cast<double>(position_);
}

namespace {

// The state one block of tokens moves through; all pointers into Session::Impl scratch.
struct Block {
  std::size_t n;      // tokens
  std::int64_t pos0;  // position of the first
  bool decode_path;   // one token through attn::decode (and the selector)
};

}  // namespace

// Certified δ bounds of this layer's selection (no unselected key read) into `stats`.
static void add_diagnostics(Session::Impl& s, const View3<const float>& q,
                            const kv::PagedKVView& view, const kv::SummariesView& summaries,
                            const SelectionView& sv, const ModelConfig& c, DecodeStats& stats) {
  select::DiagnosticsArgs d;
  d.q = q;
  d.cache = view;
  d.summaries = summaries;
  d.mapping = s.opt.mapping;
  d.scale = c.attn_scale;
  d.selection = &sv;
  select::diagnose(d, s.diag);
  for (const select::HeadDiagnostics& h : s.diag) {
    stats.delta_bound_sum += h.delta_bound;
    stats.certified += h.certified ? 1 : 0;
    stats.heads += 1;
  }
}

// Attention of one layer for the block's queries (already in impl.q, k/v appended).
static void attend(const Model& model, Session::Impl& s, int layer, const Block& blk,
                   DecodeStats& stats) {
  const ModelConfig& c = model.config();
  kv::PagedKVCache& cache = (*s.caches)[sz(layer)];
  const kv::SeqId seq = s.seqs[sz(layer)];
  const int Hq = c.n_head, Hkv = c.n_head_kv, D = c.head_dim;
  const int n = static_cast<int>(blk.n);
  const std::int64_t len = blk.pos0 + n;  // tokens in the cache after this block
  const bool local = c.is_local[sz(layer)] != 0;
  const std::int64_t W = s.window;
  const View3<const float> qv = View3<float>::contiguous(s.q.data(), n, Hq, D);
  const View3<float> ov = View3<float>::contiguous(s.att.data(), n, Hq, D);
  const int ps = cache.config().page_size;

  if (local && len > W) {
    // Sliding window (token p sees p-W+1..p): every query is a decode over its own prefix
    // with a token selection of its window. The page table repeats the sequence's pages,
    // cut at the query's position, so causality is exact.
    const kv::PageTableStorage full = cache.page_table(std::span<const kv::SeqId>(&seq, 1));
    kv::PageTableStorage& rt = s.rows_table;
    rt.indptr.assign(1, 0);
    rt.indices.clear();
    rt.last_page_len.clear();
    s.window_sel.reset(SelectionView::Unit::token, n, Hkv, static_cast<int>(W));
    for (int t = 0; t < n; ++t) {
      const std::int64_t p = blk.pos0 + t;
      const std::int64_t pages = p / ps + 1;
      rt.indices.insert(rt.indices.end(), full.indices.begin(), full.indices.begin() + pages);
      rt.indptr.push_back(static_cast<std::int32_t>(rt.indices.size()));
      rt.last_page_len.push_back(static_cast<std::int32_t>(p % ps + 1));
      const std::int64_t first = std::max<std::int64_t>(0, p - W + 1);
      for (int h = 0; h < Hkv; ++h) {
        std::span<std::int32_t> slots = s.window_sel.slots(t, h);
        for (std::int64_t i = first; i <= p; ++i)
          slots[sz(i - first)] = static_cast<std::int32_t>(i);
        s.window_sel.count[sz(t) * sz(Hkv) + sz(h)] = static_cast<std::int32_t>(p - first + 1);
      }
    }
    const SelectionView sv = s.window_sel.view();
    attn::DecodeArgs a;
    a.q = qv;
    a.cache = cache.view(rt);
    a.scale = c.attn_scale;
    a.mapping = s.opt.mapping;
    a.selection = &sv;
    a.out = ov;
    attn::decode(a);
    if (blk.decode_path) {
      stats.kv_tokens_read += static_cast<double>(W) * Hkv;
      stats.kv_tokens_total += static_cast<double>(W) * Hkv;
    }
    return;
  }

  const kv::PageTableStorage table = cache.page_table(std::span<const kv::SeqId>(&seq, 1));
  const kv::PagedKVView view = cache.view(table);
  if (!blk.decode_path) {
    const std::int32_t indptr[2] = {0, n};
    attn::PrefillArgs a;
    a.q = qv;
    a.q_indptr = indptr;
    a.cache = view;
    a.scale = c.attn_scale;
    a.mapping = s.opt.mapping;
    a.out = ov;
    attn::prefill(a);
    return;
  }
  attn::DecodeArgs a;
  a.q = qv;
  a.cache = view;
  a.scale = c.attn_scale;
  a.mapping = s.opt.mapping;
  a.out = ov;
  stats.kv_tokens_total += static_cast<double>(len) * Hkv;
  SelectionView sv;
  if (s.opt.selector && !local) {
    select::SelectArgs sa;
    sa.q = qv;
    sa.cache = view;
    sa.summaries = cache.summaries();
    sa.scale = c.attn_scale;
    select::run_selector(sa, *s.opt.selector, s.sel_out);
    sv = s.sel_out.selection.view();
    a.selection = &sv;
    for (int h = 0; h < Hkv; ++h) {
      for (const std::int32_t id : sv.list(0, h)) {
        stats.kv_tokens_read +=
            sv.unit == SelectionView::Unit::token ? 1 : view.table.page_len(0, id, ps);
      }
    }
    if (s.opt.diagnostics) add_diagnostics(s, qv, view, cache.summaries(), sv, c, stats);
  } else {
    stats.kv_tokens_read += static_cast<double>(len) * Hkv;
  }
  attn::decode(a);
}

// Runs `tokens` (positions pos0..) through every layer; logits of the rows in
// [logits_from, n) go to `logits` ([n - logits_from][V]).
static void forward(const Model& model, Session::Impl& s, std::span<const TokenId> tokens,
                    const Block& blk, std::size_t logits_from, float* logits, DecodeStats& stats) {
  const ModelConfig& c = model.config();
  const std::size_t n = tokens.size(), E = sz(c.n_embd), D = sz(c.head_dim);
  const std::size_t Hq = sz(c.n_head), Hkv = sz(c.n_head_kv), F = sz(c.n_ff);
  const auto ln = static_cast<std::int64_t>(n);
  // Prefill stays f32 even for a one-token block (or its last row's logits), like matmul.
  const Activations act = blk.decode_path ? s.opt.decode_activations : Activations::f32;
  s.reserve(c, n);
  const GgufTensor& emb = model.token_embd();
  const std::size_t emb_row = row_bytes(emb.type, E);
  for (std::size_t t = 0; t < n; ++t) {
    dequantize_row(emb.type, emb.data + sz(tokens[t]) * emb_row, &s.x[t * E], E);
    if (c.embd_scale != 1.0f) {
      for (std::size_t i = 0; i < E; ++i) s.x[t * E + i] *= c.embd_scale;
    }
  }
  s.rope_global.fill(s.inv_freq_global, blk.pos0, n);
  if (std::find(c.is_local.begin(), c.is_local.end(), 1) != c.is_local.end()) {
    s.rope_local.fill(s.inv_freq_local, blk.pos0, n);
  }
  for (int l = 0; l < c.n_layer; ++l) {
    const LayerWeights& L = model.layer(l);
    const bool local = c.is_local[sz(l)] != 0;
    const ops::RopeTable& rope = local ? s.rope_local : s.rope_global;
    const float* w_attn_norm = model.norm_weights(*L.attn_norm);
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::int64_t t = 0; t < ln; ++t) {
      ops::rms_norm(&s.x[sz(t) * E], w_attn_norm, c.rms_eps, E, &s.xn[sz(t) * E]);
    }
    linear(*L.wq, s.xn.data(), n, s.q.data(), act);
    linear(*L.wk, s.xn.data(), n, s.k.data(), act);
    linear(*L.wv, s.xn.data(), n, s.v.data(), act);
    const float* wqn = c.qk_norm ? model.norm_weights(*L.q_norm) : nullptr;
    const float* wkn = c.qk_norm ? model.norm_weights(*L.k_norm) : nullptr;
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::int64_t t = 0; t < ln; ++t) {
      for (std::size_t h = 0; h < Hq; ++h) {
        float* qh = &s.q[(sz(t) * Hq + h) * D];
        if (wqn != nullptr) ops::rms_norm(qh, wqn, c.rms_eps, D, qh);
        rope.apply(qh, sz(t), c.rope_neox);
      }
      for (std::size_t h = 0; h < Hkv; ++h) {
        float* kh = &s.k[(sz(t) * Hkv + h) * D];
        if (wkn != nullptr) ops::rms_norm(kh, wkn, c.rms_eps, D, kh);
        rope.apply(kh, sz(t), c.rope_neox);
      }
    }
    if (s.opt.capture) {
      s.opt.capture({l,
                     blk.pos0,
                     static_cast<int>(n),
                     {s.q.data(), n * Hq * D},
                     {s.k.data(), n * Hkv * D},
                     {s.v.data(), n * Hkv * D}});
    }
    (*s.caches)[sz(l)].append(s.seqs[sz(l)], std::span<const float>(s.k.data(), n * Hkv * D),
                              std::span<const float>(s.v.data(), n * Hkv * D), static_cast<int>(n));
    attend(model, s, l, blk, stats);
    linear(*L.wo, s.att.data(), n, s.o.data(), act);
    if (c.post_norms) {
      const float* w = model.norm_weights(*L.post_attn_norm);
      for (std::size_t t = 0; t < n; ++t) ops::rms_norm(&s.o[t * E], w, c.rms_eps, E, &s.o[t * E]);
    }
    for (std::size_t i = 0; i < n * E; ++i) s.x[i] += s.o[i];

    const float* w_ffn_norm = model.norm_weights(*L.ffn_norm);
#pragma omp parallel for schedule(static) if (n > 1)
    for (std::int64_t t = 0; t < ln; ++t) {
      ops::rms_norm(&s.x[sz(t) * E], w_ffn_norm, c.rms_eps, E, &s.xn[sz(t) * E]);
    }
    linear(*L.ffn_gate, s.xn.data(), n, s.gate.data(), act);
    linear(*L.ffn_up, s.xn.data(), n, s.up.data(), act);
    ops::glu(c.gelu_ffn, s.gate.data(), s.up.data(), n * F);
    linear(*L.ffn_down, s.gate.data(), n, s.o.data(), act);
    if (c.post_norms) {
      const float* w = model.norm_weights(*L.post_ffn_norm);
      for (std::size_t t = 0; t < n; ++t) ops::rms_norm(&s.o[t * E], w, c.rms_eps, E, &s.o[t * E]);
    }
    for (std::size_t i = 0; i < n * E; ++i) s.x[i] += s.o[i];
  }
  if (logits == nullptr || logits_from >= n) return;
  const std::size_t m = n - logits_from;
  const float* w_out_norm = model.norm_weights(model.output_norm());
  for (std::size_t t = 0; t < m; ++t) {
    ops::rms_norm(&s.x[(logits_from + t) * E], w_out_norm, c.rms_eps, E, &s.xn[t * E]);
  }
  const std::size_t V = sz(c.n_vocab);
  linear(model.output(), s.xn.data(), m, logits, act);
  if (c.final_softcap > 0) {
    for (std::size_t i = 0; i < m * V; ++i) {
      logits[i] = c.final_softcap * std::tanh(logits[i] / c.final_softcap);
    }
  }
}

namespace {

// Every layer's pool must hold the append before any layer takes it: a failure half-way
// through the layers would leave the session inconsistent.
void check_pool(const Session::Impl& s, std::int64_t n) {
  for (std::size_t l = 0; l < s.seqs.size(); ++l) {
    const kv::PagedKVCache& cache = (*s.caches)[l];
    const std::int64_t need = cache.pages_needed(s.seqs[l], n);
    require(need <= cache.free_pages(), ErrorCode::out_of_memory, "fork_pages", "appending ", n,
            " tokens needs ", need, " free pages per layer, ", cache.free_pages(),
            " are free (forks share the pool: raise SessionOptions::fork_pages)");
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
  check_pool(*impl_, static_cast<std::int64_t>(tokens.size()));
  if (all_logits != nullptr) all_logits->assign(tokens.size() * V, 0.0f);
  const std::size_t B = sz(impl_->opt.prefill_block);
  DecodeStats unused;
  for (std::size_t start = 0; start < tokens.size(); start += B) {
    const std::size_t n = std::min(B, tokens.size() - start);
    const bool last = start + n == tokens.size();
    const Block blk{n, position_, false};
    float* out = nullptr;
    std::size_t from = n;
    if (all_logits != nullptr) {
      out = all_logits->data() + start * V;
      from = 0;
    } else if (last && !logits_last.empty()) {
      impl_->logits_rows.resize(V);
      out = impl_->logits_rows.data();
      from = n - 1;
    }
    forward(*model_, *impl_, tokens.subspan(start, n), blk, from, out, unused);
    position_ += static_cast<std::int64_t>(n);
    if (last && !logits_last.empty()) {
      const float* src = all_logits != nullptr ? all_logits->data() + (tokens.size() - 1) * V
                                               : impl_->logits_rows.data();
      std::copy(src, src + V, logits_last.begin());
    }
    if (progress) {
      progress(static_cast<std::int64_t>(start + n), static_cast<std::int64_t>(tokens.size()));
    }
  }
}

void Session::decode(TokenId token, std::span<float> logits) {
  const ModelConfig& c = model_->config();
  check_tokens(std::span<const TokenId>(&token, 1), c.n_vocab);
  require(position_ + 1 <= impl_->opt.max_tokens, ErrorCode::out_of_range, "tokens",
          "the session is full (max_tokens ", impl_->opt.max_tokens, ")");
  require(logits.size() == sz(c.n_vocab), ErrorCode::shape_mismatch, "logits", "has ",
          logits.size(), " values, the vocabulary ", c.n_vocab);
  check_pool(*impl_, 1);
  stats_ = {};
  const Block blk{1, position_, true};
  forward(*model_, *impl_, std::span<const TokenId>(&token, 1), blk, 0, logits.data(), stats_);
  position_ += 1;
}

}  // namespace masskv::model
