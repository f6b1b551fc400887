// Parsing of CLI values shared by subcommands; errors name the option.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "masskv/mapping.hpp"

namespace masskv::cli {

// "4096", "32K" (x1024), "1M" (x1048576) -> count > 0.
std::int64_t parse_count(std::string_view text, std::string_view option);
// "1/32", "0.125" -> fraction in (0, 1].
double parse_fraction(std::string_view text, std::string_view option);
// "softmax" or "entmax<alpha>" ("entmax1.5", "entmax2") -> a validated mapping.
Mapping parse_mapping(const std::string& text, std::string_view option);

}  // namespace masskv::cli
