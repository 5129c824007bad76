// mask_logits (cuda_token_mask.h): one thread a logit of a masked row.
#include "backend/cuda/cuda_token_mask.h"

#include "backend/cuda/cuda_launch.cuh"
#include "core/token_mask.h"

namespace g4::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads) mask_logits_kernel(float* x, int n, const uint32_t* allow,
                                                               const int32_t* rows, int count, int words) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= int64_t(count) * n) return;
  const int m = int(i / n), v = int(i % n);
  if (!((allow[int64_t(m) * words + (v >> 5)] >> (v & 31)) & 1u)) x[int64_t(rows[m]) * n + v] = -INFINITY;
}

}  // namespace

void mask_logits(cudaStream_t s, float* x, int n, const uint32_t* allow, const int32_t* rows, int count) {
  const int64_t total = int64_t(count) * n;
  if (total <= 0) return;
  launch_kernel(mask_logits_kernel, unsigned((total + kThreads - 1) / kThreads), kThreads, 0, s, x, n, allow, rows,
                count, token_mask_words(n));
}

}  // namespace g4::cuda
