// CUDA two-stage token selection (select::Method::two_stage, src/select/rules/two_stage.cpp)
// with the same lists as the CPU selector given the same inputs: stage 1 ranks every page that
// holds no always-kept token by its §2.3 bound (the outward-rounded bf16 store, the CPU's
// bounds_bf16 path, bit for bit) per q head, and merges the q heads' rankings round robin (each
// head in turn takes its best page not yet taken) up to candidate_factor x ceil(cap /
// page_size) pages; stage 2 scores the candidate pages' tokens per q head on the page codes
// (kv/page_codes.hpp: 2-bit codes on 8-bit ranges, the integer score; the same doubles as
// kv::page_code_score), ranks them per head (ties to the lower token id) and merges those
// rankings the same way up to the cap; the kept tokens (sink pages, the window, the last page:
// select/kept.hpp) are always in. With candidate_factor 0 it is select::Method::token_codes: no
// page stage (the bound store is not read), and by default (group) its own GQA rule, the
// log-prob pooling: every token scored, the q heads' scores pooled per kv group by the max of
// score − the head's LSE (select/log_prob.hpp, the CPU's bits), one ranking per group: the
// CPU's token_codes lists. Output: a token Selection (ascending logical token ids, -1 padded)
// that cuda::decode serves. No host round trip: a step can be captured in a CUDA graph. Every
// pointer and span in the args is *device* memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "masskv/kv/paged_kv.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/select/selector.hpp"
#include "masskv/tensor.hpp"

struct CUstream_st;

namespace masskv::cuda {

// Device buffers of a two-stage step (per-head keys and ranked lists of both stages, the
// candidate pages, the error flag). Grows on demand at the first step of a shape; afterwards
// a step allocates nothing. One workspace per stream.
class TwoStageWorkspace {
 public:
  TwoStageWorkspace();
  ~TwoStageWorkspace();
  TwoStageWorkspace(const TwoStageWorkspace&) = delete;
  TwoStageWorkspace& operator=(const TwoStageWorkspace&) = delete;

  // Waits for `stream`, reads and clears the error flag; throws masskv::Error(out_of_range)
  // naming "indices" (a physical page outside the stores), "indptr" (decreasing, or more pages
  // than TwoStageLaunch::max_pages_per_seq), "last_page_len" (outside [1, page_size]) or
  // "max_per_head" (a selection longer than the output lists). The affected lists are empty.
  void check(CUstream_st* stream) const;

  // The candidate pages of the last step: [B][Hkv][candidate_stride()] ascending logical page
  // ids, counts [B][Hkv] (the check compares them with the CPU's stage 1).
  std::span<const std::int32_t> candidate_pages() const;
  std::span<const std::int32_t> candidate_counts() const;
  int candidate_stride() const;

  struct Impl;
  Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

struct TwoStageSelectArgs {
  View3<const float> q;  // device [B][Hq][d], unit stride on d; Hq a multiple of Hkv, Hq/Hkv <= 8
  kv::PageTable table;   // device spans: indptr [B+1], indices, last_page_len [B]
  int page_size = 16;    // a power of two in [1, 256]
  // Stage 1: the device bf16 bound store (select::BoundStore's arrays, [page][kv_head][d]);
  // wmax is not read (W is recomputed from the same bf16 values, exact).
  select::BoundStoreView bounds;
  // Stage 2: the device page codes and their ranges (kv::PagedKVCache::page_codes()'s arrays
  // copied: codes [page][kv_head][slot][head_dim / 4] bytes, range_min / range_max
  // [page][kv_head][head_dim], grid [page][kv_head][2]). Same pool geometry as the bound store.
  // Two passes (code_channels < 1) read the channel-major copy too: chan_codes
  // [kv_head][head_dim][page][(page_size + 3) / 4] (4-byte aligned), chan_ranges
  // [kv_head][head_dim][page][2] (2-byte aligned), num_pages pages, as the cache's.
  kv::PageCodesView codes;
  float scale = 0;  // 0 means 1/sqrt(d), as the CPU selector
  // select::SelectorConfig's: a fixed budget in tokens (> 0), sinks, window, candidate factor.
  std::int64_t budget_tokens = 0;
  int sink_pages = 1;
  int window_tokens = 0;
  int candidate_factor = 4;  // 0: every page (token_codes)
  // The GQA rule, as select::SelectorConfig::group: method_default is the CPU method's own —
  // log_prob for token_codes (candidate_factor 0: one ranking per kv group, each token's max
  // over the group's q heads of its score − the head's LSE over every token, select/
  // log_prob.hpp, the CPU's bits), the heads' round robin (union_heads) for two_stage. log_prob
  // serves factor 0 only; aggregate is not served.
  select::GroupRule group = select::GroupRule::method_default;
  // token_codes (candidate_factor 0) in two passes, as select::SelectorConfig's (the same
  // defaults: 3/8 of the channels, 2 × the cap): 1 = one pass over every channel. f in (0, 1):
  // pass 1 scores every token on
  // the kv group's round(f · d) channels of largest Σ over its q heads of |q_c| (ties to the
  // lower channel), read from the codes' channel-major copy (codes.chan_codes / chan_ranges,
  // required then), the heads pooled by their log-probabilities; its best code_candidates ×
  // the cap tokens with the kept ones are scored on every channel (the one-pass scores, bit for
  // bit) and only those are ranked, by the group rule (log_prob: each head's LSE over the
  // candidates; union_heads: the round robin): the CPU's lists. With a page stage (factor >= 1)
  // they are not read (the CPU's two_stage ranks its listed candidates in one pass).
  double code_channels = 0.375;
  int code_candidates = 2;
  // The first pass's channel weights, as select::SelectorConfig::code_channel_spread: Σ_h
  // |q_hc| times the channel's spread row of the sequence's last page (codes.chan_spread,
  // [page][kv_head][head_dim] f32, required then), or false: Σ_h |q_hc| alone.
  bool code_channel_spread = true;
  // Output, device: ids [B][Hkv][max_per_head] (ascending logical token ids, -1 padded) and
  // count [B][Hkv]; size max_per_head with two_stage_capacity.
  int max_per_head = 0;
  std::span<std::int32_t> ids;
  std::span<std::int32_t> count;
};

struct TwoStageLaunch {
  CUstream_st* stream = nullptr;
  TwoStageWorkspace* workspace = nullptr;  // required
  // Host bound on pages per sequence: sizes the key buffers and grids without reading the
  // device page table. A longer sequence sets the error flag ("indptr").
  int max_pages_per_seq = 0;
  // true: wait and check the error flag (throws). false: call workspace->check later.
  bool check_errors = true;
};

// Validates the host-side shape of the arguments (throws masskv::Error naming the argument:
// "workspace", "q", "head_dim", "bounds", "codes", "indptr", "last_page_len",
// "page_size", "budget_tokens", "sink_pages", "window_tokens", "candidate_factor", "group",
// "code_channels", "code_candidates", "max_pages_per_seq", "max_per_head", "ids", "count",
// "scale") and selects. Two passes serve the log_prob and union_heads rules. Served: head_dim
// 64, 128; q heads per kv head <= 8; lists of at most 8192 tokens; at most 8192 candidate pages
// (candidate_factor x ceil(cap / page_size)) with a factor, and with factor 0 sequences of
// up to 1,835,008 tokens (the token merge's 224 KB bitmap).
void two_stage_select(const TwoStageSelectArgs& args, const TwoStageLaunch& launch);

// An upper bound, computable on the host, of the tokens a two-stage list holds for sequences
// of at most max_pages_per_seq pages: min(max_pages * page_size, max(budget, kept)), kept <=
// the sink pages' tokens + max(window_tokens, page_size).
int two_stage_capacity(int max_pages_per_seq, int page_size, std::int64_t budget_tokens,
                       int sink_pages, int window_tokens);

}  // namespace masskv::cuda
