// `masskv eval`'s report rows (eval.cpp): a method spelling ("quest@8", "token_codes+rr",
// "prefill_index64") at a budget under a protocol; the +MOD modifiers and @R reuse it carries.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "masskv/eval/runner.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::cli {

// A row of the report: a decode method at a budget. Dense rows have budget "-".
struct MethodRow {
  std::string method, budget;
  bool entmax = false;  // entmax attention: converted with --entmax-conversion, else plain
  eval::Protocol protocol = eval::Protocol::strict;
};

// "quest@8": quest with each layer's selection reused for 8 decode steps
// (SessionOptions::reselect_every); "quest@8c0.9" also selects again when a q head's query
// turns further than cos 0.9 from the selection's (reselect_cos). "quest@prev" attends the
// selection made at the step before, "quest@union" that and this step's together
// (SessionOptions::selection_timing). Before the '@', "+MOD" modifiers set a selector option
// (kModifiers): "oracle+tokens", "two_stage+pages".
struct Reselect {
  std::string method;             // the base method, without modifiers
  std::vector<std::string> mods;  // its modifiers, in the order written
  int every = 1;
  double min_cos = -1;
  model::SelectionTiming timing = model::SelectionTiming::fresh;
};

struct Modifier {
  std::string_view name, method, help;
  void (*apply)(select::SelectorConfig&);
};
// The --methods help text of the modifiers (from the table in eval_rows.cpp).
std::string modifier_help();
// The modifier `mod` of method spelling `spec` (base method `base`); throws Error naming
// `option` (--methods, or run/perplexity/bench's --selector) if unknown or not for `base`.
const Modifier& modifier_of(const std::string& spec, const std::string& base,
                            const std::string& mod, const char* option = "--methods");
// "token_codes+twopass+dense1" into its base method and its modifiers in the order written
// (checked against the table; throws Error naming `option`).
std::pair<std::string, std::vector<std::string>> split_modifiers(const std::string& spec,
                                                                 const char* option);
// "quest+mod@8c0.9" into its base, modifiers and reuse; throws Error naming --methods.
Reselect split_reselect(const std::string& m);
std::string base_method(const std::string& m);
bool is_dense(const std::string& m);
// Sparse prefill rows (docs/prefill.md): the context prefilled sparsely, decode dense.
bool is_prefill(const std::string& m);
// Methods a top-p budget ("p0.9") applies to: those with a page mass estimate.
// Whether the eval gives method m a row at top-p budget `budget` (pMASS[:CAP]): its scorer has
// a mass estimate, and the budget a cap where the method needs one (select::needs_budget_cap).
bool takes_top_p(const std::string& m, std::string_view budget);
// Decode methods that score on a learned selector's key cache (--selector-file):
// select::uses_learned_keys of the method the base names.
bool uses_learned_selector(const std::string& m);
bool needs_entmax(const std::string& m);
// Every (protocol, method, budget) row of a run, checked; throws Error naming --methods.
std::vector<MethodRow> method_rows(const std::vector<std::string>& methods,
                                   const std::vector<std::string>& budgets,
                                   const std::vector<eval::Protocol>& protocols);

}  // namespace masskv::cli
