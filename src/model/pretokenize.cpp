#include "model/pretokenize.hpp"

#include "model/unicode.hpp"

namespace masskv::model {
namespace {

using unicode::CharClass;

struct Char {
  std::size_t pos, len;
  char32_t cp;
  CharClass cls;
};

// The regex over chars[b, e). A whitespace run followed by text leaves its last character to
// that text (so " word" keeps its space); the optional leading space is U+0020 only.
template <class Emit>
void split_range(const std::vector<Char>& chars, std::size_t b, std::size_t e, Emit&& emit) {
  const auto is = [&](std::size_t k, char32_t c) { return k < e && chars[k].cp == c; };
  std::size_t i = b;
  while (i < e) {
    if (chars[i].cp == U'\'') {
      if (is(i + 1, U's') || is(i + 1, U't') || is(i + 1, U'm') || is(i + 1, U'd')) {
        emit(i, i + 2), i += 2;
        continue;
      }
      if ((is(i + 1, U'r') && is(i + 2, U'e')) || (is(i + 1, U'v') && is(i + 2, U'e')) ||
          (is(i + 1, U'l') && is(i + 2, U'l'))) {
        emit(i, i + 3), i += 3;
        continue;
      }
    }
    std::size_t j = i;
    if (chars[i].cp == U' ' && i + 1 < e && chars[i + 1].cls != CharClass::space) j = i + 1;
    const CharClass cls = chars[j].cls;
    std::size_t m = j + 1;
    while (m < e && chars[m].cls == cls) ++m;
    if (cls == CharClass::space && m < e && m - i >= 2) --m;  // \s+(?!\S)
    emit(i, m);
    i = m;
  }
}

}  // namespace

std::vector<std::string_view> split_gpt2(std::string_view text, bool isolate_digits) {
  std::vector<Char> chars;
  for (std::size_t pos = 0; pos < text.size();) {
    const unicode::Utf8Char c = unicode::decode_utf8(text, pos);
    chars.push_back({pos, c.len, c.cp, c.valid ? unicode::classify(c.cp) : CharClass::other});
    pos += c.len;
  }
  std::vector<std::string_view> words;
  const auto emit = [&](std::size_t b, std::size_t e) {
    const std::size_t first = chars[b].pos;
    words.push_back(text.substr(first, chars[e - 1].pos + chars[e - 1].len - first));
  };
  std::size_t b = 0;
  for (std::size_t i = 0; i < chars.size(); ++i) {
    if (isolate_digits && chars[i].cls == CharClass::number) {
      split_range(chars, b, i, emit);
      emit(i, i + 1);
      b = i + 1;
    }
  }
  split_range(chars, b, chars.size(), emit);
  return words;
}

}  // namespace masskv::model
