// Activation functions shared by the CUDA kernels (cuda_kernels.cu, cuda_tc_matmul.cu).
#pragma once
#include <cuda_fp16.h>

#include <cstdint>

namespace g4::cuda {

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
