// A selector is a scorer × a budget rule × the GQA rule (docs/design.md §3, "Adding a scorer").
// A scorer turns the queries of a group into per-item values and declares which values it can
// give; a rule asks only for those it uses, and run_selector checks the pair once, before any
// work, throwing masskv::Error when the scorer lacks something the rule (or a top-p budget)
// needs. The table from Method to {scorer, rule} is registry.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "masskv/select/selector.hpp"
#include "select/group.hpp"

namespace masskv::select::detail {

// What a scorer provides (bits of Scorer::provides, Rule::needs).
enum Provides : unsigned {
  kRank = 1u << 0,     // a ranking score per item (every scorer)
  kHeads = 1u << 1,    // a row per q head; without it, one row for the whole kv group
  kBound = 1u << 2,    // the §2.3 page bounds U_ij are true upper bounds of the logits (the
                       // certificate, δ and the τ̂ reach need them): read with bound_row()
  kMass = 1u << 3,     // a normalised mass estimate per item (top-p stops on it)
  kMoments = 1u << 4,  // the §2.4 Gaussian page model's τ̂ per q head (the τ̂ reach)
  kListed = 1u << 5,   // ranks the items of a given list only (two-stage's token stage)
};

// The batch-wide page scans (select/page_scan.hpp) a scorer or rule reads.
enum Scans : unsigned {
  kBoundScan = 1u << 0,   // Context::bounds
  kKeyMaxScan = 1u << 1,  // Context::wmax too (implies the bound scan)
  kMomentScan = 1u << 2,  // Context::m, Context::v
};

// What a rule asks of the scorer for one group.
struct Want {
  bool rank = false;
  bool mass = false;
  bool moments = false;
  // Items to rank (kListed scorers only): rows are then [row][items.size()] in list order.
  // Empty: every item of the group.
  std::span<const std::int32_t> items = {};
  // The rule's cap on the group's items (0: not given), for scorers whose work depends on it
  // (page_codes' two passes). A rule that gives it takes rows over a subset of the items
  // (Scratch::listed, Ranked::items).
  int cap = 0;
};

// Channels of token_codes' first pass (SelectorConfig::code_channels): round(f · d), at least
// one.
inline int code_channel_count(const SelectorConfig& c, int d) {
  return std::clamp(static_cast<int>(std::lround(c.code_channels * d)), 1, d);
}
// Tokens the codes' second pass rescores (the kept ones among them), for a rule's cap of `cap`
// of n: `factor` × cap, the first pass's factor (token_codes' channel pass: code_candidates;
// learned_codes' learned pass: learned_candidates).
inline std::int64_t code_candidate_count(int factor, std::int64_t n, std::int64_t cap) {
  return std::min<std::int64_t>(n, static_cast<std::int64_t>(factor) * cap);
}

struct Scorer {
  std::string_view name;  // unique; SelectorConfig::scorer names it
  unsigned provides = 0;  // Provides bits
  unsigned scans = 0;     // Scans bits
  // The ranking is a mass (pooled by the mean under GroupRule::aggregate) or a bound (max).
  bool rank_is_mass = false;
  // Its mass estimate (kMass) is worked out only for a budget that stops on it (top-p,
  // adaptive): a softmax over every ranked item costs a pass the fixed budget does not need
  // (whose estimate is then NaN).
  bool mass_when_stopping = false;
  // Optional: whether the items are tokens for this config (default: pages).
  bool (*tokens)(const SelectorConfig&) = nullptr;
  // Optional: checks the scorer's own inputs (throws Error naming the argument).
  void (*check)(const SelectArgs&, const SelectorConfig&) = nullptr;
  // Optional: batch-wide work before the groups (into Context::prepared). May run threads.
  void (*prepare)(Context&) = nullptr;
  // Writes what `want` asks into S.rank / S.mass ([rows][items]) and S.tau ([g]); rows are
  // G.g with kHeads, else 1. Runs inside the parallel region: must not throw.
  void (*score)(const Context&, const Group&, Scratch&, const Want&) = nullptr;
};

// The group's slice of the work a rule does: count items are in S.in; at most cap, at least
// floor (top-p budgets).
struct Limits {
  int count = 0, cap = 0, floor = 0;
};

struct Rule {
  std::string_view name;
  bool entmax_only = false;  // serves entmax attention only
  bool uses_budget = true;   // false: the budget is not read (dense)
  bool stops_itself = false;  // an adaptive budget stops by the rule's own criterion
  // Provides bits it asks of the scorer for this config (a top-p budget's kMass is added by
  // the check).
  unsigned (*needs)(const SelectorConfig&) = nullptr;
  // Optional: scans it reads itself (e.g. candidates by the page bound).
  unsigned (*scans)(const SelectArgs&, const SelectorConfig&) = nullptr;
  // Optional: checks its own settings (throws Error naming the argument).
  void (*check)(const SelectArgs&, const SelectorConfig&) = nullptr;
  // Completes the group's selection in S.in; returns the count. Writes the per-head estimate
  // ([g]) and the certificate flag. Runs inside the parallel region: must not throw.
  int (*select)(const Context&, const Group&, Scratch&, const Limits&, double* estimate,
                std::uint8_t& certified) = nullptr;
};

struct Selector {
  const Scorer* scorer = nullptr;
  const Rule* rule = nullptr;
};

// Rows the scorer writes for group G.
inline int score_rows(const Context& X, const Group& G) {
  return X.scorer && (X.scorer->provides & kHeads) ? G.g : 1;
}
// Whether the rule pools the scorer's per-head rows into one voter (GroupRule::aggregate).
// oracle_head_collapsed pools too, whatever the method (as it always has: the reference in
// tests/selector_reference.hpp does the same). A scorer without kHeads has one row already.
inline bool pool_heads(const Context& X) {
  const bool per_head = X.scorer && (X.scorer->provides & kHeads);
  const GroupRule g = resolved_group(X.c);
  return per_head &&
         (g == GroupRule::aggregate || g == GroupRule::log_prob || X.c.oracle_head_collapsed);
}
// Whether that pooling is of the rows' log-probabilities (GroupRule::log_prob, Ranked::log_prob).
inline bool pool_log_prob(const Context& X) {
  return pool_heads(X) && resolved_group(X.c) == GroupRule::log_prob;
}
// Page bounds of q head i of G (kBound scorers, or a rule that scanned them).
inline const float* bound_row(const Context& X, const Group& G, int i) {
  return head_row(X.bounds, X, G, i);
}

// ---- the registry (registry.cpp) ----
// The method's {scorer, rule}, with SelectorConfig::scorer (when set) replacing the scorer.
// Throws Error naming "scorer" for an unknown name.
Selector selector_for(const SelectorConfig& c);
// The method's own GQA rule (registry.cpp; resolved_group in selector.hpp).
GroupRule method_group(Method m);
// The method table's names, in its order (to_string, parse_method).
std::string_view method_name(Method m);
bool method_of(std::string_view name, Method& m);
std::string method_names();  // "dense, sink_recent, ..."
// Adds a scorer that SelectorConfig::scorer can name (tests, experiments): the library's own
// are listed in registry.cpp. Throws Error naming "scorer" when the name is empty or taken.
// `s` must outlive every run that names it.
void register_scorer(const Scorer& s);
// Throws Error naming the argument when the pair cannot serve the config: what the rule (and a
// top-p budget) needs that the scorer does not provide.
void check_pair(const Selector& s, const SelectorConfig& c);

}  // namespace masskv::select::detail
