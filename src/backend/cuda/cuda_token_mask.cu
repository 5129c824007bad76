// mask_logits (cuda_token_mask.h): one thread a logit.
#include "backend/cuda/cuda_token_mask.h"

#include "backend/cuda/cuda_launch.cuh"
#include "core/token_mask.h"

namespace g4::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) mask_logits_kernel(float* x, int rows, int n, const uint32_t* allow,
                                                               int words) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= int64_t(rows) * n) return;
  const int r = int(i / n), v = int(i % n);
  if (!((allow[int64_t(r) * words + (v >> 5)] >> (v & 31)) & 1u)) x[i] = -INFINITY;
}

}  // namespace

void mask_logits(cudaStream_t s, float* x, int rows, int n, const uint32_t* allow) {
  const int64_t total = int64_t(rows) * n;
  if (total <= 0) return;
  launch_kernel(mask_logits_kernel, unsigned((total + kThreads - 1) / kThreads), kThreads, 0, s, x, rows, n, allow,
                token_mask_words(n));
}

}  // namespace g4::cuda
