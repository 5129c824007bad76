// ggml block layouts (ggml-common.h) of the GGUF formats in gguf_quant.h, as byte offsets.
// All multi-byte fields are little-endian; f16 fields are IEEE half.
//   Q4_0 (32 values, 18 B):  f16 d | u8 qs[16]            v[j] = d*((qs[j]&15)-8), v[j+16] = d*((qs[j]>>4)-8)
//   Q5_0 (32 values, 22 B):  f16 d | u32 qh | u8 qs[16]   5th bit of v[j] is bit j of qh; offset -16
//   Q8_0 (32 values, 34 B):  f16 d | i8 qs[32]            v[j] = d*qs[j]
//   Q4_K (256 values, 144 B): f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//        8 sub-blocks of 32, 6-bit scale sc and min m each (get_scale_min_k4);
//        sub-block 2c uses the low nibbles of qs[32c..32c+32), 2c+1 the high ones; v = d*sc*q - dmin*m
//   Q5_K (256 values, 176 B): f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//        as Q4_K plus a 5th bit: bit s of qh[l] for element l of sub-block s
//   Q6_K (256 values, 210 B): u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d
//        half h (128 values), element l<32: v[h*128 + 32*s + l] uses nibble (s>>1) of ql[h*64 + 32*(s&1) + l]
//        and bits 2s..2s+1 of qh[h*32 + l]; q in [0,64), v = d*scales[e/16]*(q-32)
#pragma once
#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace g4::gguf {

constexpr int QK = 32;    // block size of Q4_0 / Q5_0 / Q8_0
constexpr int QKK = 256;  // super-block size of the K-quants
constexpr int kQ4_0Bytes = 18, kQ5_0Bytes = 22, kQ8_0Bytes = 34;
constexpr int kQ4_KBytes = 144, kQ5_KBytes = 176, kQ6_KBytes = 210;

inline uint16_t rd16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t rd32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float rdf16(const uint8_t* p) { return f16_to_f32(rd16(p)); }

// ggml get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K/Q5_K scales[12] array.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace g4::gguf
