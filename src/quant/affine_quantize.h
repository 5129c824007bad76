// MLX affine quantization of f32 values (mlx.core.quantize, mode "affine"), for data quantized
// at run time (the quantized KV cache); checkpoints arrive already quantized.
//
// Per group of `group_size` consecutive values, exactly as MLX's CPU kernel computes it in f32:
//   scale = max((max - min) / (2^bits - 1), 1e-7), negated unless |min| > |max|;
//   edge = min if |min| > |max| else max; q0 = rint(edge / scale);
//   if q0 != 0: scale = edge / q0, bias = edge, else bias = 0;
//   code_i = clamp(rint((x_i - bias) / scale), 0, 2^bits - 1).
// Codes are written as one LSB-first bit stream (value i at bit i*bits), which is MLX's packing
// for every bit width, and what WFormat::MlxAffine views read (quant/weight.h). The stored scale
// and bias are the f32 values, or those values rounded to bf16 when `bf16_params` (MLX keeps them
// in the input's dtype); the codes are computed with the unrounded scale either way, as in MLX.
#pragma once
#include <cstddef>
#include <cstdint>

namespace g4 {

// Whether (bits, group_size) is a combination MLX quantizes and our MlxAffine kernels read:
// bits in {2,3,4,5,6,8}, group_size in {32,64,128}.
bool affine_quant_supported(int bits, int group_size);

// Quantizes x[0, n) (n a multiple of group_size) into codes (n*bits/8 bytes, n*bits a multiple
// of 8) and scales / biases (n / group_size floats each).
void affine_quantize(const float* x, size_t n, int bits, int group_size, bool bf16_params,
                     uint8_t* codes, float* scales, float* biases);

}  // namespace g4
