// Constrained decoding on the device (Backend::mask_logits): for each of the count masks, row
// rows[i] of x [*, n] (f32 logits) = -inf where mask i (core/token_mask.h: token_mask_words(n)
// words a mask) has the token's bit clear. The host default (fused_ops.cpp) is the reference the
// op test compares with.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace g4::cuda {

void mask_logits(cudaStream_t s, float* x, int n, const uint32_t* allow, const int32_t* rows, int count);

}  // namespace g4::cuda
