// Shared by the CUDA kernels (cuda_kernels.cu, cuda_tc_matmul.cu): the activation storage types
// and the activation functions.
//
// Activations are stored as T = float or __nv_bfloat16 (Buf::dtype F32 / BF16); kernels load them
// into f32 registers (to_f, ld4), compute and accumulate in f32, and round once when they store
// (from_f, st4: round to nearest even). Weights keep their own formats (cuda_dequant.cuh).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "core/dtype.h"

namespace g4::cuda {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) { return v; }
template <>
__device__ __forceinline__ bf16 from_f<bf16>(float v) { return __float2bfloat16_rn(v); }

// Four consecutive activations at p (p 4-element aligned: 16 bytes for f32, 8 for bf16).
__device__ __forceinline__ float4 ld4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 ld4(const bf16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                     __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ void st4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }
__device__ __forceinline__ void st4(bf16* p, float4 v) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
  uint2 u;
  u.x = *reinterpret_cast<const uint32_t*>(&a);
  u.y = *reinterpret_cast<const uint32_t*>(&b);
  *reinterpret_cast<uint2*>(p) = u;
}

// Loads from an activation whose type is known at run time only (bf: bf16, else f32). The matmul
// kernels read x this way: their weight formats already give hundreds of instantiations, and a
// uniform branch per load costs less than doubling them (compile time).
__device__ __forceinline__ float4 ld4x(const void* p, int64_t i, bool bf) {
  return bf ? ld4(static_cast<const bf16*>(p) + i) : ld4(static_cast<const float*>(p) + i);
}
__device__ __forceinline__ float ldx(const void* p, int64_t i, bool bf) {
  return bf ? __bfloat162float(static_cast<const bf16*>(p)[i]) : static_cast<const float*>(p)[i];
}
// v as a store of it into an activation buffer (bf16 when bf, else f32) would read back.
__device__ __forceinline__ float act_round(float v, bool bf) {
  return bf ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}
// A store of one value into an output whose type is known at run time only (the matmuls' y:
// the activation type, or f32 for the logits).
__device__ __forceinline__ void store_out(void* y, int64_t i, float v, bool f32) {
  if (f32) static_cast<float*>(y)[i] = v;
  else static_cast<bf16*>(y)[i] = __float2bfloat16_rn(v);
}

// Calls f(T{}) with T the storage type of dtype t (F32 or BF16; anything else is a caller bug).
template <class Fn>
inline void with_act(DType t, Fn&& f) {
  if (t == DType::BF16) f(bf16{});
  else f(float{});
}

// gelu_tanh(x) * up in MLX's op order (spec §2.7) / through ggml's f16 table (backend.h).
__device__ inline float gelu_tanh_mul(float x, float up) {
  const float c = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + tanhf(c)) * up;
}
__device__ inline float gelu_ggml_mul(float x, float up, const uint16_t* table) {
  if (x <= -10.f) return 0.f;
  if (x >= 10.f) return x * up;
  const __half gv = __ushort_as_half(table[__half_as_ushort(__float2half_rn(x))]);
  return __half2float(gv) * up;
}

}  // namespace g4::cuda
