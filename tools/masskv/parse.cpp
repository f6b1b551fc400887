#include "parse.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
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

namespace {

// Tokens of a fraction of `context` ("1/16", "0.0625") or a count ("256", "2K").
std::int64_t budget_tokens(std::string_view text, std::int64_t context, std::string_view option) {
  if (text.find('/') != std::string_view::npos || text.find('.') != std::string_view::npos) {
    return std::max<std::int64_t>(
        1, std::llround(parse_fraction(text, option) * static_cast<double>(context)));
  }
  return parse_count(text, option);
}

}  // namespace

bool is_top_p_budget(std::string_view text) { return !text.empty() && text.front() == 'p'; }

select::PrefillBudget parse_prefill_budget(std::string_view text, std::string_view option) {
  select::PrefillBudget b;
  if (text.find('/') != std::string_view::npos || text.find('.') != std::string_view::npos) {
    b.fraction = parse_fraction(text, option);
  } else {
    b.tokens = parse_count(text, option);
  }
  return b;
}

std::optional<select::PrefillSelectConfig> parse_prefill_row(std::string_view method,
                                                             std::string_view option) {
  constexpr std::string_view prefix = "prefill_";
  if (method.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view rest = method.substr(prefix.size());
  select::PrefillSelectConfig c;
  if (rest == "token") {
    c.method = select::PrefillMethod::token;
    return c;
  }
  for (const select::PrefillMethod m :
       {select::PrefillMethod::block, select::PrefillMethod::shared, select::PrefillMethod::index,
        select::PrefillMethod::learned}) {
    const std::string_view name = select::to_string(m);
    if (rest.substr(0, name.size()) != name) continue;
    const std::string_view size = rest.substr(name.size());
    for (const int k : {16, 64, 128}) {
      if (size == std::to_string(k)) {
        c.method = m;
        c.k_block = k;
        return c;
      }
    }
  }
  fail(ErrorCode::invalid_argument, option, "unknown sparse prefill method '", method,
       "' (prefill_token, or prefill_block / prefill_shared / prefill_index / prefill_learned with "
       "a key block of "
       "16, 64 or 128: prefill_shared64)");
}

select::Budget parse_budget(std::string_view text, std::int64_t context, std::string_view option) {
  select::Budget b;
  if (!is_top_p_budget(text)) {
    b.tokens = budget_tokens(text, context, option);
    return b;
  }
  b.kind = select::Budget::Kind::top_p;
  std::string_view mass = text.substr(1);
  if (const auto colon = mass.find(':'); colon != std::string_view::npos) {
    std::string_view cap = mass.substr(colon + 1);
    mass = mass.substr(0, colon);
    // pMASS:CAP:MIN: the floor K_min (Budget::min_tokens), at most the cap.
    if (const auto second = cap.find(':'); second != std::string_view::npos) {
      b.min_tokens = budget_tokens(cap.substr(second + 1), context, option);
      cap = cap.substr(0, second);
    }
    b.tokens = budget_tokens(cap, context, option);
    require(b.min_tokens <= b.tokens, ErrorCode::invalid_argument, option, "the floor of '", text,
            "' (", b.min_tokens, " tokens) exceeds its cap (", b.tokens, ")");
  }
  const std::string m(mass);
  std::size_t used = 0;
  double p = NAN;
  try {
    p = std::stod(m, &used);
  } catch (const std::logic_error&) {
    used = 0;
  }
  require(used == m.size() && !m.empty() && p > 0 && p <= 1, ErrorCode::invalid_argument, option,
          "a top-p budget is p<mass in (0, 1]>[:cap[:floor]], e.g. p0.9, p0.9:1/8 or "
          "p0.9:1/8:1/32, got '", text, "'");
  b.p = p;
  return b;
}

}  // namespace masskv::cli
