// Quantized KV rows on the device (backend.h KvBuffer::quant): the MLX affine quantization of
// quant/affine_quantize.h, one head row at a time by a whole block, and the dequantization of a
// lane's contiguous run of values that the attention kernel reads them with. Same arithmetic as the host: every step
// rounded on its own (no fused multiply-add), IEEE division, rint, so equal inputs give equal
// codes, scales and biases.
#pragma once
#include "backend/cuda/cuda_act.cuh"
#include <cuda_bf16.h>

#include <cstdint>

namespace g4::cuda {

// A cache's quantized storage (bits 0: the cache holds f32 rows). Rows are head rows:
// r = slot * n_kv_heads + head, head_dim values each; codes: one LSB-first bit stream.
// (No padding: its bytes are part of a step's key, cuda_launch_structs_check.cu.)
struct KvQuantArgs {
  uint8_t* kq = nullptr;
  uint8_t* vq = nullptr;
  float* ks = nullptr;
  float* kb = nullptr;
  float* vs = nullptr;
  float* vb = nullptr;
  int bits = 0;
  int group = 64;
  int group_shift = 6;  // log2(group): 32, 64 and 128 are the only group sizes
  bool bf16_params = false;
  uint8_t reserved[3] = {};
};

#ifdef __CUDACC__
// Values d0 .. d0+N-1 of head row r into out[N] (d0 + N <= D, d0 a multiple of N, N <= 32 and a
// power of two, so they lie in one group): one scale and bias; codes read as whole 32-bit words
// when 4- and 8-bit runs fill them, byte by byte otherwise. scale*q + bias rounded twice, as
// dequant_row computes it on the host.
template <int N>
__device__ inline void kv_dequant_run(const uint8_t* codes, const float* s, const float* b, const KvQuantArgs& qa,
                                      int64_t r, int D, int d0, float* out) {
  if (d0 >= D) {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = 0.f;
    return;
  }
  const int64_t gi = r * (D >> qa.group_shift) + (d0 >> qa.group_shift);
  const float sc = s[gi], bi = b[gi];
  const uint8_t* row = codes + r * (D * qa.bits / 8);
  uint32_t c[N];
  if (qa.bits == 4 && N % 8 == 0) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(row + d0 / 2);
#pragma unroll
    for (int j = 0; j < N / 8; ++j) {
      const uint32_t v = w[j];
#pragma unroll
      for (int k = 0; k < 8; ++k) c[8 * j + k] = (v >> (4 * k)) & 15u;
    }
  } else if (qa.bits == 8 && N % 4 == 0) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(row + d0);
#pragma unroll
    for (int j = 0; j < N / 4; ++j) {
      const uint32_t v = w[j];
#pragma unroll
      for (int k = 0; k < 4; ++k) c[4 * j + k] = (v >> (8 * k)) & 255u;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const int bit = (d0 + i) * qa.bits, sh = bit & 7;
      const uint8_t* p = row + (bit >> 3);
      uint32_t v = p[0];
      if (sh + qa.bits > 8) v |= uint32_t(p[1]) << 8;
      c[i] = (v >> sh) & ((1u << qa.bits) - 1u);
    }
  }
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = __fadd_rn(__fmul_rn(sc, float(c[i])), bi);
}

// Quantizes x[0, D) (written by this block before a __syncthreads, or read-only input) into head
// row r of (codes, s, b). The whole block calls it (blockDim.x a multiple of 32); one warp per
// group finds min and max and the codes, then each thread packs whole output bytes.
// sh_codes: D bytes of shared memory. Ends with __syncthreads.
// x: f32 or bf16 values (the activation type, cuda_act.cuh).
template <class T>
__device__ inline void kv_quantize_head(const T* x, int D, int bits, int group, bool bf16_params, int64_t r,
                                        uint8_t* codes, float* s, float* b, uint8_t* sh_codes) {
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float n_bins = float((1 << bits) - 1);
  const int groups = D / group;
  for (int g = warp; g < groups; g += warps) {
    const T* w = x + g * group;
    float mn = INFINITY, mx = -INFINITY;
    for (int j = lane; j < group; j += 32) {
      mn = fminf(mn, to_f(w[j]));
      mx = fmaxf(mx, to_f(w[j]));
    }
    for (int o = 16; o > 0; o >>= 1) {
      mn = fminf(mn, __shfl_xor_sync(0xffffffffu, mn, o));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    }
    const bool neg = fabsf(mn) > fabsf(mx);
    float scale = fmaxf(__fdiv_rn(__fsub_rn(mx, mn), n_bins), 1e-7f);
    scale = neg ? scale : -scale;
    const float edge = neg ? mn : mx;
    const float q0 = rintf(__fdiv_rn(edge, scale));
    float bias = 0.f;
    if (q0 != 0.f) {
      scale = __fdiv_rn(edge, q0);
      bias = edge;
    }
    for (int j = lane; j < group; j += 32) {
      const float q = rintf(__fdiv_rn(__fsub_rn(to_f(w[j]), bias), scale));
      sh_codes[g * group + j] = uint8_t(fminf(fmaxf(q, 0.f), n_bins));
    }
    if (lane == 0) {
      const int64_t gi = r * groups + g;
      s[gi] = bf16_params ? __bfloat162float(__float2bfloat16_rn(scale)) : scale;
      b[gi] = bf16_params ? __bfloat162float(__float2bfloat16_rn(bias)) : bias;
    }
  }
  __syncthreads();
  const int nbytes = D * bits / 8;
  uint8_t* out = codes + r * nbytes;
  for (int ob = threadIdx.x; ob < nbytes; ob += blockDim.x) {
    const int lo = ob * 8;
    uint32_t v = 0;
    for (int e = lo / bits; e < D && e * bits < lo + 8; ++e) {
      const int shift = e * bits - lo;
      const uint32_t c = sh_codes[e];
      v |= shift >= 0 ? (c << shift) : (c >> -shift);
    }
    out[ob] = uint8_t(v);
  }
  __syncthreads();
}
#endif

}  // namespace g4::cuda
