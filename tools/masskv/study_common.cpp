#include "study_common.hpp"

#include <cmath>

namespace masskv::cli {

using select::Budget;
using select::Method;

SelectorSpec parse_selector(const std::string& name, const std::string& option) {
  if (name == "top_p_q4") return {Method::top_p, select::MassSource::quant_keys, name};
  return {select::parse_method(name, option), select::MassSource::page_gaussian, name};
}

bool uses_quant_keys(const SelectorSpec& s) { return s.source == select::MassSource::quant_keys; }

bool entmax_only(const SelectorSpec& s) {
  return s.method == Method::entmax_support || s.method == Method::gaussian_tau;
}

select::SelectorConfig study_selector_config(const SelectorSpec& spec, Mapping map, double frac,
                                             std::int64_t context, const StudySelectorParams& p) {
  select::SelectorConfig sc;
  sc.method = spec.method;
  sc.mass_source = spec.source;
  sc.mapping = map;
  sc.sink_pages = p.sink_pages;
  sc.window_tokens = p.window;
  const auto tokens = static_cast<std::int64_t>(std::ceil(frac * static_cast<double>(context)));
  if (spec.method == Method::top_p || entmax_only(spec)) {
    sc.budget = {Budget::Kind::adaptive, tokens, p.top_p};
  } else {
    sc.budget = {Budget::Kind::fixed, tokens, 1.0};
  }
  return sc;
}

StepCache make_step_cache(int hkv, int head_dim, int page_size, std::int64_t L,
                          std::span<const std::span<const float>> keys,
                          std::span<const std::span<const float>> values, bool quant_keys) {
  kv::CacheConfig cfg;
  cfg.num_kv_heads = hkv;
  cfg.head_dim = head_dim;
  cfg.page_size = page_size;
  cfg.dtype = DType::f16;
  cfg.capacity_pages =
      static_cast<int>(keys.size() * static_cast<std::size_t>((L + page_size - 1) / page_size));
  cfg.int4_selector_keys = quant_keys;
  StepCache sc{kv::PagedKVCache(cfg), {}};
  for (std::size_t b = 0; b < keys.size(); ++b) {
    sc.seqs.push_back(sc.cache.create());
    sc.cache.append(sc.seqs.back(), keys[b], values[b], static_cast<int>(L));
  }
  return sc;
}

}  // namespace masskv::cli
