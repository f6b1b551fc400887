// Haystacks of the eval tasks: repeated noise sentences, windows of a real text, sentences
// inserted at relative depths, and the numbered section headings of the text (qa_text).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace masskv::eval {

// A sentence to place at a relative depth in [0, 1] of a haystack.
struct Insert {
  double depth = 0;
  std::string text;
};

struct Placed {
  std::string haystack;
  std::vector<double> depths;  // realised relative position of each insert, in input order
};

// `units` copies of a fixed noise passage joined by spaces; insert i goes between copies
// round(depth_i * units) - 1 and round(depth_i * units). Inserts at the same place keep their
// input order (variable tracking relies on it for the order of a chain's hops).
Placed noise_haystack(std::int64_t units, std::span<const Insert> inserts);

// `chars` bytes of `text` read as a ring, starting at the first paragraph start at or after
// byte floor(start_fraction * text.size()) and cut back to a line end; where the end of the
// text is passed the window continues with its beginning after a blank line. A longer window
// extends a shorter one with the same start (so token counts grow with `chars`). Requires
// chars <= text.size().
std::string text_window(std::string_view text, double start_fraction, std::size_t chars);

// Places every insert at the sentence end (a '.' after a lowercase letter, before whitespace,
// not in "e.g.") nearest to depth * haystack size, or at the very start / end.
Placed insert_at_sentences(std::string_view haystack, std::span<const Insert> inserts);

// A numbered heading line followed by an underline ("4.9. Main building script: ..." / "====").
struct Heading {
  std::size_t begin = 0;  // first byte of the heading line
  std::size_t end = 0;    // one past the underline's newline
  std::string number;     // "4.9"
  std::string title;      // "Main building script: \"debian/rules\""
};
std::vector<Heading> numbered_headings(std::string_view text);

// The numbers of every line in `text` that reads "<number>. <title>" for this title, after
// leading blanks and a "* " bullet (headings and table-of-contents entries alike).
std::vector<std::string> numbers_of_title(std::string_view text, std::string_view title);

// Paragraph starts: byte 0 and every non-newline byte after a blank line.
bool is_paragraph_start(std::string_view text, std::size_t pos);
std::size_t previous_paragraph_start(std::string_view text, std::size_t pos);  // <= pos

}  // namespace masskv::eval
