// Constrained decoding on the device (Backend::mask_logits): x [rows, n] f32 logits = -inf where
// the row's allowed-token bitmask (core/token_mask.h: token_mask_words(n) words a row) has the
// token's bit clear. The host default (fused_ops.cpp) is the reference the op test compares with.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace g4::cuda {

void mask_logits(cudaStream_t s, float* x, int rows, int n, const uint32_t* allow);

}  // namespace g4::cuda
