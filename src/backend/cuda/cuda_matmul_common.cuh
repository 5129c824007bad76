// Shared by the matmul kernels (cuda_matmul.cu) and the decode GEMVs (cuda_gemv_decode.cu): the
// block shape, the fused activations, the input norm into shared memory and the residual epilogue.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// The most activation rows one matmul launch walks per chunk.
constexpr int kMaxM = 8;
// Warps per matmul block (the activations a matmul applies: Act, cuda_kernels.h).
constexpr int kMatWarps = 8;
// matmul_norm_add's epilogue, run by every block after its rows: the last block to finish adds
// rms_norm(y)·post_w to resid, row by row with the whole block; each thread's loads are issued
// together (kPerT at a time), not one L2 round trip after another. y and resid of type a.xt.
__device__ inline void residual_epilogue(const MatArgs& a, const void* y, int64_t n) {
  const bool bf = a.xt == DType::BF16;
  __shared__ bool last;
  __shared__ float red[32];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  constexpr int kPerT = 4;
  const int64_t step = int64_t(kPerT) * blockDim.x;
  for (int m = 0; m < a.M; ++m) {
    const int64_t row = int64_t(m) * n;
    float ss = 0.f;
    for (int64_t c0 = threadIdx.x; c0 < n; c0 += step) {
      float v[kPerT];
#pragma unroll
      for (int k = 0; k < kPerT; ++k) v[k] = c0 + k * blockDim.x < n ? ld_cg(y, row + c0 + k * blockDim.x, bf) : 0.f;
#pragma unroll
      for (int k = 0; k < kPerT; ++k) ss += v[k] * v[k];
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(n) + a.post_eps);
    for (int64_t c0 = threadIdx.x; c0 < n; c0 += step) {
      float v[kPerT], r[kPerT], g[kPerT];
#pragma unroll
      for (int k = 0; k < kPerT; ++k) {
        const int64_t c = c0 + k * blockDim.x;
        v[k] = c < n ? ld_cg(y, row + c, bf) : 0.f;
        r[k] = c < n ? ldx(a.resid, row + c, bf) : 0.f;
        g[k] = c < n ? a.post_w[c] : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kPerT; ++k)
        if (c0 + k * blockDim.x < n) store_out(a.resid, row + c0 + k * blockDim.x, r[k] + v[k] * inv * g[k], !bf);
    }
  }
  if (threadIdx.x == 0) *a.counter = 0u;
}

// Block-wide rms_norm of one row (M = 1) into shared memory xn: xn[c] = x[c] * inv_rms(x) * w[c].
__device__ inline void norm_row_to_shared(const void* x, bool bf, int64_t cols, const float* w, float eps, float* xn) {
  __shared__ float red[32];
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += ldx(x, c, bf) * ldx(x, c, bf);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) xn[c] = ldx(x, c, bf) * inv * w[c];
  __syncthreads();
}

// The M = 1 paths (cuda_gemv_decode.cu): the one-row GEMV for tall plain matrices (the LM head)
// and the K-quant decode kernels. Launches a.w[0]'s format and returns true when one applies to
// this launch (act: Act), else returns false and launches nothing.
bool decode_gemv(cudaStream_t s, const MatArgs& a, int act);
// The int8 decode path (cuda_gemv_q8.cu), when a.q8 is set and q8_gemv_supports every weight of
// the launch: prepares the M rows of a.x (normed with a.norm_w when set) into a.q8, then one GEMV
// launch; each row's bits are those it gets alone (M = 1). Returns false, launching nothing, when
// it does not apply (or M rows do not fit the scratch, or a.resid's epilogue needs M = 1).
bool q8_gemv(cudaStream_t s, const MatArgs& a, int M, int act);

}  // namespace g4::cuda
