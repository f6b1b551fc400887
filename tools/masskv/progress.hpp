// A progress bar on stderr with ETA, for anything that runs longer than a few seconds.
// When stderr is not a terminal (logs, CI) a plain line every few seconds instead
// (done/total, rate, ETA; MASSKV_PROGRESS_SECONDS sets the interval, default 5) and one at the end.
#pragma once

#include <chrono>
#include <string>

namespace masskv::cli {

class Progress {
 public:
  Progress(std::string label, long total);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(long n = 1);
  void set_note(std::string note);  // shown after the bar, e.g. the current context
  void finish();

 private:
  void draw(bool final);

  std::string label_, note_;
  long total_, done_ = 0;
  bool tty_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_, last_log_;
};

}  // namespace masskv::cli
