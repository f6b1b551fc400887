// The sparse-attention policy of the forward pass (docs/design.md §3, §4): for one session's
// layer, which keys each query attends and what that cost. model.cpp computes q/k/v and calls
// one LayerAttention per (session, layer); the object owns the rest — the local layers' sliding
// window, the learned selector's projections (§2.8), sparse prefill (docs/prefill.md), the decode
// selector with its reuse across steps (SessionOptions::reselect_every / reselect_cos,
// select::extend_kept), the counters of DecodeStats and PrefillStats, and the δ diagnostics
// (§2.5). Kept apart so a new policy changes this room, not the forward pass.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "masskv/kv/cache.hpp"
#include "masskv/model/model.hpp"
#include "masskv/select/diagnostics.hpp"
#include "masskv/select/prefill_select.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::model {

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Throws Error(invalid_argument, "selector") unless `selector` (nullopt: dense) can run in a
// session of this mapping, learned selector and page codes.
void check_selector(const std::optional<select::SelectorConfig>& selector, const Mapping& mapping,
                    const std::shared_ptr<const learn::Selector>& learned, bool page_codes);
// Throws Error(invalid_argument, "reselect_every"/"reselect_cos") for out-of-range values, and
// Error(invalid_argument, "selection_timing") for a timing other than fresh with every > 1.
void check_reselect(int every, double min_cos, SelectionTiming timing);

// Buffers of the attention steps, shared by every layer and session of a pass (the pass's lead
// session owns them) so that nothing is allocated per step once they have grown.
struct AttentionScratch {
  std::vector<float> sel_rows, sel_q, sel_scratch;  // learned selector projections
  select::SelectOutput sel_out;
  select::SelectorConfig sel_config;  // the selector with its budget beside dense layers
  SelectionStorage reused;  // a layer's earlier selection, extended (reselect_every, timing)
  SelectionStorage joined;  // the previous and the fresh selection (union_previous)
  std::vector<select::HeadDiagnostics> diag;
  SelectionStorage window_sel;
  kv::PageTableStorage rows_table;
  // Sparse prefill: dense probabilities, masses, per-query supports, block mask.
  std::vector<float> pf_p;
  std::vector<double> pf_mass;
  std::vector<std::uint8_t> pf_keep;
  select::BlockMaskStorage pf_mask;
};

// One layer's attention for one session's rows of a pass: n consecutive tokens from pos0 (a
// prefill block, or one decode row), their k/v already appended to `cache`.
struct AttentionCall {
  const ModelConfig& config;
  const SessionOptions& options;
  kv::PagedKVCache& cache;
  kv::SeqId seq;
  std::int64_t window;                      // the local layers' sliding window
  std::int64_t pos0;                        // position of the first row
  View3<const float> q;                     // [n][n_head][head_dim], after RoPE and multipliers
  View3<float> out;                         // [n][n_head][head_dim]
  const float* hidden;                      // [n][n_embd]: the attention input (after its norm)
  std::span<const std::int64_t> positions;  // [n]
};

class LayerAttention {
 public:
  // `learned`: the session's learned selector (may be null); it must outlive this object.
  LayerAttention(const ModelConfig& config, int layer, const learn::Selector* learned);

  // The learned selector's entry for this layer; null when it does not list the layer or the
  // layer is local (gemma3's local layers keep their window).
  const learn::LayerSelector* learned() const noexcept { return learned_; }

  // The selector key rows of the call's n tokens (W_k x_k, §2.8), to append with their KV (the
  // selector key cache); empty without a learned entry. k: [n][n_head_kv][head_dim].
  std::span<const float> key_rows(std::span<const float> k, const float* hidden,
                                  std::span<const std::int64_t> positions,
                                  AttentionScratch& w) const;

  // Causal attention of a prefill block: windowed on local layers, dense or as
  // SessionOptions::sparse_prefill picks on the others. Counts keys and selection time.
  void prefill(const AttentionCall& call, AttentionScratch& w, PrefillStats& stats);
  // One decode row: windowed, dense, or over the selector's (fresh or reused) selection.
  void decode(const AttentionCall& call, AttentionScratch& w, DecodeStats& stats);

  // The next decode step selects afresh (a new selector or reuse setting).
  void forget_selection() noexcept { reusable_.length = 0; }

 private:
  // The last selection the selector made, the sequence length it was made at (0: none) and the
  // length at the layer's last decode step that ran the selector branch (made or reused one).
  struct Reusable {
    SelectionStorage selection;
    std::int64_t length = 0, last_step = 0;
    std::vector<float> q;  // [Hq][d]: the queries it was made for (reselect_cos)
  };

  // Every query over its own window of the last `window` tokens.
  void attend_window(const AttentionCall& call, AttentionScratch& w) const;
  // W_q x_q of the call's rows into w.sel_q ([n][groups][d_s]).
  std::span<const float> project_queries(const AttentionCall& call, AttentionScratch& w) const;
  void sparse_prefill(const AttentionCall& call, AttentionScratch& w, const kv::PagedKVView& view,
                      bool dense, std::span<const float> q_sel, PrefillStats& stats);
  // The selection a decode step attends over: reused and extended, or the selector's.
  SelectionView choose(const AttentionCall& call, AttentionScratch& w,
                       const kv::PagedKVView& view, DecodeStats& stats);

  int layer_;
  bool local_;
  const learn::Selector* selector_ = nullptr;  // the session's learned selector, if any
  const learn::LayerSelector* learned_ = nullptr;
  std::vector<double> learned_rope_;  // RoPE frequencies of a `rope` selector's projections
  select::KeyBlockSums key_block_sums_;  // the prefill indexer's running key-block sums
  Reusable reusable_;
};

}  // namespace masskv::model
