// LineFile (masskv/line_file.hpp), the store under the eval's results cache: a file torn at any
// byte of its last record loses that record at most, and the next append starts a line of its
// own. Also the library's own check of a session's page size (page_size 0 was a SIGFPE).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "installed_model.hpp"
#include "masskv/error.hpp"
#include "masskv/line_file.hpp"

namespace masskv {
namespace {

namespace fs = std::filesystem;

fs::path temp_file(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("masskv_line_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir / name;
}

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

std::string read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string record(int i) {
  return R"({"task":"niah_single_number","length":1024,"index":)" + std::to_string(i) +
         R"(,"method":"quest","budget":"1/16","score":1.0,"output":"7 3 1"})";
}

TEST(LineFile, CreatesTheFileAndItsFolder) {
  const fs::path p = temp_file("new/dir/cache.jsonl");
  fs::remove_all(p.parent_path());
  {
    LineFile f(p, "--cache");
    EXPECT_TRUE(f.lines().empty());
    EXPECT_TRUE(f.torn_tail().empty());
    f.append(record(0));
  }
  EXPECT_EQ(read_bytes(p), record(0) + "\n");
}

// The file torn at every byte offset of its last record (a run killed mid-write): the records
// before it are all read, the torn bytes are handed back and cut off, and a record appended
// next is read whole by the next open. Offset == size of the record is the record whole but
// without its newline; offset size + 1 is the untorn file.
TEST(LineFile, TornAtEveryOffsetOfTheLastRecordLosesNothingElse) {
  const fs::path p = temp_file("torn.jsonl");
  constexpr int kKept = 3;
  std::string kept;
  for (int i = 0; i < kKept; ++i) kept += record(i) + "\n";
  const std::string last = record(kKept) + "\n";
  int offsets = 0;
  for (std::size_t cut = 0; cut <= last.size(); ++cut, ++offsets) {
    SCOPED_TRACE("cut at byte " + std::to_string(cut));
    write_bytes(p, kept + last.substr(0, cut));
    const bool whole = cut == last.size();
    {
      LineFile f(p, "--cache");
      ASSERT_EQ(f.lines().size(), static_cast<std::size_t>(whole ? kKept + 1 : kKept));
      for (int i = 0; i < kKept; ++i) EXPECT_EQ(f.lines()[static_cast<std::size_t>(i)], record(i));
      EXPECT_EQ(f.torn_tail(), whole ? "" : last.substr(0, cut));
      f.append(record(99));
    }
    LineFile again(p, "--cache");
    EXPECT_TRUE(again.torn_tail().empty());
    ASSERT_EQ(again.lines().size(), static_cast<std::size_t>(whole ? kKept + 2 : kKept + 1));
    for (int i = 0; i < kKept; ++i)
      EXPECT_EQ(again.lines()[static_cast<std::size_t>(i)], record(i));
    EXPECT_EQ(again.lines().back(), record(99));
  }
  EXPECT_EQ(offsets, static_cast<int>(last.size()) + 1);
  fs::remove_all(p.parent_path());
}

TEST(LineFile, RefusesALineWithANewlineAndAnUnwritablePath) {
  const fs::path p = temp_file("nl.jsonl");
  LineFile f(p, "--cache");
  test::expect_error([&] { f.append("a\nb"); }, ErrorCode::invalid_argument, "--cache");
  test::expect_error([] { LineFile g("/proc/masskv/cache.jsonl", "--cache"); }, ErrorCode::io,
                     "--cache");
}

// Library entry points keep their own checks: a page size of 0 divided the capacity (SIGFPE,
// also through Python's Model.session(page_size=0)); now Error naming page_size.
TEST(SessionOptions, PageSizeIsCheckedBeforeAnyDivision) {
  REQUIRE_MODEL(m, "smollm2");
  for (const int page : {0, -16, 3, 512}) {
    model::SessionOptions o;
    o.max_tokens = 256;
    o.page_size = page;
    test::expect_error([&] { model::Session s(*m, o); }, ErrorCode::invalid_argument, "page_size",
                       "power of two");
  }
}

}  // namespace
}  // namespace masskv
