// The packaged models for tests (skipped when absent) and whether the suite runs sanitized.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "masskv/model/locate.hpp"
#include "masskv/model/model.hpp"

namespace masskv::test {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif

// One model per name for the whole test binary (loading maps the file and builds the
// tokenizer: cheap, but not free under ASan); nullptr when not installed.
inline const model::Model* installed(const std::string& name) {
  static std::map<std::string, std::unique_ptr<model::Model>> cache;
  auto it = cache.find(name);
  if (it == cache.end()) {
    const auto path = model::find_model_if_installed(name);
    it = cache.emplace(name, path.empty() ? nullptr : model::Model::load(path.string())).first;
  }
  return it->second.get();
}

}  // namespace masskv::test

#define REQUIRE_MODEL(var, name)                                       \
  const ::masskv::model::Model* var = ::masskv::test::installed(name); \
  if (var == nullptr) GTEST_SKIP() << name << " not installed (scripts/setup.sh --models)"
