// Device helpers shared by the CUDA kernel files: warp and block reductions, the RMS factor, launch
// arithmetic. Header-only; everything is inline.
#pragma once
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"

namespace g4::cuda {

constexpr int kWarp = 32;

// An L2 load (bypassing L1: written by other blocks of this launch) of a run-time-typed activation.
__device__ inline float ld_cg(const void* p, int64_t i, bool bf) {
  if (bf) return __bfloat162float(__ldcg(static_cast<const bf16*>(p) + i));
  return __ldcg(static_cast<const float*>(p) + i);
}

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
template <class Op>
__device__ inline float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float warp_sum(float v) { return warp_reduce(v, Sum{}); }
// Reduction over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
// gets the result. sh: 32 floats of shared memory, free again when this returns.
template <class Op>
__device__ inline float block_reduce(float v, float* sh, Op op, float identity) {
  v = warp_reduce(v, op);
  const int w = threadIdx.x / kWarp, l = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = threadIdx.x < nw ? sh[threadIdx.x] : identity;
  if (w == 0) v = warp_reduce(v, op);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  return sh[0];
}
__device__ inline float block_sum(float v, float* sh) { return block_reduce(v, sh, Sum{}, 0.f); }
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// 1 / sqrt(mean(x²) + eps) from each thread's partial sum of squares ss (inv_rms's strided order).
__device__ inline float rms_inv(float ss, int dim, float eps, float* sh) {
  ss = block_sum(ss, sh);
  return 1.0f / sqrtf(ss / float(dim) + eps);
}
// 1 / sqrt(mean(x²) + eps) over x[dim], by the whole block (every thread gets it). Its barriers
// order the block's reads of x before any write that follows. sh: 32 floats of shared memory.
// kSumThreads: the threads the sum of squares is split over (0: the whole block). A block larger
// than that gets the smaller block's factor to the bit: its other threads add exact zeros.
template <int kSumThreads = 0, class T>
__device__ inline float inv_rms(const T* x, int dim, float eps, float* sh) {
  float ss = 0.f;
  if constexpr (kSumThreads == 0) {
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += to_f(x[i]) * to_f(x[i]);
  } else if (threadIdx.x < kSumThreads) {
    for (int i = threadIdx.x; i < dim; i += kSumThreads) ss += to_f(x[i]) * to_f(x[i]);
  }
  return rms_inv(ss, dim, eps, sh);
}

inline unsigned blocks_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }

}  // namespace g4::cuda
