// What `masskv study` and `masskv reuse` share: the study's selector names, the budget rule of
// each selector (fixed budgets fill K, adaptive selectors use it as a cap) and a cache holding
// one sequence per decode step.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "masskv/kv/cache.hpp"
#include "masskv/mapping.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::cli {

// A selector of the study: a method, and for top_p its mass source ("top_p_q4": top_p with
// the page masses of scores on INT4 selector keys, docs/design.md §2.9).
struct SelectorSpec {
  select::Method method = select::Method::quest;
  select::MassSource source = select::MassSource::page_gaussian;
  std::string name;
};

// Throws Error(invalid_argument) naming `option` for an unknown name.
SelectorSpec parse_selector(const std::string& name, const std::string& option);
bool uses_quant_keys(const SelectorSpec& s);
// gaussian_tau and entmax_support serve entmax only.
bool entmax_only(const SelectorSpec& s);

struct StudySelectorParams {
  double top_p = 0.95;
  int sink_pages = 1, window = 32;
};

// `frac` of `context` tokens: the budget of the fixed-budget selectors, the cap of the
// adaptive ones (top_p, gaussian_tau, entmax_support stop under their own rule).
select::SelectorConfig study_selector_config(const SelectorSpec& spec, Mapping map, double frac,
                                             std::int64_t context, const StudySelectorParams& p);

// One f16 sequence per decode step, sequence b holding keys[b] / values[b] ([L][hkv][d]).
struct StepCache {
  kv::PagedKVCache cache;
  std::vector<kv::SeqId> seqs;
};
StepCache make_step_cache(int hkv, int head_dim, int page_size, std::int64_t L,
                          std::span<const std::span<const float>> keys,
                          std::span<const std::span<const float>> values, bool quant_keys);

}  // namespace masskv::cli
