#include "model/unicode.hpp"

#include <algorithm>
#include <iterator>

namespace masskv::model::unicode {
namespace {

struct CodepointRange {
  char32_t first, last;
};

#include "model/unicode_ranges.inc"

template <std::size_t N>
bool in_ranges(const CodepointRange (&ranges)[N], char32_t cp) noexcept {
  // First range whose last >= cp; cp is inside iff that range also starts at or before it.
  const auto it = std::lower_bound(std::begin(ranges), std::end(ranges), cp,
                                   [](const CodepointRange& r, char32_t c) { return r.last < c; });
  return it != std::end(ranges) && it->first <= cp;
}

}  // namespace

CharClass classify(char32_t cp) noexcept {
  if (cp < 0x80) {  // ASCII fast path
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    if (cp == ' ' || (cp >= 0x09 && cp <= 0x0D)) return CharClass::space;
    return CharClass::other;
  }
  if (in_ranges(kLetterRanges, cp)) return CharClass::letter;
  if (in_ranges(kNumberRanges, cp)) return CharClass::number;
  if (in_ranges(kWhiteSpaceRanges, cp)) return CharClass::space;
  return CharClass::other;
}

Utf8Char decode_utf8(std::string_view s, std::size_t pos) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char b0 = byte(pos);
  const Utf8Char invalid{b0, 1, false};
  if (b0 < 0x80) return {b0, 1, true};
  std::size_t len = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, cp = b0 & 0x1Fu, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, cp = b0 & 0x0Fu, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0) {
    len = 4, cp = b0 & 0x07u, min = 0x10000;
  } else {
    return invalid;
  }
  if (pos + len > s.size()) return invalid;
  for (std::size_t i = 1; i < len; ++i) {
    if ((byte(pos + i) & 0xC0) != 0x80) return invalid;
    cp = (cp << 6) | (byte(pos + i) & 0x3Fu);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not characters.
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return invalid;
  return {cp, len, true};
}

void append_utf8(std::string& out, char32_t cp) {
  const auto put = [&](unsigned v) { out.push_back(static_cast<char>(v)); };
  if (cp < 0x80) {
    put(cp);
  } else if (cp < 0x800) {
    put(0xC0 | (cp >> 6)), put(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    put(0xE0 | (cp >> 12)), put(0x80 | ((cp >> 6) & 0x3F)), put(0x80 | (cp & 0x3F));
  } else {
    put(0xF0 | (cp >> 18)), put(0x80 | ((cp >> 12) & 0x3F)), put(0x80 | ((cp >> 6) & 0x3F)),
        put(0x80 | (cp & 0x3F));
  }
}

}  // namespace masskv::model::unicode
