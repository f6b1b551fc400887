// LayerAttention (sparse_attention.hpp): one session's layer chooses the keys its queries
// attend and counts what they cost (docs/design.md §3, §4).
#include "model/sparse_attention.hpp"

#include <algorithm>

#include "masskv/attn/decode.hpp"
#include "masskv/attn/prefill.hpp"
#include "masskv/error.hpp"
#include "masskv/select/read_cost.hpp"

namespace masskv::model {

namespace {

std::size_t sz(std::int64_t v) { return static_cast<std::size_t>(v); }

// Certified δ bounds of this layer's selection (no unselected key read) into `stats` (§2.5).
void add_diagnostics(const AttentionCall& call, const kv::PagedKVView& view,
                     const SelectionView& sv, std::vector<select::HeadDiagnostics>& diag,
                     DecodeStats& stats) {
  select::DiagnosticsArgs d;
  d.q = call.q;
  d.cache = view;
  d.summaries = call.cache.summaries();
  d.mapping = call.options.mapping;
  d.scale = call.config.attn_scale;
  d.selection = &sv;
  select::diagnose(d, diag);
  for (const select::HeadDiagnostics& h : diag) {
    stats.delta_bound_sum += h.delta_bound;
    stats.certified += h.certified ? 1 : 0;
    stats.heads += 1;
  }
}

}  // namespace

void check_selector(const std::optional<select::SelectorConfig>& selector, const Mapping& mapping,
                    const std::shared_ptr<const learn::Selector>& learned, bool page_codes) {
  if (!selector) return;
  require(!select::needs_page_codes(selector->method) || page_codes,
          ErrorCode::invalid_argument, "selector", "Method::", select::to_string(selector->method),
          " needs SessionOptions::page_codes (the codes are kept from the first token)");
  require(selector->dense_layers >= 0, ErrorCode::invalid_argument, "dense_layers",
          "must be >= 0, got ", selector->dense_layers);
  const Mapping& m = selector->mapping;
  require(m.kind == mapping.kind && (!m.is_entmax() || m.alpha == mapping.alpha),
          ErrorCode::invalid_argument, "selector",
          "the selector serves a different attention mapping than the session's");
  require(!select::uses_learned_keys(selector->method) || learned != nullptr,
          ErrorCode::invalid_argument, "selector", "Method::", select::to_string(selector->method),
          " needs SessionOptions::learned_selector (its key cache is kept from the first token)");
}

void check_reselect(int every, double min_cos, SelectionTiming timing) {
  require(every >= 1, ErrorCode::invalid_argument, "reselect_every", "must be >= 1, got ", every);
  require(min_cos >= -1 && min_cos <= 1, ErrorCode::invalid_argument, "reselect_cos",
          "must be in [-1, 1], got ", min_cos);
  require(timing == SelectionTiming::fresh || every == 1, ErrorCode::invalid_argument,
          "selection_timing", to_string(timing),
          " attends the previous step's selection, which a reused one (reselect_every ", every,
          ") already is: choose one");
}

std::string_view to_string(SelectionTiming t) noexcept {
  switch (t) {
    case SelectionTiming::fresh: return "fresh";
    case SelectionTiming::previous: return "previous";
    case SelectionTiming::union_previous: return "union_previous";
  }
  return "?";
}

LayerAttention::LayerAttention(const ModelConfig& c, int layer, const learn::Selector* learned)
    : layer_(layer), local_(c.is_local[sz(layer)] != 0), selector_(learned) {
  const learn::LayerSelector* ls = learned != nullptr ? learned->find(layer) : nullptr;
  if (ls != nullptr && !local_) {
    learned_ = ls;
    if (ls->rope) learned_rope_ = learn::rope_inv_freq(c, layer, ls->dim);
  }
}

std::span<const float> LayerAttention::key_rows(std::span<const float> k, const float* hidden,
                                                std::span<const std::int64_t> positions,
                                                AttentionScratch& w) const {
  if (learned_ == nullptr) return {};
  const float* x = selector_->input == learn::Input::qk ? k.data() : hidden;
  w.sel_rows.resize(positions.size() * sz(learned_->groups) * sz(learned_->dim));
  learn::project(*selector_, *learned_, learn::Side::key, x, positions.size(), positions,
                 learned_rope_, w.sel_rows.data(), w.sel_scratch);
  return w.sel_rows;
}

std::span<const float> LayerAttention::project_queries(const AttentionCall& call,
                                                       AttentionScratch& w) const {
  const std::size_t n = call.positions.size();
  const float* x = selector_->input == learn::Input::qk ? call.q.data : call.hidden;
  w.sel_q.resize(n * sz(learned_->groups) * sz(learned_->dim));
  learn::project(*selector_, *learned_, learn::Side::query, x, n, call.positions, learned_rope_,
                 w.sel_q.data(), w.sel_scratch);
  return w.sel_q;
}

void LayerAttention::attend_window(const AttentionCall& call, AttentionScratch& w) const {
  // Token p sees p-W+1..p: every query is a decode over its own prefix with a token selection
  // of its window. The page table repeats the sequence's pages, cut at the query's position,
  // so causality is exact.
  const int n = call.q.n0, Hkv = call.config.n_head_kv;
  const int ps = call.cache.config().page_size;
  const std::int64_t W = call.window;
  const kv::PageTableStorage full = call.cache.page_table(std::span<const kv::SeqId>(&call.seq, 1));
  kv::PageTableStorage& rt = w.rows_table;
  rt.indptr.assign(1, 0);
  rt.indices.clear();
  rt.last_page_len.clear();
  w.window_sel.reset(SelectionView::Unit::token, n, Hkv, static_cast<int>(W));
  for (int t = 0; t < n; ++t) {
    const std::int64_t p = call.pos0 + t;
    const std::int64_t pages = p / ps + 1;
    rt.indices.insert(rt.indices.end(), full.indices.begin(), full.indices.begin() + pages);
    rt.indptr.push_back(static_cast<std::int32_t>(rt.indices.size()));
    rt.last_page_len.push_back(static_cast<std::int32_t>(p % ps + 1));
    const std::int64_t first = std::max<std::int64_t>(0, p - W + 1);
    for (int h = 0; h < Hkv; ++h) {
      std::span<std::int32_t> slots = w.window_sel.slots(t, h);
      for (std::int64_t i = first; i <= p; ++i) slots[sz(i - first)] = static_cast<std::int32_t>(i);
      w.window_sel.count[sz(t) * sz(Hkv) + sz(h)] = static_cast<std::int32_t>(p - first + 1);
    }
  }
  const SelectionView sv = w.window_sel.view();
  attn::DecodeArgs a;
  a.q = call.q;
  a.cache = call.cache.view(rt);
  a.scale = call.config.attn_scale;
  a.mapping = call.options.mapping;
  a.selection = &sv;
  a.out = call.out;
  attn::decode(a);
}

void LayerAttention::prefill(const AttentionCall& call, AttentionScratch& w,
                             PrefillStats& stats) {
  const int n = call.q.n0;
  if (local_ && call.pos0 + n > call.window) {
    attend_window(call, w);
    double keys = 0;
    for (int t = 0; t < n; ++t) keys += double(std::min(call.window, call.pos0 + t + 1));
    stats.keys_attended += keys;
    stats.keys_dense += keys;
    return;
  }
  const kv::PageTableStorage table =
      call.cache.page_table(std::span<const kv::SeqId>(&call.seq, 1));
  const kv::PagedKVView view = call.cache.view(table);
  // The learned prefill indexer scores the block's queries through the layer's selector; the
  // layers it does not list attend densely, like the local ones.
  const bool learned_prefill =
      call.options.sparse_prefill.method == select::PrefillMethod::learned;
  std::span<const float> q_sel;
  if (learned_prefill && learned_ != nullptr) q_sel = project_queries(call, w);
  sparse_prefill(call, w, view, local_ || (learned_prefill && learned_ == nullptr), q_sel, stats);
}

void LayerAttention::sparse_prefill(const AttentionCall& call, AttentionScratch& w,
                                    const kv::PagedKVView& view, bool dense,
                                    std::span<const float> q_sel, PrefillStats& st) {
  const auto t0 = std::chrono::steady_clock::now();
  const select::PrefillSelectConfig& sp = call.options.sparse_prefill;
  const View3<const float>& qv = call.q;
  const int n = qv.n0;
  const std::int64_t len = call.pos0 + n;  // the step's n queries are the last n tokens
  const std::int64_t first = len - n;
  const double dense_keys = double(n) * double(first) + double(n) * (n + 1) / 2.0;
  st.keys_dense += dense_keys;
  const std::int32_t indptr[2] = {0, n};
  attn::PrefillArgs a;
  a.q = qv;
  a.q_indptr = indptr;
  a.cache = view;
  a.scale = call.config.attn_scale;
  a.mapping = call.options.mapping;
  a.out = call.out;
  if (sp.method == select::PrefillMethod::dense || dense) {
    st.keys_attended += dense_keys;
    attn::prefill(a);
    return;
  }
  const select::PrefillSelectArgs sa{qv, view, call.config.attn_scale};
  const int Hq = qv.n1, Hkv = view.num_kv_heads;
  if (sp.method == select::PrefillMethod::index) {
    select::index_block_mask(sa, sp, w.pf_mask, &key_block_sums_);
  } else if (sp.method == select::PrefillMethod::learned) {
    select::learned_block_mask(q_sel, call.cache.key_rows(), view.table, n, sp, w.pf_mask);
  } else {
    select::prefill_probabilities(sa, w.pf_p);
    select::prefill_token_mass(w.pf_p, Hq, Hkv, n, len, sp.head_collapsed, w.pf_mass);
  }
  if (sp.method == select::PrefillMethod::shared) {
    select::shared_block_mask(w.pf_mass, n, len, sp, w.pf_mask);
  }
  if (sp.method == select::PrefillMethod::token || sp.method == select::PrefillMethod::block) {
    const int groups = sp.head_collapsed ? 1 : Hkv;
    select::per_query_support(w.pf_mass, groups, n, len, sp, w.pf_keep);
    st.select_seconds += seconds_since(t0);
    select::support_attention(sa, w.pf_p, w.pf_keep, groups, call.out);
    double kept = 0;
    for (const std::uint8_t k : w.pf_keep) kept += k;
    st.keys_attended += kept / groups;
    return;
  }
  st.select_seconds += seconds_since(t0);
  const attn::BlockMask mask = w.pf_mask.view();
  a.block_mask = &mask;
  attn::prefill(a);
  st.keys_attended += double(w.pf_mask.keys_attended(n, len));
}

void LayerAttention::decode(const AttentionCall& call, AttentionScratch& w, DecodeStats& stats) {
  const int Hkv = call.config.n_head_kv;
  const std::int64_t len = call.pos0 + call.q.n0;  // tokens in the cache, this row's included
  if (local_ && len > call.window) {
    attend_window(call, w);
    stats.kv_tokens_read += static_cast<double>(call.window) * Hkv;
    stats.kv_tokens_total += static_cast<double>(call.window) * Hkv;
    return;
  }
  const kv::PageTableStorage table =
      call.cache.page_table(std::span<const kv::SeqId>(&call.seq, 1));
  const kv::PagedKVView view = call.cache.view(table);
  const SessionOptions& opt = call.options;
  attn::DecodeArgs a;
  a.q = call.q;
  a.cache = view;
  a.scale = call.config.attn_scale;
  a.mapping = opt.mapping;
  a.out = call.out;
  stats.kv_tokens_total += static_cast<double>(len) * Hkv;
  SelectionView sv;
  // A learned selector runs on the layers it lists; the others decode densely.
  const bool learned = opt.selector && select::uses_learned_keys(opt.selector->method);
  // The first dense_layers layers decode densely (counted in the budget: choose()).
  const bool dense_layer = opt.selector && layer_ < opt.selector->dense_layers;
  if (opt.selector && !local_ && !dense_layer && (!learned || learned_ != nullptr)) {
    sv = choose(call, w, view, stats);
    a.selection = &sv;
    if (opt.on_selection) opt.on_selection(layer_, sv);
    const int ps = call.cache.config().page_size;
    for (int h = 0; h < Hkv; ++h) {
      for (const std::int32_t id : sv.list(0, h)) {
        stats.kv_tokens_read +=
            sv.unit == SelectionView::Unit::token ? 1 : view.table.page_len(0, id, ps);
      }
    }
    if (opt.diagnostics) add_diagnostics(call, view, sv, w.diag, stats);
  } else {
    stats.kv_tokens_read += static_cast<double>(len) * Hkv;
  }
  attn::decode(a);
}

SelectionView LayerAttention::choose(const AttentionCall& call, AttentionScratch& w,
                                     const kv::PagedKVView& view, DecodeStats& stats) {
  const SessionOptions& opt = call.options;
  const select::SelectorConfig& selector = *opt.selector;
  const int Hq = call.config.n_head, Hkv = call.config.n_head_kv, D = call.config.head_dim;
  const int ps = call.cache.config().page_size;
  const std::int64_t len = call.pos0 + call.q.n0;
  Reusable& r = reusable_;
  // Reused when one token was appended since the layer's last step (no prefill between), the
  // selection is fewer than reselect_every steps old and (reselect_cos) every q head still
  // points near the query it was made for.
  const std::span<const float> q_step(call.q.data, sz(Hq) * sz(D));
  const bool next_step = r.length > 0 && len == r.last_step + 1;
  const bool reuse = next_step && len - r.length < opt.reselect_every &&
                     select::queries_within_cos(q_step, r.q, D, opt.reselect_cos);
  r.last_step = len;
  stats.selector_layers += 1;
  stats.fresh_selections += reuse ? 0 : 1;
  if (reuse) {  // a reused selection reads nothing more (DecodeStats::selector_rows)
    select::extend_kept(r.selection.view(), view.table, ps, selector, w.reused);
    return w.reused.view();
  }
  select::SelectArgs sa;
  sa.q = call.q;
  sa.cache = view;
  sa.summaries = call.cache.summaries();
  sa.page_codes = call.cache.page_codes();
  sa.scale = call.config.attn_scale;
  if (select::uses_learned_keys(selector.method)) {
    project_queries(call, w);
    sa.learned_q = View3<float>::contiguous(w.sel_q.data(), 1, learned_->groups, learned_->dim);
    sa.learned_keys = call.cache.key_rows();
  }
  const select::SelectorConfig* used = &selector;
  if (selector.dense_layers > 0) {
    // The dense layers are counted in the budget: the selecting (non-local) layers share what
    // those leave of budget × their number.
    const ModelConfig& c = call.config;
    int layers = 0, dense = 0;
    for (int l = 0; l < c.n_layer; ++l) {
      if (c.is_local[sz(l)] != 0) continue;
      ++layers;
      dense += l < selector.dense_layers ? 1 : 0;
    }
    w.sel_config = selector;
    w.sel_config.budget.tokens =
        select::budget_beside_dense_layers(selector.budget.tokens, layers, dense, len);
    used = &w.sel_config;
  }
  select::run_selector(sa, *used, w.sel_out);
  const select::ReadShape shape{Hkv, D, ps, call.cache.key_row_bytes_per_token()};
  stats.selector_rows +=
      select::selector_read_bytes(*used, view.table, shape, w.sel_out.code_pages) /
      select::dense_row_bytes(D);
  if (opt.selection_timing != SelectionTiming::fresh) {
    // The step attends what the layer chose one step earlier (kept rule applied to today's
    // length), alone or joined with this step's choice; this step's is kept for the next.
    SelectionView attended = w.sel_out.selection.view();
    if (next_step) {  // r.selection was made at the step before
      select::extend_kept(r.selection.view(), view.table, ps, *used, w.reused);
      attended = w.reused.view();
      if (opt.selection_timing == SelectionTiming::union_previous) {
        select::union_selections(w.reused.view(), w.sel_out.selection.view(), w.joined);
        attended = w.joined.view();
      }
    }
    r.selection = w.sel_out.selection;
    r.length = len;
    return attended;
  }
  if (opt.reselect_every > 1) {
    r.selection = w.sel_out.selection;
    r.length = len;
    r.q.assign(q_step.begin(), q_step.end());
  }
  return w.sel_out.selection.view();
}

}  // namespace masskv::model
