// An append-only file of text lines that no crash can corrupt beyond the line being written:
// the store of results that take minutes each to compute (the eval's cache.jsonl).
//
// A process killed mid-write, or a full disk, can leave the last line without its '\n'. If the
// next record were appended after it, the two would share one line and both be unreadable, so
// a result computed later would be lost too. Opening the file therefore cuts such a torn tail
// off (handing its bytes to the caller, which may keep it if it is whole after all), and every
// append writes one whole line in one write(2) on an O_APPEND descriptor (whole lines even when
// two processes append to one file), then fdatasync()s it.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace masskv {

class LineFile {
 public:
  // Opens `path` for appending, creating it (and its folder) if absent, after reading its
  // complete lines and cutting off a torn tail. Error(io, `option`) when it cannot.
  LineFile(std::filesystem::path path, std::string option);
  ~LineFile();
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;

  // The lines that ended in '\n' when the file was opened, without it (empty lines included).
  const std::vector<std::string>& lines() const { return lines_; }
  // The bytes after the last '\n' when the file was opened (empty if none), now cut off.
  const std::string& torn_tail() const { return torn_; }
  // Appends `line` and '\n' (`line` must not hold '\n'). Error(io, option) if the write fails.
  void append(std::string_view line);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::string option_;
  std::vector<std::string> lines_;
  std::string torn_;
  int fd_ = -1;
};

}  // namespace masskv
