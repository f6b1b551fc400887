#include "core/cpu_features.hpp"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace masskv::cpu {

bool has_avx2() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  // F16C via cpuid: clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool f16c = __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
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
