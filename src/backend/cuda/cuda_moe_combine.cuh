// The routed experts' combination, one value of it: out[r, i] = Σ_j w[r, j]·y[r, j, i] over a
// row's k items, summed in item order in f32. One definition for moe_combine_kernel (cuda_moe.cu)
// and moe_exit_kernel (cuda_norm_rope.cu), which computes it instead of reading it: both round
// the same sum, so moe_exit's bits equal moe_combine then moe_exit.
#pragma once
#include <cstdint>

#include "backend/cuda/cuda_act.cuh"

namespace g4::cuda {

template <class T>
__device__ inline float moe_combined(const T* y, const float* w, int r, int k, int d, int i) {
  float acc = 0.f;
  for (int j = 0; j < k; ++j) acc += w[r * k + j] * to_f(y[(int64_t(r) * k + j) * d + i]);
  return acc;
}

}  // namespace g4::cuda
