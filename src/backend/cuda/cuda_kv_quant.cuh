// Quantized KV rows on the device (backend.h KvBuffer::quant): the MLX affine quantization of
// quant/affine_quantize.h, one head row at a time by a whole block, and the per-element
// dequantization the attention kernel reads them with. Same arithmetic as the host: every step
// rounded on its own (no fused multiply-add), IEEE division, rint, so equal inputs give equal
// codes, scales and biases.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

namespace g4::cuda {

// A cache's quantized storage (bits 0: the cache holds f32 rows). Rows are head rows:
// r = slot * n_kv_heads + head, head_dim values each; codes: one LSB-first bit stream.
struct KvQuantArgs {
  int bits = 0;
  int group = 64;
  int group_shift = 6;  // log2(group): 32, 64 and 128 are the only group sizes
  bool bf16_params = false;
  uint8_t* kq = nullptr;
  uint8_t* vq = nullptr;
  float* ks = nullptr;
  float* kb = nullptr;
  float* vs = nullptr;
  float* vb = nullptr;
};

#ifdef __CUDACC__
// Element d of head row r (D values per row): scale*q + bias, rounded twice as dequant_row does.
// Rows start on whole bytes (D * bits is a multiple of 8) and groups divide D, so only the row's
// base is 64-bit arithmetic.
__device__ inline float kv_dequant(const uint8_t* codes, const float* s, const float* b, const KvQuantArgs& qa,
                                   int64_t r, int D, int d) {
  const int bit = d * qa.bits;
  const uint8_t* p = codes + r * (D * qa.bits / 8) + (bit >> 3);
  const int sh = bit & 7;
  uint32_t v = p[0];
  if (sh + qa.bits > 8) v |= uint32_t(p[1]) << 8;
  const uint32_t q = (v >> sh) & ((1u << qa.bits) - 1u);
  const int64_t gi = r * (D >> qa.group_shift) + (d >> qa.group_shift);
  return __fadd_rn(__fmul_rn(s[gi], float(q)), b[gi]);
}

// Quantizes x[0, D) (written by this block before a __syncthreads, or read-only input) into head
// row r of (codes, s, b). The whole block calls it (blockDim.x a multiple of 32); one warp per
// group finds min and max and the codes, then each thread packs whole output bytes.
// sh_codes: D bytes of shared memory. Ends with __syncthreads.
__device__ inline void kv_quantize_head(const float* x, int D, int bits, int group, bool bf16_params, int64_t r,
                                        uint8_t* codes, float* s, float* b, uint8_t* sh_codes) {
  const int warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float n_bins = float((1 << bits) - 1);
  const int groups = D / group;
  for (int g = warp; g < groups; g += warps) {
    const float* w = x + g * group;
    float mn = INFINITY, mx = -INFINITY;
    for (int j = lane; j < group; j += 32) {
      mn = fminf(mn, w[j]);
      mx = fmaxf(mx, w[j]);
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
      const float q = rintf(__fdiv_rn(__fsub_rn(w[j], bias), scale));
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
