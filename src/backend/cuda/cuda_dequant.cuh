// Device-side dequantization of one matrix element, for every weight format the loader produces
// (the same block math as quant/gguf_dequant.cpp and quant/weight.cpp, written per element: the
// simple kernels of the CUDA backend read weights this way; fast kernels come later and are
// tested against these).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "quant/weight.h"

namespace g4::cuda {

// The fields of a WeightView a kernel needs, by value (pointers are device memory). Its bytes
// are part of a step's key (cuda_step.h): the fields are ordered so that it has no padding, and
// the reserved bytes are zero (cuda_launch_structs_check.cu checks).
struct DevWeight {
  int64_t rows, cols, row_bytes;
  const uint8_t* data;
  const void* scales;
  const void* biases;
  int bits, group_size;
  WFormat fmt;
  DType scale_dtype;
  uint8_t reserved[6] = {};
};

// Calls f(std::integral_constant<WFormat, F>{}) with F = fmt: a runtime format to the kernels'
// format template argument (host side, once per launch).
template <class Fn>
inline void with_format(WFormat fmt, Fn&& f) {
  switch (fmt) {
    case WFormat::F32: return f(std::integral_constant<WFormat, WFormat::F32>{});
    case WFormat::F16: return f(std::integral_constant<WFormat, WFormat::F16>{});
    case WFormat::BF16: return f(std::integral_constant<WFormat, WFormat::BF16>{});
    case WFormat::MlxAffine: return f(std::integral_constant<WFormat, WFormat::MlxAffine>{});
    case WFormat::GgufQ4_0: return f(std::integral_constant<WFormat, WFormat::GgufQ4_0>{});
    case WFormat::GgufQ5_0: return f(std::integral_constant<WFormat, WFormat::GgufQ5_0>{});
    case WFormat::GgufQ8_0: return f(std::integral_constant<WFormat, WFormat::GgufQ8_0>{});
    case WFormat::GgufQ4_K: return f(std::integral_constant<WFormat, WFormat::GgufQ4_K>{});
    case WFormat::GgufQ5_K: return f(std::integral_constant<WFormat, WFormat::GgufQ5_K>{});
    case WFormat::GgufQ6_K: return f(std::integral_constant<WFormat, WFormat::GgufQ6_K>{});
  }
}

// Block fields sit at any byte offset (Q5_0 blocks are 22 bytes): read them byte by byte.
__host__ __device__ inline float ld_half(const uint8_t* p) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(p[0] | (p[1] << 8))));
}
__host__ __device__ inline uint32_t ld_u32(const uint8_t* p) {
  return uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24);
}

// Scale i of an f32, f16 or bf16 array, in two steps for a caller that loads ahead: its bits as
// loaded (ld_scale_bits), then the float they encode (scale_from_bits).
__host__ __device__ inline uint32_t ld_scale_bits(const void* base, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const uint32_t*>(base)[i];
  return static_cast<const uint16_t*>(base)[i];
}
__host__ __device__ inline float scale_from_bits(uint32_t bits, DType t) {
  if (t == DType::F16) return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
  if (t != DType::F32) bits <<= 16;  // bf16: the high half of an f32
  float f;
  memcpy(&f, &bits, 4);
  return f;
}
__host__ __device__ inline float ld_scale(const void* base, DType t, int64_t i) {
  return scale_from_bits(ld_scale_bits(base, t, i), t);
}

// ggml get_scale_min_k4.
__host__ __device__ inline void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// A Q4_K / Q5_K unit: its super-block b and the unit's scale and min, value = d · q - dm (ggml's
// get_scale_min_k4 applied to the block's d and dmin). Unit u of the row at `row`.
struct KUnit {
  const uint8_t* b;
  float d, dm;
};
template <bool kQ5>
__host__ __device__ inline KUnit kquant_unit(const uint8_t* row, int64_t u) {
  const int s = int(u % 8);
  const uint8_t* b = row + (u / 8) * (kQ5 ? 176 : 144);
  int sc, m;
  scale_min_k4(s, b + 4, &sc, &m);
  return KUnit{b, ld_half(b) * float(sc), ld_half(b + 2) * float(m)};
}

// Element (r, c) of w as f32, its row's bytes read from `row` (w.data + r * w.row_bytes, or a
// copy of them; r itself only indexes MLX scales and biases).
__host__ __device__ inline float dequant_at(const uint8_t* row, const DevWeight& w, int64_t r, int64_t c) {
  switch (w.fmt) {
    case WFormat::F32: return reinterpret_cast<const float*>(row)[c];
    case WFormat::F16: return __half2float(reinterpret_cast<const __half*>(row)[c]);
    case WFormat::BF16: return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[c]);
    case WFormat::MlxAffine: {
      // Element c occupies stream bits [c*b, (c+1)*b) of the row's uint32 words (spec §3.4).
      const uint32_t* words = reinterpret_cast<const uint32_t*>(row);
      const int64_t bit = c * w.bits;
      const int64_t wi = bit >> 5;
      const int sh = int(bit & 31);
      uint64_t v = words[wi] >> sh;
      if (sh + w.bits > 32) v |= uint64_t(words[wi + 1]) << (32 - sh);
      const float q = float(uint32_t(v) & ((1u << w.bits) - 1u));
      const int64_t g = r * (w.cols / w.group_size) + c / w.group_size;
      return ld_scale(w.scales, w.scale_dtype, g) * q + ld_scale(w.biases, w.scale_dtype, g);
    }
    case WFormat::GgufQ4_0: {
      const uint8_t* b = row + (c / 32) * 18;
      const int j = int(c % 32);
      const int q = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
      return ld_half(b) * float(q - 8);
    }
    case WFormat::GgufQ5_0: {
      const uint8_t* b = row + (c / 32) * 22;
      const int j = int(c % 32);
      const uint32_t qh = ld_u32(b + 2);
      const int lo = j < 16 ? (b[6 + j] & 15) : (b[6 + j - 16] >> 4);
      const int q = lo | int((qh >> j) & 1u) << 4;  // int: q - 16 is negative for half the codes
      return ld_half(b) * float(q - 16);
    }
    case WFormat::GgufQ8_0: {
      const uint8_t* b = row + (c / 32) * 34;
      return ld_half(b) * float(int8_t(b[2 + c % 32]));
    }
    case WFormat::GgufQ4_K:
    case WFormat::GgufQ5_K: {
      const bool q5 = w.fmt == WFormat::GgufQ5_K;
      const uint8_t* b = row + (c / 256) * (q5 ? 176 : 144);
      const int j = int(c % 256), s = j / 32, l = j % 32;
      int sc, m;
      scale_min_k4(s, b + 4, &sc, &m);
      const uint8_t byte = b[(q5 ? 48 : 16) + 32 * (s / 2) + l];
      int q = (s & 1) ? (byte >> 4) : (byte & 15);
      if (q5) q |= ((b[16 + l] >> s) & 1) << 4;
      return ld_half(b) * float(sc) * float(q) - ld_half(b + 2) * float(m);
    }
    case WFormat::GgufQ6_K: {
      const uint8_t* b = row + (c / 256) * 210;
      const int j = int(c % 256), h = j / 128, jj = j % 128, s = jj / 32, l = jj % 32;
      const uint8_t lb = b[64 * h + 32 * (s & 1) + l];
      const int lo = (s >> 1) ? (lb >> 4) : (lb & 15);
      const int hi = (b[128 + 32 * h + l] >> (2 * s)) & 3;
      const int8_t sc = int8_t(b[192 + j / 16]);
      return ld_half(b + 208) * float(sc) * float((lo | (hi << 4)) - 32);
    }
    default: return 0.f;
  }
}
__host__ __device__ inline float dequant(const DevWeight& w, int64_t r, int64_t c) {
  return dequant_at(w.data + r * w.row_bytes, w, r, c);
}

// The 32 values 32u..32u+31 of row r (u: a 32-value unit; every format's blocks and sub-blocks
// are whole units), each equal to dequant(w, r, 32u + j); block headers are read once per unit.
// The format is a template argument (w.fmt == F), so `out` stays in registers when the caller
// indexes it with constants. The row's bytes come from `row`, as in dequant_at.
template <WFormat F>
__device__ inline void dequant32(const uint8_t* row, const DevWeight& w, int64_t r, int64_t u, float* out) {
  if constexpr (F == WFormat::GgufQ8_0) {
    const uint8_t* b = row + u * 34;
    const float d = ld_half(b);
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = d * float(int8_t(b[2 + j]));
  } else if constexpr (F == WFormat::GgufQ4_0) {
    const uint8_t* b = row + u * 18;
    const float d = ld_half(b);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      out[j] = d * float((b[2 + j] & 15) - 8);
      out[j + 16] = d * float((b[2 + j] >> 4) - 8);
    }
  } else if constexpr (F == WFormat::GgufQ5_0) {
    const uint8_t* b = row + u * 22;
    const float d = ld_half(b);
    const uint32_t qh = ld_u32(b + 2);
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      out[j] = d * float(((b[6 + j] & 15) | int((qh >> j) & 1u) << 4) - 16);
      out[j + 16] = d * float(((b[6 + j] >> 4) | int((qh >> (j + 16)) & 1u) << 4) - 16);
    }
  } else if constexpr (F == WFormat::GgufQ4_K || F == WFormat::GgufQ5_K) {
    constexpr bool q5 = F == WFormat::GgufQ5_K;
    const int s = int(u % 8);
    const KUnit k = kquant_unit<q5>(row, u);
    const uint8_t* qs = k.b + (q5 ? 48 : 16) + 32 * (s / 2);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> shift) & 15;
      if constexpr (q5) q |= ((k.b[16 + l] >> s) & 1) << 4;
      out[l] = k.d * float(q) - k.dm;
    }
  } else if constexpr (F == WFormat::GgufQ6_K) {
    const int t = int(u % 8), h = t / 4, s = t % 4;
    const uint8_t* b = row + (u / 8) * 210;
    const float d = ld_half(b + 208);
    const uint8_t* ql = b + 64 * h + 32 * (s & 1);
    const uint8_t* qh = b + 128 + 32 * h;
    const int lo_shift = (s >> 1) * 4, hi_shift = 2 * s;
    const float d0 = d * float(int8_t(b[192 + 2 * t])), d1 = d * float(int8_t(b[192 + 2 * t + 1]));
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int q = ((ql[l] >> lo_shift) & 15) | (((qh[l] >> hi_shift) & 3) << 4);
      out[l] = (l < 16 ? d0 : d1) * float(q - 32);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j) out[j] = dequant_at(row, w, r, 32 * u + j);
  }
}

}  // namespace g4::cuda
