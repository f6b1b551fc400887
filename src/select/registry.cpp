// The table from Method to {scorer, rule} (docs/design.md §3, "Adding a scorer") and the scorers
// SelectorConfig::scorer can name. A new scorer is one file under src/select/scorers/ plus its
// line in kScorers (and its name in the extern list); a new method is its enum value
// (selector.hpp) plus its line in kMethods.
#include <mutex>
#include <span>
#include <vector>

#include "masskv/error.hpp"
#include "select/scorer.hpp"

namespace masskv::select::detail {

extern const Scorer scorer_page_bound, scorer_page_moments, scorer_exact, scorer_learned,
    scorer_quant_keys, scorer_recency, scorer_page_codes, scorer_token_keys, scorer_learned_codes;
extern const Rule rule_every, rule_top_k, rule_top_p, rule_growth, rule_reach, rule_two_stage;

namespace {

// The library's scorers (scorers/<name>.cpp).
const Scorer* const kScorers[] = {
    &scorer_page_bound,     // §2.3 bound, from the f32 summaries or the bf16 store
    &scorer_page_moments,   // §2.4 Gaussian page model
    &scorer_exact,          // §2.7 true masses (the oracle)
    &scorer_learned,        // §2.8 learned selector keys
    &scorer_quant_keys,     // §2.9 quantised selector keys
    &scorer_recency,        // most recent first
    &scorer_page_codes,     // 2-bit page codes (token ranks)
    &scorer_token_keys,     // exact q·k of listed tokens (two_stage's reference, rescoring)
    &scorer_learned_codes,  // learned selector keys, then the page codes (two passes)
};

struct MethodEntry {
  Method method;
  std::string_view name;
  const Scorer* scorer;  // null: reads nothing (dense)
  const Rule* rule;
  GroupRule group = GroupRule::union_heads;  // GroupRule::method_default's meaning
};

// The order of the names in parse_method's message.
const MethodEntry kMethods[] = {
    {Method::dense, "dense", nullptr, &rule_every},
    {Method::sink_recent, "sink_recent", &scorer_recency, &rule_top_k},
    {Method::quest, "quest", &scorer_page_bound, &rule_top_k},
    {Method::top_p, "top_p", &scorer_page_moments, &rule_top_p},  // quant_keys: see below
    {Method::entmax_support, "entmax_support", &scorer_page_bound, &rule_growth},
    {Method::gaussian_tau, "gaussian_tau", &scorer_page_moments, &rule_reach},
    {Method::oracle, "oracle", &scorer_exact, &rule_top_k},
    {Method::learned, "learned", &scorer_learned, &rule_top_k},
    {Method::two_stage, "two_stage", &scorer_page_codes, &rule_two_stage},
    {Method::token_codes, "token_codes", &scorer_page_codes, &rule_top_k, GroupRule::log_prob},
    {Method::learned_codes, "learned_codes", &scorer_learned_codes, &rule_top_k,
     GroupRule::log_prob},
};

const MethodEntry* entry_of(Method m) {
  for (const MethodEntry& e : kMethods) {
    if (e.method == m) return &e;
  }
  return nullptr;
}

// Scorers added at run time (register_scorer).
std::mutex registered_mutex;
std::vector<const Scorer*> registered;

const Scorer* find_in(std::span<const Scorer* const> list, std::string_view name) {
  for (const Scorer* s : list) {
    if (s->name == name) return s;
  }
  return nullptr;
}

const Scorer* find_scorer(std::string_view name) {
  if (const Scorer* s = find_in(kScorers, name)) return s;
  const std::lock_guard<std::mutex> lock(registered_mutex);
  return find_in(registered, name);
}

std::string capability_names(unsigned bits) {
  static constexpr std::pair<unsigned, std::string_view> kNames[] = {
      {kRank, "a ranking"},
      {kHeads, "a ranking per q head"},
      {kBound, "a logit bound"},
      {kMass, "a mass estimate"},
      {kMoments, "moments (tau_hat)"},
      {kListed, "ranks of listed items"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if (!(bits & bit)) continue;
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

}  // namespace

GroupRule method_group(Method m) {
  const MethodEntry* e = entry_of(m);
  return e != nullptr ? e->group : GroupRule::union_heads;
}

Selector selector_for(const SelectorConfig& c) {
  const MethodEntry* e = entry_of(c.method);
  require(e != nullptr, ErrorCode::invalid_argument, "method", "unknown method ",
          static_cast<int>(c.method));
  Selector s{e->scorer, e->rule};
  // MassSource::quant_keys: top_p's masses come from the selector keys (gaussian_tau takes it
  // as page_gaussian, selector.hpp).
  if (c.method == Method::top_p && c.mass_source == MassSource::quant_keys) {
    s.scorer = &scorer_quant_keys;
  }
  if (!c.scorer.empty()) {
    s.scorer = find_scorer(c.scorer);
    require(s.scorer != nullptr, ErrorCode::invalid_argument, "scorer", "no scorer named '",
            c.scorer, "'");
  }
  return s;
}

std::string_view method_name(Method m) {
  const MethodEntry* e = entry_of(m);
  return e ? e->name : "?";
}

bool method_of(std::string_view name, Method& m) {
  for (const MethodEntry& e : kMethods) {
    if (e.name == name) {
      m = e.method;
      return true;
    }
  }
  return false;
}

std::string method_names() {
  std::string out;
  for (const MethodEntry& e : kMethods) {
    if (!out.empty()) out += ", ";
    out += e.name;
  }
  return out;
}

void register_scorer(const Scorer& s) {
  require(!s.name.empty() && s.score != nullptr && (s.provides & kRank),
          ErrorCode::invalid_argument, "scorer",
          "a scorer needs a name, a score function and a ranking");
  const std::lock_guard<std::mutex> lock(registered_mutex);
  require(find_in(kScorers, s.name) == nullptr && find_in(registered, s.name) == nullptr,
          ErrorCode::invalid_argument, "scorer", "a scorer named '", s.name,
          "' is already registered");
  registered.push_back(&s);
}

void check_pair(const Selector& s, const SelectorConfig& c) {
  const unsigned have = s.scorer ? s.scorer->provides : 0;
  const std::string_view scorer = s.scorer ? s.scorer->name : "none";
  const unsigned missing = s.rule->needs(c) & ~have;
  require(missing == 0, ErrorCode::invalid_argument, c.scorer.empty() ? "method" : "scorer",
          method_name(c.method), "'s rule (", s.rule->name, ") needs ", capability_names(missing),
          ", which scorer '", scorer, "' does not provide");
  // An adaptive budget stops by the rule's own criterion or on an estimated mass (top_k stops at
  // p of it); with neither and no cap it would keep every item without a word.
  require(c.budget.kind != Budget::Kind::adaptive || c.budget.tokens > 0 || (have & kMass) ||
              s.rule->stops_itself || !s.rule->uses_budget,
          ErrorCode::invalid_argument, "budget", "an adaptive budget without a cap needs a mass "
          "estimate or a rule that stops by itself (not ",
          c.scorer.empty() ? method_name(c.method) : scorer, ")");
  // A top-p budget stops on an estimated mass, whatever the rule.
  require(c.budget.kind != Budget::Kind::top_p || (have & kMass), ErrorCode::invalid_argument,
          "budget", "a top-p budget needs a mass estimate (not ",
          c.scorer.empty() ? method_name(c.method) : scorer, ")");
}

}  // namespace masskv::select::detail

namespace masskv::select {

bool takes_top_p(Method m) {
  const detail::MethodEntry* e = detail::entry_of(m);
  return e != nullptr && e->scorer != nullptr && (e->scorer->provides & detail::kMass) &&
         (e->rule == &detail::rule_top_k || e->rule == &detail::rule_top_p);
}

GroupRule resolved_group(const SelectorConfig& c) {
  return c.group != GroupRule::method_default ? c.group : detail::method_group(c.method);
}

}  // namespace masskv::select
