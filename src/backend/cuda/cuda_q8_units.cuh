// One unit of a weight row per format, for the decode GEMVs on int8 activations (cuda_gemv_q8.cu):
// a lane's share of a row's dot is a run of units (64 values of a K-quant super-block, a 32-value
// block of the 32-value formats, 8 floats of bf16 / f16 / f32 rows).
//
// Each Unit<F, kBits> has kVals (values per unit) and two steps:
//   W load(row, w, r, u)       unit u of row r (bytes at `row`) loaded and unpacked: its codes as
//                              words ready for dp4a, its scales as numbers;
//   float dot(q, u, x)         the unit's share of the row's dot with the prepared row x (Q8Act).
// K-quant and MLX units also split load in two (UnitFetch, at the end): fetch(row, w, r, u) only
// issues the loads (a Raw), unpack(raw, w, u) does the arithmetic; load is unpack(fetch(..)).
// A multi-row GEMV loads a unit once and dots it with each of its rows; unit_dot does both for
// one row. dot(load(...)) is the same arithmetic for any number of rows (batch-invariant decode
// rests on it: the CUDA row-exact op tests check it bit for bit).
// load<Mem::Shared> reads the row's bytes from a copy in shared memory (a GEMV that stages its
// block's rows there, cuda_stage_rows.cuh); the copy keeps each byte's address modulo 16.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kquant_dot.cuh"
#include "backend/cuda/cuda_q8.cuh"

namespace g4::cuda::q8units {

// ---- loads --------------------------------------------------------------------------------------

// Where a unit's row bytes are read from: global memory through the read-only cache, or a copy in
// shared memory (plain loads: the pointer derives from the kernel's shared array).
enum class Mem { Global, Shared };
template <Mem S, class T>
__device__ __forceinline__ T ld_row(const T* p) {
  if constexpr (S == Mem::Global) return __ldg(p);
  else return *p;
}

// kWords little-endian words of the 4 kWords bytes at p (p 2-byte aligned: Q6_K, Q8_0, Q4_0 and
// Q5_0 blocks), from kWords + 1 aligned words and funnel shifts. Reads up to 4 bytes past them
// (within the block, or the upload's slack). In two steps for a lane that fetches ahead:
// ld_a2_raw loads the aligned words and returns the shift, a2_words shifts them.
template <int kWords, Mem S = Mem::Global>
__device__ __forceinline__ uint32_t ld_a2_raw(const uint8_t* p, uint32_t* v) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  const uint32_t* base = reinterpret_cast<const uint32_t*>(a & ~uintptr_t(3));
#pragma unroll
  for (int k = 0; k <= kWords; ++k) v[k] = ld_row<S>(base + k);
  return uint32_t(a & 3) * 8;
}
template <int kWords>
__device__ __forceinline__ void a2_words(const uint32_t* v, uint32_t sh, uint32_t* w) {
#pragma unroll
  for (int k = 0; k < kWords; ++k) w[k] = __funnelshift_r(v[k], v[k + 1], sh);
}
template <int kWords, Mem S = Mem::Global>
__device__ __forceinline__ void ld_a2(const uint8_t* p, uint32_t* w) {
  uint32_t v[kWords + 1];
  a2_words<kWords>(v, ld_a2_raw<kWords, S>(p, v), w);
}
template <Mem S = Mem::Global>
__device__ __forceinline__ void ld_words16(const uint8_t* p, uint32_t* w) {  // p 16-byte aligned
  const uint4 v = ld_row<S>(reinterpret_cast<const uint4*>(p));
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
}
// The 32 int8 activations of block b as eight words.
__device__ __forceinline__ void ld_x32(const Q8Act& x, int64_t b, uint32_t* w) {
  ld_words16(reinterpret_cast<const uint8_t*>(x.q + 32 * b), w);
  ld_words16(reinterpret_cast<const uint8_t*>(x.q + 32 * b + 16), w + 4);
}
// Bit i of the low 4 bits of t moved to bit 0 of byte i.
__device__ __forceinline__ uint32_t spread4(uint32_t t) { return ((t & 15u) * 0x00204081u) & 0x01010101u; }

// ---- one unit of a row, per format ---------------------------------------------------------------

template <WFormat F, int kBits>
struct Unit;

// Q4_K / Q5_K: unit j (0..3) of a super-block is its sub-block pair 2j, 2j + 1 (64 values).
template <WFormat F>
struct KQuantUnit {
  static constexpr int kVals = 64;
  static constexpr bool q5 = F == WFormat::GgufQ5_K;
  static constexpr int kBlockBytes = q5 ? 176 : 144;
  struct Scales {  // of sub-blocks 2j and 2j + 1
    int sc0, m0, sc1, m1;
    float d, dmin;
  };
  struct W {
    uint32_t lo[8], hi[8];  // codes of sub-blocks 2j and 2j + 1, a byte each
    Scales k;
  };
  // The unit's bytes as loaded: the super-block's header (d, dmin | scales, mins), the codes of
  // sub-blocks 2j, 2j + 1 (and Q5_K's high bits).
  struct Raw {
    uint4 h;
    uint32_t c[8], qh[q5 ? 8 : 1];
  };
  __device__ static Scales scales_of(const uint4& h, int64_t u) {
    const int j = int(u & 3);
    Scales k;
    scale_min_k4_words(2 * j, h.y, h.z, h.w, &k.sc0, &k.m0);
    scale_min_k4_words(2 * j + 1, h.y, h.z, h.w, &k.sc1, &k.m1);
    k.d = __half2float(__ushort_as_half(uint16_t(h.x)));
    k.dmin = __half2float(__ushort_as_half(uint16_t(h.x >> 16)));
    return k;
  }
  template <Mem S = Mem::Global>
  __device__ static Scales load_scales(const uint8_t* row, int64_t u) {
    return scales_of(ld_row<S>(reinterpret_cast<const uint4*>(row + (u >> 2) * kBlockBytes)), u);
  }
  template <Mem S = Mem::Global>
  __device__ static Raw fetch(const uint8_t* row, const DevWeight&, int64_t, int64_t u) {
    const int j = int(u & 3);
    const uint8_t* b = row + (u >> 2) * kBlockBytes;
    Raw q;
    ld_words16<S>(b + (q5 ? 48 : 16) + 32 * j, q.c);
    ld_words16<S>(b + (q5 ? 48 : 16) + 32 * j + 16, q.c + 4);
    if constexpr (q5) {
      ld_words16<S>(b + 16, q.qh);
      ld_words16<S>(b + 32, q.qh + 4);
    }
    q.h = ld_row<S>(reinterpret_cast<const uint4*>(b));
    return q;
  }
  __device__ static W unpack(const Raw& raw, const DevWeight&, int64_t u) {
    const int j = int(u & 3);
    W q;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      q.lo[k] = raw.c[k] & 0x0F0F0F0Fu;
      q.hi[k] = (raw.c[k] >> 4) & 0x0F0F0F0Fu;
      if constexpr (q5) {
        q.lo[k] |= ((raw.qh[k] >> (2 * j)) & 0x01010101u) << 4;
        q.hi[k] |= ((raw.qh[k] >> (2 * j + 1)) & 0x01010101u) << 4;
      }
    }
    q.k = scales_of(raw.h, u);
    return q;
  }
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u) {
    return unpack(fetch<S>(row, w, r, u), w, u);
  }
  // The unit's share from the integer sums s0, s1 of its sub-blocks' codes times x's int8 codes.
  // Every operation rounds as written (no contraction): the int8 MMA GEMV (cuda_gemv_mma.cu) gets
  // the same sums from the tensor cores and must get the same float.
  __device__ static float combine(const Scales& k, int64_t u, const Q8Act& x, int s0, int s1) {
    const int64_t xb0 = (u >> 2) * 8 + 2 * int(u & 3);
    const float a = __fmul_rn(__fmul_rn(float(k.sc0), x.d[xb0]), float(s0));
    const float b = __fmul_rn(__fmul_rn(float(k.sc1), x.d[xb0 + 1]), float(s1));
    const float mins = __fadd_rn(__fmul_rn(float(k.m0), x.s[xb0]), __fmul_rn(float(k.m1), x.s[xb0 + 1]));
    return __fsub_rn(__fmul_rn(k.d, __fadd_rn(a, b)), __fmul_rn(k.dmin, mins));
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) {
    const int64_t xb0 = (u >> 2) * 8 + 2 * int(u & 3);
    uint32_t xa[8], xb[8];
    ld_x32(x, xb0, xa);
    ld_x32(x, xb0 + 1, xb);
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      s0 = dp4a_us(q.lo[k], xa[k], s0);
      s1 = dp4a_us(q.hi[k], xb[k], s1);
    }
    return combine(q.k, u, x, s0, s1);
  }
};
template <int B>
struct Unit<WFormat::GgufQ4_K, B> : KQuantUnit<WFormat::GgufQ4_K> {};
template <int B>
struct Unit<WFormat::GgufQ5_K, B> : KQuantUnit<WFormat::GgufQ5_K> {};

// Q6_K (210 bytes, 2-byte aligned): unit (h, t) = u & 3 covers ql[64h + 32t ..+32] (low nibbles:
// values 128h + 32t + l, high nibbles: 128h + 64 + 32t + l) with the 2-bit highs of qh[32h ..+32]
// (bits 2t and 2t + 4); int8 scales per 16 values; codes are q - 32.
template <int B>
struct Unit<WFormat::GgufQ6_K, B> {
  static constexpr int kVals = 64;
  struct Scales {
    int sc[4];  // of values 0-15 and 16-31 of each half (va, vb)
    float d;
  };
  struct W {
    uint32_t va[8], vb[8];  // codes q (0..63) of the unit's two 32-value halves
    Scales k;
  };
  // x's 32-value blocks of the unit's halves.
  __device__ static int64_t x_block_a(int64_t u) { return (u >> 2) * 8 + 4 * (int(u >> 1) & 1) + int(u & 1); }
  // The unit's bytes as loaded: ql and qh as aligned words (ld_a2_raw; both start at the same
  // address modulo 4, so one shift serves them), its four scales and d.
  struct Raw {
    uint32_t ql[9], qh[9], sh;
    Scales k;
  };
  template <Mem S = Mem::Global>
  __device__ static Scales load_scales(const uint8_t* row, int64_t u) {
    const int h = int(u >> 1) & 1, t = int(u & 1);
    const uint8_t* b = row + (u >> 2) * 210;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h + 2 * t);
    Scales k;
    k.sc[0] = sc[0], k.sc[1] = sc[1], k.sc[2] = sc[4], k.sc[3] = sc[5];
    k.d = ld_half(b + 208);
    return k;
  }
  template <Mem S = Mem::Global>
  __device__ static Raw fetch(const uint8_t* row, const DevWeight&, int64_t, int64_t u) {
    const int h = int(u >> 1) & 1, t = int(u & 1);
    const uint8_t* b = row + (u >> 2) * 210;
    Raw q;
    q.sh = ld_a2_raw<8, S>(b + 64 * h + 32 * t, q.ql);
    ld_a2_raw<8, S>(b + 128 + 32 * h, q.qh);
    q.k = load_scales<S>(row, u);
    return q;
  }
  __device__ static W unpack(const Raw& raw, const DevWeight&, int64_t u) {
    const int t = int(u & 1);
    uint32_t ql[8], qh[8];
    a2_words<8>(raw.ql, raw.sh, ql);
    a2_words<8>(raw.qh, raw.sh, qh);
    W q;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      q.va[k] = (ql[k] & 0x0F0F0F0Fu) | (((qh[k] >> (2 * t)) & 0x03030303u) << 4);
      q.vb[k] = ((ql[k] >> 4) & 0x0F0F0F0Fu) | (((qh[k] >> (2 * t + 4)) & 0x03030303u) << 4);
    }
    q.k = raw.k;
    return q;
  }
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u) {
    return unpack(fetch<S>(row, w, r, u), w, u);
  }
  // The unit's share from i[g] = Σ (q - 32) · q_x over its four 16-value groups (va 0-15, va
  // 16-31, vb 0-15, vb 16-31). Rounded as written, as KQuantUnit::combine.
  __device__ static float combine(const Scales& k, int64_t u, const Q8Act& x, const int* i) {
    const int64_t xba = x_block_a(u), xbb = xba + 2;
    const float ia = __fadd_rn(__fmul_rn(float(k.sc[0]), float(i[0])), __fmul_rn(float(k.sc[1]), float(i[1])));
    const float ib = __fadd_rn(__fmul_rn(float(k.sc[2]), float(i[2])), __fmul_rn(float(k.sc[3]), float(i[3])));
    return __fmul_rn(k.d, __fadd_rn(__fmul_rn(x.d[xba], ia), __fmul_rn(x.d[xbb], ib)));
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) {
    const int64_t xba = x_block_a(u), xbb = xba + 2;
    uint32_t xa[8], xb[8];
    ld_x32(x, xba, xa);
    ld_x32(x, xbb, xb);
    int sa[2] = {0, 0}, sb2[2] = {0, 0}, xsa[2] = {0, 0}, xsb[2] = {0, 0};
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      sa[k >> 2] = dp4a_us(q.va[k], xa[k], sa[k >> 2]);
      sb2[k >> 2] = dp4a_us(q.vb[k], xb[k], sb2[k >> 2]);
      xsa[k >> 2] = dp4a_ss(0x01010101u, xa[k], xsa[k >> 2]);
      xsb[k >> 2] = dp4a_ss(0x01010101u, xb[k], xsb[k >> 2]);
    }
    const int i[4] = {sa[0] - 32 * xsa[0], sa[1] - 32 * xsa[1], sb2[0] - 32 * xsb[0], sb2[1] - 32 * xsb[1]};
    return combine(q.k, u, x, i);
  }
};

// Q8_0 (34 bytes: f16 d, 32 int8), Q4_0 (18: d, 16 bytes of nibbles, q - 8), Q5_0 (22: d, 32 high
// bits, 16 bytes of nibbles, q - 16): one block per unit, its codes as eight words.
struct Words8 {
  uint32_t q[8];
  float d;
};
template <int B>
struct Unit<WFormat::GgufQ8_0, B> {
  static constexpr int kVals = 32;
  using W = Words8;
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight&, int64_t, int64_t u) {
    const uint8_t* b = row + u * 34;
    W q;
    ld_a2<8, S>(b + 2, q.q);
    q.d = ld_half(b);
    return q;
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) {
    uint32_t xw[8];
    ld_x32(x, u, xw);
    int s = 0;
#pragma unroll
    for (int k = 0; k < 8; ++k) s = dp4a_ss(q.q[k], xw[k], s);
    return q.d * x.d[u] * float(s);
  }
};
// Q4_0 / Q5_0: codes 0..15 / 0..31 in q[0..3] (values 0..15 of the block) and q[4..7] (16..31),
// offset by kZero.
template <int kZero>
__device__ __forceinline__ float offset_codes_dot(const Words8& q, int64_t u, const Q8Act& x) {
  uint32_t xw[8];
  ld_x32(x, u, xw);
  int s = 0, sx = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    s = dp4a_us(q.q[k], xw[k], s);
    s = dp4a_us(q.q[k + 4], xw[k + 4], s);
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) sx = dp4a_ss(0x01010101u, xw[k], sx);
  return q.d * x.d[u] * float(s - kZero * sx);
}
template <int B>
struct Unit<WFormat::GgufQ4_0, B> {
  static constexpr int kVals = 32;
  using W = Words8;
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight&, int64_t, int64_t u) {
    const uint8_t* b = row + u * 18;
    uint32_t c[4];
    ld_a2<4, S>(b + 2, c);
    W q;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q.q[k] = c[k] & 0x0F0F0F0Fu;
      q.q[k + 4] = (c[k] >> 4) & 0x0F0F0F0Fu;
    }
    q.d = ld_half(b);
    return q;
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) { return offset_codes_dot<8>(q, u, x); }
};
template <int B>
struct Unit<WFormat::GgufQ5_0, B> {
  static constexpr int kVals = 32;
  using W = Words8;
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight&, int64_t, int64_t u) {
    const uint8_t* b = row + u * 22;
    uint32_t c[4];
    ld_a2<4, S>(b + 6, c);
    const uint32_t qh = uint32_t(reinterpret_cast<const uint16_t*>(b + 2)[0]) |
                        (uint32_t(reinterpret_cast<const uint16_t*>(b + 2)[1]) << 16);
    W q;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q.q[k] = (c[k] & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4);
      q.q[k + 4] = ((c[k] >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * k)) << 4);
    }
    q.d = ld_half(b);
    return q;
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) { return offset_codes_dot<16>(q, u, x); }
};

// MLX affine, kBits per value: a unit is 32 values (4 kBits bytes, word aligned), inside one group
// (group sizes are powers of two from 32); w = scale · q + bias, so the unit adds
// scale · d · Σ q q_x + bias · s.
template <int kBits>
struct MlxUnit {
  static constexpr int kVals = 32;
  struct W {
    uint32_t q[8];  // 4 bits: word 2k holds values 8k, 8k + 2, ..; 2k + 1 values 8k + 1, 8k + 3, ..
                    // (the activations are permuted to match); other widths: values in order
    float scale, bias;
  };
  // The unit's bytes as loaded: its 4 kBits code bytes as words, its group's scale and bias as
  // stored (ld_scale_bits).
  static constexpr int kWords = kBits;
  struct Raw {
    uint32_t c[kWords];
    uint32_t scale, bias;
  };
  template <Mem S = Mem::Global>
  __device__ static Raw fetch(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u) {
    Raw q;
    if constexpr (kBits == 4) {
      ld_words16<S>(row + 16 * u, q.c);
    } else if constexpr (kBits == 8) {
      ld_words16<S>(row + 32 * u, q.c);
      ld_words16<S>(row + 32 * u + 16, q.c + 4);
    } else {
      const uint32_t* p = reinterpret_cast<const uint32_t*>(row + 4 * kBits * u);
#pragma unroll
      for (int k = 0; k < kBits; ++k) q.c[k] = ld_row<S>(p + k);
    }
    // Group of unit u in row r, by shifts (group sizes are powers of two, q8_gemv_supports): a
    // 64-bit division here cost more than the unit's dots.
    const int ushift = __ffs(w.group_size) - 6;  // log2(units per group)
    const int64_t g = r * (w.cols >> (ushift + 5)) + (u >> ushift);
    q.scale = ld_scale_bits(w.scales, w.scale_dtype, g);
    q.bias = ld_scale_bits(w.biases, w.scale_dtype, g);
    return q;
  }
  __device__ static W unpack(const Raw& raw, const DevWeight& w, int64_t) {
    W q;
    if constexpr (kBits == 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // word k: values 8k .. 8k + 7, low nibble first
        q.q[2 * k] = raw.c[k] & 0x0F0F0F0Fu;
        q.q[2 * k + 1] = (raw.c[k] >> 4) & 0x0F0F0F0Fu;
      }
    } else if constexpr (kBits == 8) {
#pragma unroll
      for (int k = 0; k < 8; ++k) q.q[k] = raw.c[k];
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) q.q[k] = 0;
#pragma unroll
      for (int i = 0; i < 32; ++i) {  // value i: stream bits [i kBits, (i + 1) kBits)
        const int bit = i * kBits, wi = bit >> 5, sh = bit & 31;
        uint32_t v = raw.c[wi] >> sh;
        if (sh + kBits > 32) v |= raw.c[wi + 1] << (32 - sh);
        q.q[i >> 2] |= (v & ((1u << kBits) - 1u)) << (8 * (i & 3));
      }
    }
    q.scale = scale_from_bits(raw.scale, w.scale_dtype);
    q.bias = scale_from_bits(raw.bias, w.scale_dtype);
    return q;
  }
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u) {
    return unpack(fetch<S>(row, w, r, u), w, u);
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) {
    uint32_t xw[8];
    ld_x32(x, u, xw);
    int s = 0;
    if constexpr (kBits == 4) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const uint32_t xe = __byte_perm(xw[2 * k], xw[2 * k + 1], 0x6420), xo = __byte_perm(xw[2 * k], xw[2 * k + 1], 0x7531);
        s = dp4a_us(q.q[2 * k], xe, s);
        s = dp4a_us(q.q[2 * k + 1], xo, s);
      }
    } else {
#pragma unroll
      for (int k = 0; k < 8; ++k) s = dp4a_us(q.q[k], xw[k], s);
    }
    return q.scale * x.d[u] * float(s) + q.bias * x.s[u];
  }
};
template <int B>
struct Unit<WFormat::MlxAffine, B> : MlxUnit<B> {};

// bf16 / f16 / f32 weights: 8 values per unit against the f32 row xf.
template <WFormat F>
struct FloatUnit {
  static constexpr int kVals = 8;
  struct W {
    float v[8];
  };
  template <Mem S = Mem::Global>
  __device__ static W load(const uint8_t* row, const DevWeight&, int64_t, int64_t u) {
    W q;
    float* wv = q.v;
    if constexpr (F == WFormat::F32) {
      const float4 a = ld_row<S>(reinterpret_cast<const float4*>(row) + 2 * u);
      const float4 b = ld_row<S>(reinterpret_cast<const float4*>(row) + 2 * u + 1);
      wv[0] = a.x, wv[1] = a.y, wv[2] = a.z, wv[3] = a.w, wv[4] = b.x, wv[5] = b.y, wv[6] = b.z, wv[7] = b.w;
    } else {
      const uint4 c = ld_row<S>(reinterpret_cast<const uint4*>(row) + u);
      const uint32_t qw[4] = {c.x, c.y, c.z, c.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if constexpr (F == WFormat::BF16) {
          wv[2 * k] = __uint_as_float(qw[k] << 16);
          wv[2 * k + 1] = __uint_as_float(qw[k] & 0xffff0000u);
        } else {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&qw[k]));
          wv[2 * k] = f.x;
          wv[2 * k + 1] = f.y;
        }
      }
    }
    return q;
  }
  __device__ static float dot(const W& q, int64_t u, const Q8Act& x) {
    const float4 x0 = __ldg(reinterpret_cast<const float4*>(x.xf + 8 * u));
    const float4 x1 = __ldg(reinterpret_cast<const float4*>(x.xf + 8 * u + 4));
    const float* wv = q.v;
    return x0.x * wv[0] + x0.y * wv[1] + x0.z * wv[2] + x0.w * wv[3] + x1.x * wv[4] + x1.y * wv[5] + x1.z * wv[6] +
           x1.w * wv[7];
  }
};
template <int B>
struct Unit<WFormat::BF16, B> : FloatUnit<WFormat::BF16> {};
template <int B>
struct Unit<WFormat::F16, B> : FloatUnit<WFormat::F16> {};
template <int B>
struct Unit<WFormat::F32, B> : FloatUnit<WFormat::F32> {};

// A unit's loads apart from its arithmetic, so that a lane can ask for its next unit's bytes
// before it dots the current one (q8_gemv_kernel's kAhead): fetch issues the loads into a Raw
// (nothing computed from the loaded values), unpack turns it into W; unpack(fetch(..)) is load.
// Units with a Raw type say how (K-quants, MLX affine); the others fetch by load, unpacking
// included.
template <class U, class = void>
struct UnitFetch {
  using Raw = typename U::W;
  template <Mem S>
  __device__ static Raw fetch(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u) {
    return U::template load<S>(row, w, r, u);
  }
  __device__ static const typename U::W& unpack(const Raw& q, const DevWeight&, int64_t) { return q; }
};
template <class U>
struct UnitFetch<U, std::void_t<typename U::Raw>> {
  using Raw = typename U::Raw;
  template <Mem S>
  __device__ static Raw fetch(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u) {
    return U::template fetch<S>(row, w, r, u);
  }
  __device__ static typename U::W unpack(const Raw& q, const DevWeight& w, int64_t u) { return U::unpack(q, w, u); }
};

// Unit u of row r dotted with the prepared row x: both steps for one row.
template <class U>
__device__ __forceinline__ float unit_dot(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u, const Q8Act& x) {
  return U::dot(U::load(row, w, r, u), u, x);
}

}  // namespace g4::cuda::q8units
