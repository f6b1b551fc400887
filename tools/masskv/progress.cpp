#include "progress.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace masskv::cli {

Progress::Progress(std::string label, long total)
    : label_(std::move(label)),
      total_(std::max(1L, total)),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {
  draw(false);
}

Progress::~Progress() { finish(); }

void Progress::advance(long n) {
  done_ = std::min(total_, done_ + n);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ > std::chrono::milliseconds(100) || done_ == total_) draw(false);
}

void Progress::set_note(std::string note) {
  note_ = std::move(note);
  draw(false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  draw(true);
}

void Progress::draw(bool final) {
  last_draw_ = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(last_draw_ - start_).count();
  if (!tty_ && !final) return;
  const double frac = static_cast<double>(done_) / static_cast<double>(total_);
  constexpr int width = 30;
  const int filled = static_cast<int>(frac * width);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(width, '.');
  const double eta = done_ > 0 ? elapsed * (1.0 - frac) / frac : 0.0;
  if (final) {
    fmt::print(stderr, "{}{} [{}] {}/{} done in {:.1f} s\n", tty_ ? "\r\033[K" : "", label_, bar,
               done_, total_, elapsed);
  } else {
    fmt::print(stderr, "\r\033[K{} [{}] {}/{} {:.0f}% {:.1f} s, ETA {:.1f} s {}", label_, bar,
               done_, total_, frac * 100.0, elapsed, eta, note_);
  }
  std::fflush(stderr);
}

}  // namespace masskv::cli
