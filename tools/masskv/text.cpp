#include "text.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "masskv/error.hpp"

namespace masskv::cli {
namespace {

std::string read_file(const std::string& p, const char* option) {
  std::ifstream in(p, std::ios::binary);
  require(in.good(), ErrorCode::io, option, "cannot read ", p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string load_text(const std::string& path, const char* option) {
  if (!path.empty()) return read_file(path, option);
  if (const char* env = std::getenv("MASSKV_TEXT"); env != nullptr && *env != '\0') {
    return read_file(env, "MASSKV_TEXT");
  }
  const char* gz = "/usr/share/doc/debian-policy/policy.txt.gz";
  require(std::filesystem::exists(gz), ErrorCode::io, option,
          "no text: install the Debian Policy Manual with scripts/setup.sh --models "
          "(debian-policy) or pass ", option, " FILE");
  std::string text;
  FILE* pipe = popen((std::string("gzip -dc ") + gz).c_str(), "r");
  require(pipe != nullptr, ErrorCode::io, option, "cannot run gzip on ", gz);
  char buf[1 << 16];
  std::size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) text.append(buf, n);
  require(pclose(pipe) == 0 && !text.empty(), ErrorCode::io, option, "gzip -dc ", gz, " failed");
  return text;
}

}  // namespace masskv::cli
