// Element types of stored tensors and exact conversions between them.
// bf16/f16 -> f32 are exact; f32 -> bf16/f16 round to nearest, ties to even (as MLX and PyTorch do).
#pragma once
#include <cstdint>
#include <cstring>
#include <string_view>

namespace g4 {

enum class DType : uint8_t { F32, F16, BF16, F64, I8, U8, I16, U16, I32, U32, I64, U64, BOOL, Unknown };

// Bytes per element (0 for Unknown).
size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses safetensors names ("F32", "BF16", "U32", ...). Returns Unknown when not recognised.
DType dtype_from_safetensors(std::string_view s);

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Round an f32 value to the nearest bf16 value, returned as f32.
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
inline float round_f16(float f) { return f16_to_f32(f32_to_f16(f)); }

// Reads element i of a float-typed buffer (F32/F16/BF16) as f32.
// The buffer may be unaligned (MLX writes safetensors headers without padding), so elements are
// read with memcpy.
inline float load_float(const void* p, DType t, size_t i) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  switch (t) {
    case DType::F32: { float f; std::memcpy(&f, b + 4 * i, 4); return f; }
    case DType::BF16: { uint16_t h; std::memcpy(&h, b + 2 * i, 2); return bf16_to_f32(h); }
    case DType::F16: { uint16_t h; std::memcpy(&h, b + 2 * i, 2); return f16_to_f32(h); }
    default: return 0.f;
  }
}

// Activation precision of a forward pass: F32 keeps everything in f32; BF16 rounds every op's
// output to bf16 the way MLX does when the model runs in its checkpoint dtype.
enum class ActPrecision : uint8_t { F32, BF16 };

}  // namespace g4
