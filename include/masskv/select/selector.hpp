// Training-free selectors (docs/design.md §2.2–§2.4, §2.7, §3, §4): one entry point that turns the
// queries of a decode step into a Selection, plus the selector's own estimate per q head.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "masskv/kv/key_rows.hpp"
#include "masskv/kv/paged_kv.hpp"
#include "masskv/mapping.hpp"
#include "masskv/select/page_bound.hpp"
#include "masskv/selection.hpp"
#include "masskv/tensor.hpp"

namespace masskv::select {

enum class Method {
  dense,           // every page
  sink_recent,     // sinks + the most recent pages up to the budget (StreamingLLM-style)
  quest,           // top pages by the §2.3 upper bound
  top_p,           // bound candidates pruned to estimated mass >= p (Twilight-style, §2.4)
  entmax_support,  // grown by bound until the §2.2 certificate holds (EntmaxKV)
  gaussian_tau,    // pages whose bound reaches the Gaussian-model tau_hat (EntmaxKV, §2.4)
  oracle,          // true attention mass (§2.7): a reference, it reads every key
  learned,         // pages by the mass of softmax(ŝ) of a learned selector (§2.8): the scores
                   // of SelectArgs::learned_q against the key rows SelectArgs::learned_keys
  two_stage,       // tokens: candidate pages by the §2.3 bound (candidate_factor × the budget's
                   // pages, per-head rankings merged), then the candidates' tokens ranked by
                   // q·k̂ on the 2-bit page codes (SelectArgs::page_codes, kv/page_codes.hpp)
  token_codes,     // tokens: every token ranked per q head by q·k̂ on the 2-bit page codes,
                   // the heads' rankings merged (two_stage without its page stage)
  learned_codes,   // tokens: token_codes' two passes with a learned selector's ŝ as the first
                   // (SelectArgs::learned_q · learned_keys, one ranking per selector group):
                   // its best learned_candidates × the cap tokens rescored on the page codes
};
std::string_view to_string(Method m);
// Whether the method scores on the cache's 2-bit page codes (which must then be kept from a
// sequence's first token: CacheConfig::page_codes, SessionOptions::page_codes).
constexpr bool needs_page_codes(Method m) {
  return m == Method::two_stage || m == Method::token_codes || m == Method::learned_codes;
}
// Whether the method scores on a learned selector's key cache (SelectArgs::learned_q,
// learned_keys; model sessions: SessionOptions::learned_selector, kept from the first token).
constexpr bool uses_learned_keys(Method m) {
  return m == Method::learned || m == Method::learned_codes;
}
// Whether every budget of the method needs a cap in tokens (a top-p budget as pMASS:CAP):
// learned_codes' learned first pass keeps learned_candidates × the cap (without one it would go
// unused).
constexpr bool needs_budget_cap(Method m) { return m == Method::learned_codes; }
// Parses the names above ("sink_recent", "top_p", ...). Throws Error naming `argument`.
Method parse_method(std::string_view name, std::string_view argument);
// Whether a top-p budget (Budget::Kind::top_p) stops the method's selection: its scorer gives
// a mass estimate and its rule fills by rank until that mass (top_p, quest, oracle, learned,
// token_codes, learned_codes).
bool takes_top_p(Method m);

// How many pages a selection may hold (docs/design.md §2.8's top-K ∧ top-p, for training-free
// selectors).
struct Budget {
  enum class Kind {
    fixed,     // exactly ceil(tokens / page_size) pages (kept pages count; never fewer)
    top_p,     // the smallest set whose *estimated* mass >= p, at most `tokens` (0: no cap),
               // at least `min_tokens`: §2.8's top-K ∧ top-p clamped to [K_min, K_max]
    adaptive,  // the selector's own stopping rule (certificate, tau_hat reach), capped likewise
  };
  Kind kind = Kind::fixed;
  std::int64_t tokens = 0;      // fixed: the budget; otherwise the cap (0 = none)
  double p = 0.9;               // top_p target mass in (0, 1]
  std::int64_t min_tokens = 0;  // top_p only: pages for at least this many tokens (K_min)
};

// GQA: one selection per kv group (docs/design.md §3). `union_heads` interleaves the q heads'
// own rankings (round robin, each head's next best page) so every head gets its best pages;
// `aggregate` ranks by one group score (max bound, mean estimated mass). Union for the page
// selectors, because the §2.2 certificate is per q head and a union of per-head supports is
// exact for each head, whereas an aggregate lets agreeing heads outvote the one head that
// disagrees. `log_prob` ranks by the max over the q heads of each head's log-probability of the
// item (its score minus the head's log-sum-exp over the group's items, select/log_prob.hpp):
// one ranking, no round robin, for logit-like scores — token_codes' rule (the selection lab,
// docs/results/lab-smollm2/group-rules/; the development split and the GPU's merge-free
// ranking, docs/eval.md). `method_default`: the method's own (resolved_group).
enum class GroupRule { method_default, union_heads, aggregate, log_prob };

// Source of a page's estimated mass for top_p (§2.4). `page_mean`: n_j e^{m_j} (biased low);
// `page_gaussian`: n_j E[e^X] = n_j exp(m_j + v_j/2) for softmax, the Gaussian-model
// entmax mass at tau_hat for entmax; `quant_keys`: the mapping (softmax or entmax) of scores
// computed on the selector keys (§2.9, kv/key_formats.hpp; any of its formats) of every
// token, summed per page (SelectArgs::selector_keys must be set). Only top_p reads quant_keys;
// gaussian_tau takes it as page_gaussian.
enum class MassSource { page_mean, page_gaussian, quant_keys };

enum class TwoStagePages { bound, mean, gauss };

struct SelectorConfig {
  Method method = Method::quest;
  Mapping mapping = Mapping::softmax();  // the attention the selection serves
  Budget budget;
  int sink_pages = 1;     // always kept (0 allowed)
  int window_tokens = 0;  // pages covering the last W tokens always kept; so is the last page
  GroupRule group = GroupRule::method_default;
  MassSource mass_source = MassSource::page_gaussian;
  // gaussian_tau: keep page j when (alpha-1) U_j > tau_hat - margin (z units).
  double tau_margin = 0.0;
  // entmax_support: pages selected by bound before the first certificate check.
  int seed_pages = 4;
  // oracle (§2.7): token or page granularity; mass per kv group or over all q heads.
  bool oracle_tokens = false;
  bool oracle_head_collapsed = false;
  // two_stage: candidate pages per kv group, as a multiple of the budget's pages (>= 1).
  // 8: on SmolLM2's needle prompts (the selection lab, docs/study.md) 8 candidates per budget
  // page miss a page holding >= 10% of a head's attention at 0.5% of (step, head), 4 at 1.4%.
  int candidate_factor = 8;
  // two_stage: keep whole pages, ranked per q head by their best token's code score, in place
  // of single tokens (the page granularity of the oracle and Quest, on two_stage's ranking).
  bool two_stage_pages = false;
  // two_stage's page stage: candidates by the §2.3 bound, by the page mean's score q·μ, or by
  // the Gaussian page model's log-mass q·μ + v/2 (§2.4; the summaries' mean and M2).
  TwoStagePages two_stage_pages_by = TwoStagePages::bound;
  // two_stage: 0 = off; r >= 1: the code rankings' best r × (cap - kept) tokens, merged, are
  // scored again on their stored keys (exact q·k) and those scores choose (a third stage).
  int rescore_factor = 0;
  // token_codes in two passes (docs/results/lab-smollm2/cascade/; the default, 3/8 of the
  // channels and 2 × the cap, chosen on the development split, docs/eval.md): 1 = one pass
  // over every channel. f in (0, 1): pass 1 scores every token on the kv group's
  // round(f · d) channels with the largest sum over its q heads of |q_c| (from the codes'
  // channel-major copy), the heads pooled by their log-probabilities; its best
  // code_candidates × the cap tokens (the kept ones among them) are scored again on every
  // channel — today's score, bit for bit — and only those are ranked.
  double code_channels = 0.375;
  int code_candidates = 2;
  // The first pass's channel weights: Σ_h |q_hc| times the standard deviation of channel c
  // over the sequence's keys (kv::PageCodesView::chan_spread; the default since 2026-12-06: a
  // channel whose keys barely vary moves no token's rank, whatever q is on it — on Gemma 3,
  // whose large-|q| channels are such, |q| alone left out heavy tokens in 6 % of the heads,
  // docs/results/lab-gemma3/), or false: Σ_h |q_hc| alone (SparQ's rule, the rule before).
  bool code_channel_spread = true;
  // learned_codes: the first pass (the learned selector's ŝ) keeps its best learned_candidates ×
  // the cap tokens (the kept ones among them) for the codes' second pass (>= 1). 4: the
  // selection lab's choice for a 32-dim projection (docs/results/lab-smollm2/indexers/).
  int learned_candidates = 4;
  // Model sessions: the first dense_layers layers decode densely and are counted in the
  // budget — the selecting layers' budget in tokens shrinks so that the layers together read
  // the budget's rows (select/read_cost.hpp budget_beside_dense_layers). 0: every layer selects.
  int dense_layers = 0;
  // A scorer, by name, in place of the method's own; the method keeps its rule (docs/design.md
  // §3, "Adding a scorer"). The library's: page_bound, page_moments, exact, learned,
  // quant_keys, recency, page_codes; others once registered. Empty: the method's own.
  std::string scorer;
};

// The GQA rule a config selects with: its `group`, or under GroupRule::method_default the
// method's own (log_prob for token_codes, union_heads for every other method).
GroupRule resolved_group(const SelectorConfig& c);

struct SelectArgs {
  View3<const float> q;   // [B][Hq][d], Hq a multiple of the cache's kv heads
  kv::PagedKVView cache;  // keys are read by entmax_support (selected pages) and oracle (all)
  kv::SummariesView summaries;
  // Optional: bounds from the outward-rounded bf16 store instead of the f32 min/max.
  const BoundStoreView* bounds_bf16 = nullptr;
  // The cache's page codes and their 8-bit ranges (PagedKVCache::page_codes()), for the
  // methods select::needs_page_codes names.
  kv::PageCodesView page_codes;
  // Selector keys of the cache's pool (PagedKVCache::selector_keys(), any format), for
  // MassSource::quant_keys.
  kv::SelectorKeysView selector_keys;
  float scale = 0;  // 0 means 1/sqrt(d)
  // Method::learned, learned_codes: the step's projected queries [B][groups][d_s] and the
  // pool's key rows (PagedKVCache::key_rows(), groups x d_s per token). groups == 1 is
  // head-collapsed (one list for every kv head); groups == the cache's kv heads: kv head h
  // uses group h.
  // ŝ_t = q_g · k_{g,t} as stored (the selector carries its own scale).
  View3<const float> learned_q;
  kv::KeyRowsView learned_keys;
};

// Per (b, q head) estimate, [B][Hq]: tau_hat (gaussian_tau), the exact tau(S) on the
// selection (entmax_support), or the estimated selected mass in [0, 1] (others; NaN when a
// selector has no estimate, e.g. sink_recent).
struct SelectOutput {
  SelectionStorage selection;
  std::vector<double> estimate;
  // entmax_support: 1 where the selector's own certificate held for every head of the group.
  std::vector<std::uint8_t> certified;  // [B][Hkv]
  // token_codes in two passes and learned_codes: the pages whose code ranges the second pass
  // read (those holding its candidates), [B][Hkv]; -1 for every other selector. What
  // read_cost counts.
  std::vector<std::int32_t> code_pages;
};

// Validates (throws masskv::Error naming the argument) and selects. Results do not depend on
// the thread count. Sinks, window pages and the last page are always in every list.
void run_selector(const SelectArgs& args, const SelectorConfig& config, SelectOutput& out);

// A selection made at an earlier decode step, brought up to `table`'s current lengths so that
// it can serve this step without selecting again (SessionOptions::reselect_every): each list
// keeps its items and gains the items `config` always keeps at the current length (sinks, the
// pages or tokens of the last window_tokens, the last page). The budget is not re-applied:
// a list grows by the pages appended since it was made. Throws Error naming `selection` when
// its shape differs from the table's or an item lies beyond the sequence.
void extend_kept(const SelectionView& selection, const kv::PageTable& table, int page_size,
                 const SelectorConfig& config, SelectionStorage& out);

// out = a ∪ b, list by list, each list ascending (as extend_kept writes them). Same unit,
// batch and kv heads, else Error(shape_mismatch, "selection").
void union_selections(const SelectionView& a, const SelectionView& b, SelectionStorage& out);

// Whether every q head of `q` ([heads][head_dim]) points within `min_cos` (cosine) of its row
// in `ref` (same shape): the query-change test of SessionOptions::reselect_cos. A zero row has
// no direction: it passes only against a zero row. min_cos <= -1 always passes.
bool queries_within_cos(std::span<const float> q, std::span<const float> ref, int head_dim,
                        double min_cos);

// f64 scores scale * q·k of the keys of logical pages (or tokens) `ids` of sequence b,
// kv head h, in list order; partial last page masked. One q vector of head_dim floats.
void exact_scores(const kv::PagedKVView& cache, int b, int kv_head, const float* q, float scale,
                  SelectionView::Unit unit, std::span<const std::int32_t> ids,
                  std::vector<double>& out);

// f64 scores scale * q·k̂ of every token of sequence b, kv head h, from the selector keys
// (computed on the codes, kv::dot_row; the scores MassSource::quant_keys maps), in token
// order. `table` is the cache's page table (the selector keys share its pages).
void selector_key_scores(const kv::SelectorKeysView& keys, const kv::PageTable& table, int b,
                         int kv_head, const float* q, float scale, std::vector<double>& out);

// Gaussian page model (§2.4): the expected entmax mass E[((alpha-1)X - tau)_+^{1/(alpha-1)}]
// of X ~ N(m, v); closed forms for alpha 2 and 1.5, Gauss–Hermite quadrature otherwise.
double gaussian_entmax_mass(double m, double v, double alpha, double tau);
// tau_hat solving sum_j n_j E_j(tau) = 1: Newton steps on (sum_j n_j E_j)^(alpha-1), kept in
// the §2.1 bracket of the means (bisection when a step leaves it), to 1e-10 of max(1, |tau|).
double gaussian_tau_hat(std::span<const double> m, std::span<const double> v,
                        std::span<const double> n, double alpha);

}  // namespace masskv::select
