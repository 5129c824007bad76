// Prefill attention on tensor cores (cuda_flash_attention.cu): the backend's attention op sends
// each sequence it applies to here, one launch each, and the rest to cuda::attention in one launch.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// Whether flash_attention takes this launch: a bf16 cache (not quantized), head_dim 64, 128, 256
// or 512, at least kFlashMinRows query rows, tensor cores on.
constexpr int kFlashMinRows = 16;
bool flash_attention_applies(const AttnArgs& a);
// The attention contract (q and out [row0 + n, H, head_dim] bf16; each row t sees the
// positions [lo_t, hi_t]: its causal window, widened to its image block) without splits. Scores
// from bf16 q, k with f32 accumulation, the softmax in f32 (online, per 32-position tile), the
// probabilities rounded to bf16 for the P·V MMA, f32 accumulation, the output rounded once.
void flash_attention(cudaStream_t s, const void* q, int H, const AttnArgs& a, float scale, void* out);

}  // namespace g4::cuda
