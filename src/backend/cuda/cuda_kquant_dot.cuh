// One weight row of a K-quant format (Q4_K, Q6_K) dotted with one activation row (f32 or bf16) by a whole
// warp, reading the row's bytes straight from global memory in coalesced 128-byte warp loads: the
// decode (M = 1) path of the matmul kernels for the formats Q4_K_M files are made of.
//
// Lane layout per 256-value super-block (8 values per lane):
//   Q4_K (144 bytes: d, dmin, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles): lane L reads
//     the 4 code bytes qs[32p + l0 .. +3] (p = L / 8, l0 = 4 (L % 8)); their low nibbles are
//     values l0..l0+3 of sub-block 2p, their high nibbles the same values of sub-block 2p + 1.
//   Q6_K (210 bytes: ql[128], qh[64], int8 scales[16], d): lane L (h = L / 16, t = (L / 8) % 2,
//     l0 = 4 (L % 8)) reads ql[64h + 32t + l0 ..] and qh[32h + l0 ..]: values l0..l0+3 of the
//     32-value groups s = t (low nibbles, qh bits 2t) and s = t + 2 (high nibbles, bits 2t + 4) of
//     half h. Super-blocks are 2-byte aligned only (210 bytes), so codes are read as 16-bit halves.
// Each value equals dequant_at's (cuda_dequant.cuh); the products are summed in another order.
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"

namespace g4::cuda {

template <WFormat F>
constexpr bool kKquantDot = F == WFormat::GgufQ4_K || F == WFormat::GgufQ6_K;

__device__ inline float dot4(float4 x, float a, float b, float c, float d) {
  return x.x * a + x.y * b + x.z * c + x.w * d;
}
__device__ inline uint32_t ld_u32_2aligned(const uint8_t* p) {
  const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
  return uint32_t(h[0]) | (uint32_t(h[1]) << 16);
}

// get_scale_min_k4 for sub-block j of a Q4_K super-block whose 12 scale bytes are the words
// s0, s1, s2 (bytes 0-3, 4-7, 8-11), by shifts: an indexed byte array would live in local memory.
__device__ inline void scale_min_k4_words(int j, uint32_t s0, uint32_t s1, uint32_t s2, int* sc, int* m) {
  const int k = 8 * (j & 3);
  if (j < 4) {
    *sc = int((s0 >> k) & 63);
    *m = int((s1 >> k) & 63);
  } else {
    *sc = int(((s2 >> k) & 15) | (((s0 >> (k + 6)) & 3) << 4));
    *m = int(((s2 >> (k + 4)) & 15) | (((s1 >> (k + 6)) & 3) << 4));
  }
}

// This lane's share of rows[k] · x (k < R: R rows against the same activations, sharing their
// loads) over the super-blocks part, part + split, ... of `cols` columns (a multiple of 256):
// `split` warps share the rows. The caller sums acc[k] over the warp (and the parts). The loop is
// unrolled so that several super-blocks' loads are in flight at once: one lane's loads are few
// and small, and a row-at-a-time loop left decode bound by memory latency, not bandwidth.
// x: f32 or bf16 activations (TX, fixed at compile time: this loop is instruction-bound).
template <WFormat F, int R, class TX>
__device__ inline void kquant_rows_dot(const uint8_t* const* rows, const TX* __restrict__ x, int64_t cols, int lane,
                                       int part, int split, float* acc) {
  const int64_t nsb = cols / 256;
#pragma unroll
  for (int k = 0; k < R; ++k) acc[k] = 0.f;
  if constexpr (F == WFormat::GgufQ4_K) {
    const int p = lane >> 3, l0 = 4 * (lane & 7), j0 = 2 * p, j1 = 2 * p + 1;
#pragma unroll 4
    for (int64_t sb = part; sb < nsb; sb += split) {
      const float4 x0 = ld4(x + sb * 256 + 32 * j0 + l0);
      const float4 x1 = ld4(x + sb * 256 + 32 * j1 + l0);
      const float sx0 = x0.x + x0.y + x0.z + x0.w, sx1 = x1.x + x1.y + x1.z + x1.w;
#pragma unroll
      for (int k = 0; k < R; ++k) {
        const uint8_t* b = rows[k] + sb * 144;
        const uint32_t dd = *reinterpret_cast<const uint32_t*>(b);
        const uint32_t qw = *reinterpret_cast<const uint32_t*>(b + 16 + 32 * p + l0);
        const uint32_t s0 = *reinterpret_cast<const uint32_t*>(b + 4), s1 = *reinterpret_cast<const uint32_t*>(b + 8),
                       s2 = *reinterpret_cast<const uint32_t*>(b + 12);
        int sc0, m0, sc1, m1;
        scale_min_k4_words(j0, s0, s1, s2, &sc0, &m0);
        scale_min_k4_words(j1, s0, s1, s2, &sc1, &m1);
        const float d = __half2float(__ushort_as_half(uint16_t(dd))),
                    dmin = __half2float(__ushort_as_half(uint16_t(dd >> 16)));
        const float lo = dot4(x0, float(qw & 15), float((qw >> 8) & 15), float((qw >> 16) & 15), float((qw >> 24) & 15));
        const float hi = dot4(x1, float((qw >> 4) & 15), float((qw >> 12) & 15), float((qw >> 20) & 15), float(qw >> 28));
        acc[k] += d * (float(sc0) * lo + float(sc1) * hi) - dmin * (float(m0) * sx0 + float(m1) * sx1);
      }
    }
  } else if constexpr (F == WFormat::GgufQ6_K) {
    const int h = lane >> 4, t = (lane >> 3) & 1, l0 = 4 * (lane & 7);
    const int sa = t, sb2 = t + 2, g = 8 * h + (l0 >> 4);
#pragma unroll 4
    for (int64_t sb = part; sb < nsb; sb += split) {
      const float4 xa = ld4(x + sb * 256 + 128 * h + 32 * sa + l0);
      const float4 xb = ld4(x + sb * 256 + 128 * h + 32 * sb2 + l0);
#pragma unroll
      for (int k = 0; k < R; ++k) {
        const uint8_t* b = rows[k] + sb * 210;
        const uint32_t ql = ld_u32_2aligned(b + 64 * h + 32 * t + l0);
        const uint32_t qh = ld_u32_2aligned(b + 128 + 32 * h + l0);
        const float d = ld_half(b + 208);
        const float da = d * float(int8_t(b[192 + g + 2 * sa])), db = d * float(int8_t(b[192 + g + 2 * sb2]));
        float va[4], vb[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          va[i] = float(int(((ql >> (8 * i)) & 15) | (((qh >> (8 * i + 2 * sa)) & 3) << 4)) - 32);
          vb[i] = float(int(((ql >> (8 * i + 4)) & 15) | (((qh >> (8 * i + 2 * sb2)) & 3) << 4)) - 32);
        }
        acc[k] += da * dot4(xa, va[0], va[1], va[2], va[3]) + db * dot4(xb, vb[0], vb[1], vb[2], vb[3]);
      }
    }
  }
}

template <WFormat F, class TX>
__device__ inline float kquant_row_dot(const uint8_t* row, const TX* __restrict__ x, int64_t cols, int lane, int part = 0,
                                       int split = 1) {
  float acc;
  kquant_rows_dot<F, 1, TX>(&row, x, cols, lane, part, split, &acc);
  return acc;
}

}  // namespace g4::cuda
