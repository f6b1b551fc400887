// The real text of the tests (the Debian Policy Manual of `debian-policy`, the eval's real-text
// haystacks and the distillation text), read once; empty when the package is not installed.
#pragma once

#include <cstdio>
#include <string>

namespace masskv::test {

inline constexpr const char* kPolicyPath = "/usr/share/doc/debian-policy/policy.txt.gz";

inline const std::string& policy_text() {
  static const std::string text = [] {
    std::string out;
    if (FILE* probe = std::fopen(kPolicyPath, "rb")) {
      std::fclose(probe);
    } else {
      return out;
    }
    FILE* pipe = popen((std::string("gzip -dc ") + kPolicyPath).c_str(), "r");
    if (pipe == nullptr) return out;
    char buf[1 << 16];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
    pclose(pipe);
    return out;
  }();
  return text;
}

}  // namespace masskv::test

#define REQUIRE_TEXT()                                   \
  if (::masskv::test::policy_text().empty())             \
  GTEST_SKIP() << ::masskv::test::kPolicyPath << " absent (apt install debian-policy)"
