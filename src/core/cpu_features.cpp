#include "core/cpu_features.hpp"

#include <cstdlib>
#include <cstring>

namespace masskv::cpu {

bool has_avx2() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

bool simd_allowed() noexcept {
  static const bool ok = [] {
    const char* isa = std::getenv("MASSKV_ISA");
    return isa == nullptr || std::strcmp(isa, "scalar") != 0;
  }();
  return ok;
}

}  // namespace masskv::cpu
