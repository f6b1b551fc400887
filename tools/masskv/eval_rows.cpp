// `masskv eval`'s report rows (eval_rows.hpp): the modifier table, the method spellings' parse
// and the rows of a run.
#include "eval_rows.hpp"

#include <fmt/core.h>

#include <charconv>
#include <cstdlib>
#include <tuple>

#include "masskv/error.hpp"
#include "parse.hpp"

namespace masskv::cli {
namespace {

const Modifier kModifiers[] = {
    {"tokens", "oracle", "the oracle's top tokens in place of its top pages",
     [](select::SelectorConfig& c) { c.oracle_tokens = true; }},
    {"pages", "two_stage", "whole pages ranked by their best token in place of single tokens",
     [](select::SelectorConfig& c) { c.two_stage_pages = true; }},
    {"keys", "two_stage", "the candidates' tokens on their stored keys, a reference for the codes",
     [](select::SelectorConfig& c) { c.scorer = "token_keys"; }},
    {"all", "two_stage", "every page a candidate, no page stage: a reference",
     [](select::SelectorConfig& c) { c.candidate_factor = 1 << 20; }},
    {"mean", "two_stage", "candidate pages by q·mu, the page mean, in place of the bound",
     [](select::SelectorConfig& c) { c.two_stage_pages_by = select::TwoStagePages::mean; }},
    {"gauss", "two_stage", "candidate pages by q·mu + v/2, the Gaussian page model",
     [](select::SelectorConfig& c) { c.two_stage_pages_by = select::TwoStagePages::gauss; }},
    {"rescore", "two_stage", "the codes' best 2 × the free budget rescored on their stored keys",
     [](select::SelectorConfig& c) { c.rescore_factor = 2; }},
    {"lse", "token_codes",
     "one ranking per kv group: the max over its q heads of each head's log-probability, no "
     "round robin (token_codes' default since 2026-12-06; rows keyed as before)",
     [](select::SelectorConfig& c) { c.group = select::GroupRule::log_prob; }},
    {"rr", "token_codes", "the q heads' round robin (each head in turn takes its best token): "
     "token_codes' rule before 2026-12-06",
     [](select::SelectorConfig& c) { c.group = select::GroupRule::union_heads; }},
    {"twopass", "token_codes",
     "two passes: every token on the 3/8 of the channels with the largest |q| × key spread (the codes' "
     "channel-major copy), its best 2 × the budget on every channel "
     "(docs/results/lab-smollm2/cascade/); token_codes' default since 2026-12-06",
     [](select::SelectorConfig& c) {
       c.code_channels = 0.375;
       c.code_candidates = 2;
     }},
    {"qonly", "token_codes",
     "two passes with the first pass's channels by the heads' |q| alone (SparQ's rule; "
     "token_codes' default 2026-12-06 until the keys' spread joined it the same day)",
     [](select::SelectorConfig& c) { c.code_channel_spread = false; }},
    {"onepass", "token_codes",
     "one pass: every token on every channel (token_codes before 2026-12-06: selector reads "
     "9.6 % of the dense bytes against two passes' 6.1 %)",
     [](select::SelectorConfig& c) { c.code_channels = 1; }},
    {"c2", "learned_codes", "the learned first pass keeps 2 × the budget for the codes (default 4)",
     [](select::SelectorConfig& c) { c.learned_candidates = 2; }},
    {"c8", "learned_codes", "the learned first pass keeps 8 × the budget for the codes (default 4)",
     [](select::SelectorConfig& c) { c.learned_candidates = 8; }},
    // Any selector (method ""): the first layers dense, counted in the budget.
    {"dense1", "", "the first layer decodes densely, its reads counted in the budget",
     [](select::SelectorConfig& c) { c.dense_layers = 1; }},
    {"dense2", "", "the first two layers decode densely, counted in the budget",
     [](select::SelectorConfig& c) { c.dense_layers = 2; }},
};

// "oracle+tokens (the oracle's top tokens ...), ...": --methods' help, from the table.
}  // namespace

std::string modifier_help() {
  std::string out;
  for (const Modifier& m : kModifiers) {
    out += fmt::format("{}{}+{} ({})", out.empty() ? "" : ", ", m.method.empty() ? "METHOD" : m.method,
                       m.name, m.help);
  }
  return out;
}

const Modifier& modifier_of(const std::string& spec, const std::string& base,
                            const std::string& mod, const char* option) {
  for (const Modifier& m : kModifiers) {
    if (m.name != mod) continue;
    require(m.method.empty() || m.method == base, ErrorCode::invalid_argument, option, "'",
            spec, "': +", mod, " applies to ", m.method, " only");
    require(!m.method.empty() || (base != "dense" && base != "dense_entmax" &&
                                  base.rfind("prefill_", 0) != 0),
            ErrorCode::invalid_argument, option, "'", spec, "': +", mod,
            " applies to decode selectors (not dense or sparse prefill rows)");
    return m;
  }
  std::string known;
  for (const Modifier& m : kModifiers)
    known += fmt::format(" {}+{}", m.method.empty() ? "METHOD" : m.method, m.name);
  fail(ErrorCode::invalid_argument, option, "'", spec, "': unknown modifier '+", mod,
       "' (known:", known, ")");
}

std::pair<std::string, std::vector<std::string>> split_modifiers(const std::string& spec,
                                                                 const char* option) {
  std::string base = spec;
  std::vector<std::string> mods;
  for (auto plus = base.rfind('+'); plus != std::string::npos; plus = base.rfind('+')) {
    mods.insert(mods.begin(), base.substr(plus + 1));
    base.resize(plus);
  }
  for (const std::string& mod : mods) (void)modifier_of(spec, base, mod, option);
  return {base, mods};
}

Reselect split_reselect(const std::string& m) {
  const auto at = m.find('@');
  Reselect r{m.substr(0, at), {}, 1, -1};
  std::tie(r.method, r.mods) = split_modifiers(r.method, "--methods");
  if (at == std::string::npos) return r;
  const std::string rest = m.substr(at + 1);
  if (rest == "prev" || rest == "union") {
    r.timing = rest == "prev" ? model::SelectionTiming::previous
                              : model::SelectionTiming::union_previous;
    return r;
  }
  r.every = 0;
  const char* const end = rest.data() + rest.size();
  const auto [p, ec] = std::from_chars(rest.data(), end, r.every);
  bool ok = ec == std::errc() && r.every >= 1;
  if (ok && p != end) {
    const std::string c(p + 1, end);
    char* stop = nullptr;
    r.min_cos = std::strtod(c.c_str(), &stop);
    ok = *p == 'c' && !c.empty() && stop == c.c_str() + c.size() && r.min_cos >= -1 &&
         r.min_cos <= 1;
  }
  require(ok, ErrorCode::invalid_argument, "--methods", "'", m,
          "': write METHOD@R or METHOD@RcCOS (R decode steps >= 1, COS in [-1, 1]), "
          "METHOD@prev or METHOD@union");
  return r;
}
std::string base_method(const std::string& m) { return split_reselect(m).method; }

bool is_dense(const std::string& m) { return m == "dense" || m == "dense_entmax"; }
bool is_prefill(const std::string& m) { return m.rfind("prefill_", 0) == 0; }
bool takes_top_p(const std::string& m, std::string_view budget) {
  if (is_dense(m) || is_prefill(m)) return false;
  try {
    const select::Method method = select::parse_method(m, "--methods");
    return select::takes_top_p(method) &&
           (!select::needs_budget_cap(method) || budget.find(':') != std::string_view::npos);
  } catch (const Error&) {
    return false;  // not a decode method: the caller's parse names it
  }
}
bool uses_learned_selector(const std::string& m) {
  if (is_dense(m) || is_prefill(m)) return false;
  try {
    return select::uses_learned_keys(select::parse_method(m, "--methods"));
  } catch (const Error&) {
    return false;  // not a decode method: the caller's parse names it
  }
}
bool needs_entmax(const std::string& m) {
  return m == "dense_entmax" || m == "entmax_support" || m == "gaussian_tau";
}

std::vector<MethodRow> method_rows(const std::vector<std::string>& methods,
                                   const std::vector<std::string>& budgets,
                                   const std::vector<eval::Protocol>& protocols) {
  std::vector<MethodRow> rows;
  for (const eval::Protocol protocol : protocols) {
  for (const std::string& m : methods) {
    const std::string base = split_reselect(m).method;
    require(m.find('@') == std::string::npos || (!is_dense(base) && !is_prefill(base)),
            ErrorCode::invalid_argument, "--methods", "'", m,
            "': @R, @prev and @union (a selection's timing) apply to decode selectors only");
    if (is_prefill(base)) {
      (void)parse_prefill_row(base, "--methods");
    } else if (!is_dense(base)) {
      (void)select::parse_method(base, "--methods");
    }
    if (is_dense(base)) {
      rows.push_back({m, "-", needs_entmax(base), protocol});
      continue;
    }
    for (const std::string& b : budgets) {
      if (is_top_p_budget(b) && !takes_top_p(base, b)) continue;  // no mass estimate / cap
      if (is_top_p_budget(b) && is_prefill(base)) continue;
      rows.push_back({m, b, needs_entmax(base), protocol});
    }
  }
  }
  return rows;
}


}  // namespace masskv::cli
