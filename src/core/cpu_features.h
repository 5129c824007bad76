// CPU features that __builtin_cpu_supports cannot name on every compiler (clang 14 knows neither
// "f16c" nor the AMX features), read from CPUID directly.
#pragma once
#include <cpuid.h>

namespace g4 {

// F16C (half <-> float conversions): CPUID.1:ECX bit 29.
inline bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

}  // namespace g4
