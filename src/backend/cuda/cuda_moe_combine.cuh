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

// moe_combined for a block's share of row r: acc[jj] = the value i = threadIdx.x + kStride jj
// (jj < kPer, i < d; others left 0), summed as moe_combined sums it (item order: the same bits),
// with the loads of kItems items in flight together, where moe_combined's loop waits a memory
// round trip per item.
template <int kPer, int kStride, class T>
__device__ inline void moe_combined_row(const T* y, const float* w, int r, int k, int d, float (&acc)[kPer]) {
  constexpr int kItems = 4;
#pragma unroll
  for (int jj = 0; jj < kPer; ++jj) acc[jj] = 0.f;
  for (int j0 = 0; j0 < k; j0 += kItems) {
    float wv[kItems];
    T yv[kItems][kPer];
#pragma unroll
    for (int b = 0; b < kItems; ++b) {
      const int j = j0 + b;
      wv[b] = j < k ? w[r * k + j] : 0.f;
#pragma unroll
      for (int jj = 0; jj < kPer; ++jj) {
        const int i = threadIdx.x + kStride * jj;
        yv[b][jj] = j < k && i < d ? y[(int64_t(r) * k + j) * d + i] : from_f<T>(0.f);
      }
    }
#pragma unroll
    for (int b = 0; b < kItems; ++b) {
      if (j0 + b >= k) break;
#pragma unroll
      for (int jj = 0; jj < kPer; ++jj) acc[jj] += wv[b] * to_f(yv[b][jj]);
    }
  }
}

}  // namespace g4::cuda
