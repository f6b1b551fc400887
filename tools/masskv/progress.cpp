#include "progress.hpp"

#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace masskv::cli {

Progress::Progress(std::string label, long total)
    : label_(std::move(label)),
      total_(std::max(1L, total)),
      tty_(isatty(STDERR_FILENO) != 0),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      last_log_(start_) {
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

namespace {

// Seconds between the log lines when stderr is not a terminal: MASSKV_PROGRESS_SECONDS (tests
// set a small one), else 5: often enough that a CI log shows life, rarely enough to stay short.
double log_interval() {
  static const double s = [] {
    const char* env = std::getenv("MASSKV_PROGRESS_SECONDS");
    const double v = env != nullptr ? std::atof(env) : 0.0;
    return v > 0 ? v : 5.0;
  }();
  return s;
}

}  // namespace

void Progress::draw(bool final) {
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (!tty_ && !final) {
    // Logs and CI: no bar redrawn in place, but a plain line every few seconds.
    if (std::chrono::duration<double>(now - last_log_).count() < log_interval()) return;
    last_log_ = now;
    const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
    const double left = rate > 0 ? static_cast<double>(total_ - done_) / rate : 0.0;
    fmt::print(stderr, "{}: {}/{} ({:.0f}%), {:.3g}/s, {:.0f} s elapsed, ETA {}{}\n", label_,
               done_, total_, 100.0 * static_cast<double>(done_) / static_cast<double>(total_),
               rate, elapsed, done_ > 0 ? fmt::format("{:.0f} s", left) : std::string("-"),
               note_.empty() ? "" : " " + note_);
    std::fflush(stderr);
    return;
  }
  last_draw_ = now;
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
