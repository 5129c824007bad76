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

// The bytes dequant8 decodes for one quarter unit, loaded by load8 with addresses that depend on
// no loaded value, so a kernel can issue a step's loads and decode them after the work that
// hides their latency (decode8). Rows past a matrix load as zeros, which decode to zeros.
struct Raw8 {
  uint2 q;     // the quarter's 8 code bytes (MLX: its 8 values' bits; other formats: the row pointer)
  uint2 h;     // Q5_K: the high-bit bytes; Q5_0: qh in h.x; other formats: r in h
  uint32_t a;  // the block's half scale(s): d (Q8_0, Q4_0, Q5_0, Q6_K), d | dmin << 16 (K quants);
               // MLX: the group's scale bits
  uint32_t b;  // K quants: scale bytes 4 + j%4, 8 + j%4, 12 + j%4 (unit j of the block);
               // Q6_K: the quarter's int8 scale; MLX: the group's bias bits
};

// A K-quant unit j's 6-bit scale and min from bytes y = q[j % 4], z = q[4 + j % 4],
// w = q[8 + j % 4] of the block's 12 scale bytes q (ggml get_scale_min_k4).
__host__ __device__ inline void k4_scale_min(int j, uint32_t y, uint32_t z, uint32_t w, int* sc, int* m) {
  if (j < 4) {
    *sc = int(y & 63);
    *m = int(z & 63);
  } else {
    *sc = int((w & 0xF) | ((y >> 6) << 4));
    *m = int((w >> 4) | ((z >> 6) << 4));
  }
}
__device__ inline float half_bits(uint32_t v) { return __half2float(__ushort_as_half(uint16_t(v & 0xFFFFu))); }

// Values 8p .. 8p + 7 (p < 4) of row r's 32-value unit u: a quarter of dequant32's unit, each
// value with dequant32's bits. Four threads decode a unit, each reading its quarter's bytes in
// one or two loads: adjacent threads read adjacent bytes (dequant32's one thread reads its unit
// byte by byte). The row's bytes come from `row`, as in dequant_at; MLX affine reads up to 8 - bits
// bytes past a row's last value (the slack after every uploaded weight). `valid` false: zeros.
template <WFormat F>
__device__ inline Raw8 load8(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u, int p, bool valid) {
  Raw8 x{make_uint2(0, 0), make_uint2(0, 0), 0u, 0u};
  if (!valid) return x;
  if constexpr (F == WFormat::GgufQ8_0) {
    const uint8_t* b = row + u * 34;
    x.a = *reinterpret_cast<const uint16_t*>(b);
    x.q = ld_bytes8(b + 2 + 8 * p);
  } else if constexpr (F == WFormat::GgufQ4_0 || F == WFormat::GgufQ5_0) {
    constexpr bool q5 = F == WFormat::GgufQ5_0;
    const uint8_t* b = row + u * (q5 ? 22 : 18);
    x.a = *reinterpret_cast<const uint16_t*>(b);
    x.q = ld_bytes8(b + (q5 ? 6 : 2) + 8 * (p & 1));
    if constexpr (q5) x.h.x = ld_u32(b + 2);
  } else if constexpr (F == WFormat::GgufQ4_K || F == WFormat::GgufQ5_K) {
    constexpr bool q5 = F == WFormat::GgufQ5_K;
    const int s = int(u % 8);
    const uint8_t* b = row + (u / 8) * (q5 ? 176 : 144);
    x.a = ld_u32(b);
    x.b = uint32_t(b[4 + s % 4]) | uint32_t(b[8 + s % 4]) << 8 | uint32_t(b[12 + s % 4]) << 16;
    x.q = ld_bytes8(b + (q5 ? 48 : 16) + 32 * (s / 2) + 8 * p);
    if constexpr (q5) x.h = ld_bytes8(b + 16 + 8 * p);
  } else if constexpr (F == WFormat::GgufQ6_K) {
    const int t = int(u % 8), h = t / 4, s = t % 4;
    const uint8_t* b = row + (u / 8) * 210;
    x.a = *reinterpret_cast<const uint16_t*>(b + 208);
    x.q = ld_bytes8(b + 64 * h + 32 * (s & 1) + 8 * p);
    x.h = ld_bytes8(b + 128 + 32 * h + 8 * p);
    x.b = b[192 + 2 * t + (p >> 1)];  // values 0-15: scale 2t, 16-31: 2t + 1
  } else if constexpr (F == WFormat::MlxAffine) {
    // 8 values of `bits` bits start on a byte (32u + 8p values in): `bits` bytes, LSB first. The
    // group (32, 64 or 128 values) holds all 8.
    const int64_t c0 = 32 * u + 8 * p;
    x.q = ld_bytes8(row + c0 * w.bits / 8);
    const int64_t g = r * (w.cols / w.group_size) + c0 / w.group_size;
    x.a = ld_scale_bits(w.scales, w.scale_dtype, g);
    x.b = ld_scale_bits(w.biases, w.scale_dtype, g);
  } else {
    const uint64_t ptr = reinterpret_cast<uint64_t>(row);
    x.q = make_uint2(uint32_t(ptr), uint32_t(ptr >> 32));
    x.h = make_uint2(uint32_t(uint64_t(r)), uint32_t(uint64_t(r) >> 32));
  }
  return x;
}
template <WFormat F>
__device__ inline void decode8(const Raw8& x, const DevWeight& w, int64_t u, int p, float* out) {
  if constexpr (F == WFormat::GgufQ8_0) {
    const float d = half_bits(x.a);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = d * float(int8_t(byte_of(x.q, i)));
  } else if constexpr (F == WFormat::GgufQ4_0 || F == WFormat::GgufQ5_0) {
    // Values j and j + 16 share byte j (low and high nibble); Q5_0's fifth bits are qh's bit j.
    constexpr bool q5 = F == WFormat::GgufQ5_0;
    const float d = half_bits(x.a);
    const int shift = (p >> 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int v = int((byte_of(x.q, i) >> shift) & 15u);
      if constexpr (q5) {
        v |= int((x.h.x >> (8 * p + i)) & 1u) << 4;
        out[i] = d * float(v - 16);
      } else {
        out[i] = d * float(v - 8);
      }
    }
  } else if constexpr (F == WFormat::GgufQ4_K || F == WFormat::GgufQ5_K) {
    constexpr bool q5 = F == WFormat::GgufQ5_K;
    const int s = int(u % 8);
    int sc, m;
    k4_scale_min(s, x.b & 0xFF, (x.b >> 8) & 0xFF, x.b >> 16, &sc, &m);
    const float d = half_bits(x.a) * float(sc), dm = half_bits(x.a >> 16) * float(m);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int v = int((byte_of(x.q, i) >> shift) & 15u);
      if constexpr (q5) v |= int((byte_of(x.h, i) >> s) & 1u) << 4;
      out[i] = d * float(v) - dm;
    }
  } else if constexpr (F == WFormat::GgufQ6_K) {
    const int s = int(u % 8) % 4;
    const int lo_shift = (s >> 1) * 4, hi_shift = 2 * s;
    const float dp = half_bits(x.a) * float(int8_t(x.b));
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int v = int((byte_of(x.q, i) >> lo_shift) & 15u) | int((byte_of(x.h, i) >> hi_shift) & 3u) << 4;
      out[i] = dp * float(v - 32);
    }
  } else if constexpr (F == WFormat::MlxAffine) {
    const uint64_t v = uint64_t(x.q.x) | uint64_t(x.q.y) << 32;
    const uint64_t mask = (uint64_t(1) << w.bits) - 1;
    const float sc = scale_from_bits(x.a, w.scale_dtype), bi = scale_from_bits(x.b, w.scale_dtype);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = sc * float(uint32_t((v >> (i * w.bits)) & mask)) + bi;
  } else {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(uint64_t(x.q.x) | uint64_t(x.q.y) << 32);
    const int64_t r = int64_t(uint64_t(x.h.x) | uint64_t(x.h.y) << 32);
#pragma unroll
    for (int i = 0; i < 8; ++i) out[i] = row ? dequant_at(row, w, r, 32 * u + 8 * p + i) : 0.f;
  }
}
template <WFormat F>
__device__ inline void dequant8(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u, int p, float* out) {
  decode8<F>(load8<F>(row, w, r, u, p, true), w, u, p, out);
}

// d · x + c on bf16 pairs, one rounding (sm_80+).
__device__ inline uint32_t fma_bf16x2(uint32_t x, uint32_t d, uint32_t c) {
  uint32_t r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(x), "r"(d), "r"(c));
  return r;
}

// Values 8p .. 8p + 7 of a Q8_0, Q5_0 or Q4_0 quarter (load8's bytes) as four bf16 pairs d·q in
// bf16 arithmetic, the scale d rounded to bf16 (q4k_pairs' contract): a PRMT puts two codes in the
// mantissas of bf16 128 + c, one FMA takes the offset off (exact: |q| <= 128), one multiplies by
// d (one rounding). Q8_0's sign bit becomes the offset's: c = q & 127 and 128 + 128·sign off.
template <WFormat F>
__device__ inline void quarter_pairs(const Raw8& x, int p, uint32_t* a) {
  const float d = half_bits(x.a);
  const uint32_t d2 = pack_bf16(d, d);
  constexpr uint32_t kOne = 0x3F803F80u;  // bf16 (1, 1)
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // values 4k .. 4k + 3 of the quarter: bytes of word w
    const uint32_t w = k ? x.q.y : x.q.x;
    uint32_t v;  // four codes below 128, a byte each
    if constexpr (F == WFormat::GgufQ8_0) {
      v = w & 0x7F7F7F7Fu;
    } else {
      v = (w >> ((p >> 1) * 4)) & 0x0F0F0F0Fu;
      if constexpr (F == WFormat::GgufQ5_0) {  // fifth bits: qh bits 8p + 4k .. +3 to bit 4 of each byte
        const uint32_t h4 = (x.h.x >> (8 * p + 4 * k)) & 0xFu;
        v |= ((h4 * 0x00204081u) & 0x01010101u) << 4;
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const uint32_t sel = j ? 0x4342u : 0x4140u;
      const uint32_t pair = __byte_perm(v, 0x43u, sel);  // 0x43cc: 128 + c
      uint32_t c;
      if constexpr (F == WFormat::GgufQ8_0) {
        c = (__byte_perm(w, 0u, sel) & 0x00800080u) | 0xC300C300u;  // -(128 + 128·sign)
      } else {
        c = F == WFormat::GgufQ5_0 ? 0xC310C310u : 0xC308C308u;  // -(128 + 16), -(128 + 8)
      }
      a[2 * k + j] = fma_bf16x2(fma_bf16x2(pair, kOne, c), d2, 0x80008000u);  // + (-0, -0): an exact product
    }
  }
}

// A Q4_K unit's bytes as 16-byte words: the super-block's header (d, dmin, 12 scale bytes) and
// the 32 quant bytes the unit's nibbles are in. load_q4k issues the loads (b 16-byte aligned:
// Q4_K rows are whole 144-byte blocks from an aligned start); q4k_pairs decodes them.
struct Q4kRaw {
  uint4 h, q0, q1;
};
__device__ inline Q4kRaw load_q4k(const uint8_t* b, int s) {
  const uint4* q = reinterpret_cast<const uint4*>(b + 16 + 32 * (s / 2));
  return Q4kRaw{*reinterpret_cast<const uint4*>(b), q[0], q[1]};
}

// Q4_K unit s as bf16 pairs d·q - dmin·m, computed in bf16 arithmetic: one PRMT puts two quants in
// the mantissas of bf16 128 + q, one FMA takes 128 off (exact), one FMA applies the unit's scale
// and min (rounded to bf16) with one rounding: 2 instructions a value where f32 math and a
// rounding conversion took 4 (these kernels are bound by instruction issue). All-zero bytes give
// zeros.
__device__ inline void q4k_pairs(const Q4kRaw& x, int s, uint32_t* a) {
  const int i = s % 4;
  int sc, m;
  k4_scale_min(s, (x.h.y >> (8 * i)) & 0xFF, (x.h.z >> (8 * i)) & 0xFF, (x.h.w >> (8 * i)) & 0xFF, &sc, &m);
  const float d = half_bits(x.h.x) * float(sc), dm = half_bits(x.h.x >> 16) * float(m);
  const uint32_t d2 = pack_bf16(d, d), m2 = pack_bf16(-dm, -dm);
  constexpr uint32_t kOne = 0x3F803F80u, kMinus128 = 0xC300C300u;  // bf16 pairs (1, 1), (-128, -128)
  const uint32_t words[8] = {x.q0.x, x.q0.y, x.q0.z, x.q0.w, x.q1.x, x.q1.y, x.q1.z, x.q1.w};
  const int shift = (s & 1) * 4;
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // values 4k .. 4k+3: bytes of v, each below 16
    const uint32_t v = (words[k] >> shift) & 0x0F0F0F0Fu;
    const uint32_t p01 = __byte_perm(v, 0x43u, 0x4140), p23 = __byte_perm(v, 0x43u, 0x4342);  // 0x43qq: 128 + q
    a[2 * k] = fma_bf16x2(fma_bf16x2(p01, kOne, kMinus128), d2, m2);
    a[2 * k + 1] = fma_bf16x2(fma_bf16x2(p23, kOne, kMinus128), d2, m2);
  }
}
__device__ inline void q4k_pairs(const uint8_t* b, int s, uint32_t* a) { q4k_pairs(load_q4k(b, s), s, a); }

}  // namespace g4::cuda
