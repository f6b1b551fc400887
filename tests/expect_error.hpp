// The one check of the error contract (docs/design.md §6): `f` throws masskv::Error with this
// code, naming this argument, and (optionally) saying `message_part`.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "masskv/error.hpp"

namespace masskv::test {

template <class F>
void expect_error(F&& f, ErrorCode code, const std::string& argument,
                  const std::string& message_part = "") {
  try {
    f();
    ADD_FAILURE() << "no masskv::Error thrown, expected " << to_string(code) << " on "
                  << argument;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_EQ(e.argument(), argument) << e.what();
    if (!message_part.empty()) {
      EXPECT_NE(std::string(e.what()).find(message_part), std::string::npos) << e.what();
    }
  }
}

}  // namespace masskv::test
