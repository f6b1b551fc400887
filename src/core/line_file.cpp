#include "masskv/line_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "masskv/error.hpp"

namespace masskv {

LineFile::LineFile(std::filesystem::path path, std::string option)
    : path_(std::move(path)), option_(std::move(option)) {
  std::error_code ec;
  if (!path_.parent_path().empty()) std::filesystem::create_directories(path_.parent_path(), ec);
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  require(fd_ >= 0, ErrorCode::io, option_, "cannot open ", path_.string(), ": ",
          std::strerror(errno));
  std::string all;
  {
    std::ifstream in(path_, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    all = ss.str();
  }
  const std::size_t whole = all.rfind('\n') == std::string::npos ? 0 : all.rfind('\n') + 1;
  torn_ = all.substr(whole);
  for (std::size_t pos = 0; pos < whole;) {
    const std::size_t nl = all.find('\n', pos);
    lines_.push_back(all.substr(pos, nl - pos));
    pos = nl + 1;
  }
  if (!torn_.empty()) {
    // Cut the torn tail so the next append starts a line of its own.
    require(::ftruncate(fd_, static_cast<off_t>(whole)) == 0, ErrorCode::io, option_,
            "cannot repair the torn last line of ", path_.string(), ": ", std::strerror(errno));
  }
}

LineFile::~LineFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LineFile::append(std::string_view line) {
  require(line.find('\n') == std::string_view::npos, ErrorCode::invalid_argument, option_,
          "a line to append holds a newline");
  std::string buf(line);
  buf += '\n';
  // One write(2) of the whole line: with O_APPEND it lands after everything else written to
  // the file, never interleaved with another appender's line.
  std::size_t done = 0;
  while (done < buf.size()) {
    const ssize_t n = ::write(fd_, buf.data() + done, buf.size() - done);
    if (n < 0 && errno == EINTR) continue;
    require(n > 0, ErrorCode::io, option_, "cannot write ", path_.string(), ": ",
            std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
  // On disk before the caller counts the result as saved (a power cut keeps it too).
  ::fdatasync(fd_);
}

}  // namespace masskv
