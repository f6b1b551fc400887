#include "parse.hpp"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>

#include "masskv/error.hpp"

namespace masskv::cli {

std::int64_t parse_count(std::string_view text, std::string_view option) {
  std::int64_t mult = 1;
  std::string_view digits = text;
  if (!digits.empty() && (digits.back() == 'K' || digits.back() == 'k')) {
    mult = 1024;
    digits.remove_suffix(1);
  } else if (!digits.empty() && (digits.back() == 'M' || digits.back() == 'm')) {
    mult = 1024 * 1024;
    digits.remove_suffix(1);
  }
  std::int64_t v = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  require(ec == std::errc() && end == digits.data() + digits.size() && v > 0 &&
              v <= (std::int64_t{1} << 40) / mult,
          ErrorCode::invalid_argument, option,
          "expected a positive count like 4096, 32K or 1M, got '", text, "'");
  return v * mult;
}

double parse_fraction(std::string_view text, std::string_view option) {
  const std::string s(text);
  double v = NAN;
  try {
    std::size_t used = 0;
    if (const auto slash = s.find('/'); slash != std::string::npos) {
      const double num = std::stod(s.substr(0, slash), &used);
      require(used == slash, ErrorCode::invalid_argument, option, "bad fraction '", text, "'");
      const std::string den_s = s.substr(slash + 1);
      const double den = std::stod(den_s, &used);
      require(used == den_s.size(), ErrorCode::invalid_argument, option, "bad fraction '", text,
              "'");
      v = num / den;
    } else {
      v = std::stod(s, &used);
      require(used == s.size(), ErrorCode::invalid_argument, option, "bad fraction '", text, "'");
    }
  } catch (const std::logic_error&) {
    fail(ErrorCode::invalid_argument, option, "expected a fraction like 1/16 or 0.0625, got '",
         text, "'");
  }
  require(std::isfinite(v) && v > 0 && v <= 1, ErrorCode::invalid_argument, option,
          "fraction must be in (0, 1], got '", text, "'");
  return v;
}

Mapping parse_mapping(const std::string& text, std::string_view option) {
  if (text == "softmax") return Mapping::softmax();
  require(text.rfind("entmax", 0) == 0 && text.size() > 6, ErrorCode::invalid_argument, option,
          "expected softmax or entmax<alpha> (entmax1.5), got '", text, "'");
  Mapping m = Mapping::entmax(std::strtod(text.c_str() + 6, nullptr));
  m.validate();
  return m;
}

}  // namespace masskv::cli
