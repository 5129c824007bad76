// Weight decoding for the kernels that stage bf16 weight tiles (the grouped expert GEMMs, the
// few-row MMA kernel, cuBLAS's bf16 weight scratch), with wide loads instead of dequant32's byte
// reads: dequant8 (four adjacent threads decode a unit, so a warp's loads read contiguous bytes of
// a few rows), and q4k_pairs (a Q4_K unit from two 16-byte words, in bf16 arithmetic).
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_mma_bf16.cuh"

namespace g4::cuda {

// Bytes p[0..7] as two little-endian words, with the widest loads p's alignment allows (GGUF blocks
// of 18, 22, 34 and 210 bytes leave fields at any even offset).
__device__ inline uint2 ld_bytes8(const uint8_t* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  if ((a & 7) == 0) return *reinterpret_cast<const uint2*>(p);
  if ((a & 3) == 0) return make_uint2(reinterpret_cast<const uint32_t*>(p)[0], reinterpret_cast<const uint32_t*>(p)[1]);
  if ((a & 1) == 0) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return make_uint2(uint32_t(h[0]) | uint32_t(h[1]) << 16, uint32_t(h[2]) | uint32_t(h[3]) << 16);
  }
  return make_uint2(ld_u32(p), ld_u32(p + 4));
}
__device__ inline uint32_t byte_of(uint2 b, int i) { return ((i < 4 ? b.x : b.y) >> (8 * (i & 3))) & 0xFFu; }

// Values 8p .. 8p + 7 (p < 4) of row r's 32-value unit u: a quarter of dequant32's unit, each
// value with dequant32's bits. Four threads decode a unit, each reading its quarter's bytes in
// one or two loads: adjacent threads read adjacent bytes (dequant32's one thread reads its unit
// byte by byte). The row's bytes come from `row`, as in dequant_at; MLX affine reads up to 8 - bits
// bytes past a row's last value (the slack after every uploaded weight).
template <WFormat F>
__device__ inline void dequant8(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u, int p, float* out) {
  if constexpr (F == WFormat::GgufQ8_0) {
    const uint8_t* b = row + u * 34;
    const float d = ld_half(b);
    const uint2 q = ld_bytes8(b + 2 + 8 * p);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = d * float(int8_t(byte_of(q, i)));
  } else if constexpr (F == WFormat::GgufQ4_0 || F == WFormat::GgufQ5_0) {
    // Values j and j + 16 share byte j (low and high nibble); Q5_0's fifth bits are qh's bit j.
    constexpr bool q5 = F == WFormat::GgufQ5_0;
    const uint8_t* b = row + u * (q5 ? 22 : 18);
    const float d = ld_half(b);
    const uint2 q = ld_bytes8(b + (q5 ? 6 : 2) + 8 * (p & 1));
    const int shift = (p >> 1) * 4;
    const uint32_t qh = q5 ? ld_u32(b + 2) : 0u;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int v = int((byte_of(q, i) >> shift) & 15u);
      if constexpr (q5) {
        v |= int((qh >> (8 * p + i)) & 1u) << 4;
        out[i] = d * float(v - 16);
      } else {
        out[i] = d * float(v - 8);
      }
    }
  } else if constexpr (F == WFormat::GgufQ4_K || F == WFormat::GgufQ5_K) {
    constexpr bool q5 = F == WFormat::GgufQ5_K;
    const int s = int(u % 8);
    const KUnit k = kquant_unit<q5>(row, u);
    const uint2 q = ld_bytes8(k.b + (q5 ? 48 : 16) + 32 * (s / 2) + 8 * p);
    const uint2 hb = q5 ? ld_bytes8(k.b + 16 + 8 * p) : make_uint2(0, 0);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int v = int((byte_of(q, i) >> shift) & 15u);
      if constexpr (q5) v |= int((byte_of(hb, i) >> s) & 1u) << 4;
      out[i] = k.d * float(v) - k.dm;
    }
  } else if constexpr (F == WFormat::GgufQ6_K) {
    const int t = int(u % 8), h = t / 4, s = t % 4;
    const uint8_t* b = row + (u / 8) * 210;
    const float d = ld_half(b + 208);
    const uint2 ql = ld_bytes8(b + 64 * h + 32 * (s & 1) + 8 * p);
    const uint2 qh = ld_bytes8(b + 128 + 32 * h + 8 * p);
    const int lo_shift = (s >> 1) * 4, hi_shift = 2 * s;
    const float dp = d * float(int8_t(b[192 + 2 * t + (p >> 1)]));  // values 0-15: scale 2t, 16-31: 2t + 1
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int v = int((byte_of(ql, i) >> lo_shift) & 15u) | int((byte_of(qh, i) >> hi_shift) & 3u) << 4;
      out[i] = dp * float(v - 32);
    }
  } else if constexpr (F == WFormat::MlxAffine) {
    // 8 values of `bits` bits start on a byte (32u + 8p values in): `bits` bytes, LSB first. The
    // group (32, 64 or 128 values) holds all 8.
    const int64_t c0 = 32 * u + 8 * p;
    const uint2 q = ld_bytes8(row + c0 * w.bits / 8);
    const uint64_t v = uint64_t(q.x) | uint64_t(q.y) << 32;
    const uint64_t mask = (uint64_t(1) << w.bits) - 1;
    const int64_t g = r * (w.cols / w.group_size) + c0 / w.group_size;
    const float sc = ld_scale(w.scales, w.scale_dtype, g), bi = ld_scale(w.biases, w.scale_dtype, g);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = sc * float(uint32_t((v >> (i * w.bits)) & mask)) + bi;
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = dequant_at(row, w, r, 32 * u + 8 * p + i);
  }
}

// d · x + c on bf16 pairs, one rounding (sm_80+).
__device__ inline uint32_t fma_bf16x2(uint32_t x, uint32_t d, uint32_t c) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(d), "r"(c));
  return r;
}

// Q4_K unit s of the super-block at b (16-byte aligned: Q4_K rows are whole 144-byte blocks) as
// bf16 pairs d·q - dmin·m, computed in bf16 arithmetic: one PRMT puts two quants in the mantissas
// of bf16 128 + q, one FMA takes 128 off (exact), one FMA applies the unit's scale and min
// (rounded to bf16) with one rounding: 2 instructions a value where f32 math and a rounding
// conversion took 4 (these kernels are bound by instruction issue). The quants are read as two
// 16-byte words.
__device__ inline void q4k_pairs(const uint8_t* b, int s, uint32_t* a) {
  const KUnit k = kquant_unit<false>(b, s);
  const uint32_t d2 = pack_bf16(k.d, k.d), m2 = pack_bf16(-k.dm, -k.dm);
  constexpr uint32_t kOne = 0x3F803F80u, kMinus128 = 0xC300C300u;  // bf16 pairs (1, 1), (-128, -128)
  const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (s / 2));
  const uint4 q0 = q[0], q1 = q[1];
  const uint32_t words[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
  const int shift = (s & 1) * 4;
#pragma unroll
  for (int i = 0; i < 8; ++i) {  // values 4i .. 4i+3: bytes of v, each below 16
    const uint32_t v = (words[i] >> shift) & 0x0F0F0F0Fu;
    const uint32_t p01 = __byte_perm(v, 0x43u, 0x4140), p23 = __byte_perm(v, 0x43u, 0x4342);  // 0x43qq: 128 + q
    a[2 * i] = fma_bf16x2(fma_bf16x2(p01, kOne, kMinus128), d2, m2);
    a[2 * i + 1] = fma_bf16x2(fma_bf16x2(p23, kOne, kMinus128), d2, m2);
  }
}

}  // namespace g4::cuda
