// Parsing of CLI values shared by subcommands; errors name the option.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "masskv/mapping.hpp"
#include "masskv/select/prefill_select.hpp"
#include "masskv/select/selector.hpp"

namespace masskv::cli {

// "4096", "32K" (x1024), "1M" (x1048576) -> count > 0.
std::int64_t parse_count(std::string_view text, std::string_view option);
// "1/32", "0.125" -> fraction in (0, 1].
double parse_fraction(std::string_view text, std::string_view option);
// "softmax" or "entmax<alpha>" ("entmax1.5", "entmax2") -> a validated mapping.
Mapping parse_mapping(const std::string& text, std::string_view option);
// A selector budget: "1/16" or "0.0625" (a fraction of `context` tokens) or "256", "2K"
// (tokens) -> Budget::fixed; "p0.9" -> Budget::top_p with p = 0.9 and no cap, "p0.9:1/8" or
// "p0.9:512" -> with that cap (§2.8's top-K ∧ top-p).
select::Budget parse_budget(std::string_view text, std::int64_t context, std::string_view option);
bool is_top_p_budget(std::string_view text);
// A sparse prefill budget: "1/16" or "0.0625" (that fraction of the keys before each query
// block), "2048" or "2K" (tokens).
select::PrefillBudget parse_prefill_budget(std::string_view text, std::string_view option);
// The eval's sparse prefill rows: "prefill_token" (token oracle; 64-token sinks), or
// "prefill_<block|shared|index><16|64|128>" (that key block). nullopt for other names.
std::optional<select::PrefillSelectConfig> parse_prefill_row(std::string_view method,
                                                             std::string_view option);

}  // namespace masskv::cli
