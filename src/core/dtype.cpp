#include "core/dtype.h"

#include <cmath>

namespace g4 {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: case DType::U64: return 8;
    case DType::F32: case DType::I32: case DType::U32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: case DType::U16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: return 1;
    default: return 0;
  }
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32"; case DType::F16: return "F16"; case DType::BF16: return "BF16";
    case DType::F64: return "F64"; case DType::I8: return "I8"; case DType::U8: return "U8";
    case DType::I16: return "I16"; case DType::U16: return "U16"; case DType::I32: return "I32";
    case DType::U32: return "U32"; case DType::I64: return "I64"; case DType::U64: return "U64";
    case DType::BOOL: return "BOOL"; default: return "unknown";
  }
}

DType dtype_from_safetensors(std::string_view s) {
  struct P { std::string_view n; DType t; };
  static const P table[] = {{"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16},
                            {"F64", DType::F64}, {"I8", DType::I8},   {"U8", DType::U8},
                            {"I16", DType::I16}, {"U16", DType::U16}, {"I32", DType::I32},
                            {"U32", DType::U32}, {"I64", DType::I64}, {"U64", DType::U64},
                            {"BOOL", DType::BOOL}};
  for (const auto& p : table)
    if (p.n == s) return p.t;
  return DType::Unknown;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t u;
  if (exp == 0) {
    if (man == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      u = sign | uint32_t(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return sign | 0x7e00;                // NaN
  if (au >= 0x477ff000u) return sign | 0x7c00;               // overflow -> inf (incl. rounding up)
  if (au < 0x38800000u) {                                    // subnormal or zero in f16
    float a;
    std::memcpy(&a, &au, 4);
    // scale so that the f16 subnormal unit (2^-24) becomes 1, round to nearest even.
    float scaled = a * 16777216.0f;
    return sign | uint16_t(std::nearbyint(scaled));
  }
  uint32_t e = ((au >> 23) - 127 + 15);
  uint32_t m = au & 0x7fffff;
  uint32_t r = (e << 10) | (m >> 13);
  uint32_t rem = m & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | uint16_t(r);
}

}  // namespace g4
