#include "eval/haystack.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "masskv/error.hpp"

namespace masskv::eval {
namespace {

// The filler of the noise haystacks (the passkey-retrieval style of Mohtashami & Jaggi 2023,
// used by RULER): content-free sentences a model can skip.
constexpr std::string_view kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Order of inserts by slot, ties in input order.
std::vector<std::size_t> order_by_slot(const std::vector<std::size_t>& slot) {
  std::vector<std::size_t> order(slot.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return slot[a] < slot[b]; });
  return order;
}

// Splits `text` into lines (without the newline), with the offset of each.
std::vector<std::pair<std::size_t, std::string_view>> lines_of(std::string_view text) {
  std::vector<std::pair<std::size_t, std::string_view>> lines;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    lines.emplace_back(pos, text.substr(pos, nl - pos));
    pos = nl + 1;
  }
  return lines;
}

bool is_underline(std::string_view line) {
  if (line.size() < 3) return false;
  const char c = line[0];
  if (std::string_view("*=-~^").find(c) == std::string_view::npos) return false;
  return std::all_of(line.begin(), line.end(), [c](char x) { return x == c; });
}

// "4.9. Title" -> {"4.9", "Title"}; empty number when the line has another shape.
std::pair<std::string, std::string> split_numbered(std::string_view line) {
  std::size_t i = 0;
  while (true) {
    const std::size_t digits = i;
    while (i < line.size() && is_digit(line[i])) ++i;
    if (i == digits || i >= line.size() || line[i] != '.') return {};
    ++i;  // the dot
    if (i < line.size() && line[i] == ' ') break;
  }
  const std::string_view title = line.substr(i + 1);
  if (title.empty()) return {};
  return {std::string(line.substr(0, i - 1)), std::string(title)};
}

}  // namespace

Placed noise_haystack(std::int64_t units, std::span<const Insert> inserts) {
  require(units >= 1, ErrorCode::invalid_argument, "units", "must be >= 1, got ", units);
  std::vector<std::size_t> slot(inserts.size());
  Placed out;
  for (std::size_t i = 0; i < inserts.size(); ++i) {
    slot[i] = static_cast<std::size_t>(std::llround(inserts[i].depth * static_cast<double>(units)));
    slot[i] = std::min(slot[i], static_cast<std::size_t>(units));
    out.depths.push_back(static_cast<double>(slot[i]) / static_cast<double>(units));
  }
  const std::vector<std::size_t> order = order_by_slot(slot);
  out.haystack.reserve(static_cast<std::size_t>(units) * (kNoise.size() + 1));
  std::size_t next = 0;
  auto append = [&out](std::string_view s) {
    if (!out.haystack.empty()) out.haystack += ' ';
    out.haystack += s;
  };
  for (std::size_t u = 0; u <= static_cast<std::size_t>(units); ++u) {
    while (next < order.size() && slot[order[next]] == u) append(inserts[order[next++]].text);
    if (u < static_cast<std::size_t>(units)) append(kNoise);
  }
  return out;
}

bool is_paragraph_start(std::string_view text, std::size_t pos) {
  if (pos >= text.size() || text[pos] == '\n') return false;
  return pos == 0 || (pos >= 2 && text[pos - 1] == '\n' && text[pos - 2] == '\n');
}

std::size_t previous_paragraph_start(std::string_view text, std::size_t pos) {
  pos = std::min(pos, text.empty() ? 0 : text.size() - 1);
  while (pos > 0 && !is_paragraph_start(text, pos)) --pos;
  return pos;
}

std::string text_window(std::string_view text, double start_fraction, std::size_t chars) {
  require(chars <= text.size(), ErrorCode::invalid_argument, "text", "has ", text.size(),
          " bytes, a window of ", chars, " was asked for");
  std::size_t start = static_cast<std::size_t>(start_fraction * static_cast<double>(text.size()));
  start = std::min(start, text.size() - 1);
  while (start < text.size() && !is_paragraph_start(text, start)) ++start;
  if (start == text.size()) start = 0;
  std::string window;
  window.reserve(chars + 2);
  // The part up to the end of the text, then (after a blank line) the beginning.
  const std::string_view tail = text.substr(start, chars);
  window += tail;
  if (window.size() < chars) {
    while (!window.empty() && is_space(window.back())) window.pop_back();
    window += "\n\n";
    if (window.size() < chars) window += text.substr(0, std::min(chars - window.size(), start));
  }
  // Cut back to a line end so the window does not stop inside a word.
  const std::size_t last_newline = window.rfind('\n');
  if (window.size() == chars && last_newline != std::string::npos && last_newline > 0) {
    window.resize(last_newline);
  }
  while (!window.empty() && is_space(window.back())) window.pop_back();
  return window;
}

Placed insert_at_sentences(std::string_view haystack, std::span<const Insert> inserts) {
  // Candidate places: the start, every sentence end, the end.
  std::vector<std::size_t> places = {0};
  for (std::size_t p = 2; p < haystack.size(); ++p) {
    if (haystack[p - 1] == '.' && is_lower(haystack[p - 2]) && is_space(haystack[p]) &&
        (p < 3 || haystack[p - 3] != '.')) {
      places.push_back(p);
    }
  }
  if (haystack.size() > 0) places.push_back(haystack.size());
  const double size = static_cast<double>(std::max<std::size_t>(haystack.size(), 1));
  std::vector<std::size_t> slot(inserts.size());
  Placed out;
  for (std::size_t i = 0; i < inserts.size(); ++i) {
    const double target = inserts[i].depth * size;
    auto it = std::lower_bound(places.begin(), places.end(), target,
                               [](std::size_t p, double t) { return static_cast<double>(p) < t; });
    if (it == places.end() || (it != places.begin() && target - static_cast<double>(*(it - 1)) <
                                                           static_cast<double>(*it) - target)) {
      --it;
    }
    slot[i] = *it;
    out.depths.push_back(static_cast<double>(slot[i]) / size);
  }
  const std::vector<std::size_t> order = order_by_slot(slot);
  std::size_t copied = 0;
  for (std::size_t k : order) {
    out.haystack += haystack.substr(copied, slot[k] - copied);
    copied = slot[k];
    if (slot[k] == 0) {
      out.haystack += inserts[k].text;
      out.haystack += '\n';
    } else {
      out.haystack += slot[k] == haystack.size() ? '\n' : ' ';
      out.haystack += inserts[k].text;
    }
  }
  out.haystack += haystack.substr(copied);
  return out;
}

std::vector<Heading> numbered_headings(std::string_view text) {
  std::vector<Heading> headings;
  const auto lines = lines_of(text);
  for (std::size_t i = 0; i + 1 < lines.size(); ++i) {
    if (!is_underline(lines[i + 1].second)) continue;
    auto [number, title] = split_numbered(lines[i].second);
    if (number.empty()) continue;
    const std::size_t end = lines[i + 1].first + lines[i + 1].second.size();
    headings.push_back(
        {lines[i].first, std::min(end + 1, text.size()), std::move(number), std::move(title)});
  }
  return headings;
}

std::vector<std::string> numbers_of_title(std::string_view text, std::string_view title) {
  std::vector<std::string> numbers;
  for (auto [offset, line] : lines_of(text)) {
    (void)offset;
    while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (line.starts_with("* ")) line.remove_prefix(2);
    if (line.find(title) == std::string_view::npos) continue;
    auto [number, rest] = split_numbered(line);
    if (!number.empty() && rest == title) numbers.push_back(std::move(number));
  }
  return numbers;
}

}  // namespace masskv::eval
