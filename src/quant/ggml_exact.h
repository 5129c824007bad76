// GGUF matmuls that reproduce llama.cpp's CPU backend bit for bit (the `ggml` backend's matmul).
//
// The reference is llama.cpp as built by llama-cpp-python 0.3.36 (requirements-peer.txt): native
// x86-64 with AVX-512 (F/BW/DQ/VL/VNNI), AMX off, default settings. For a weight W and a batch of
// M activation rows it picks a kernel per format and M; each output element's floating-point
// operations are reproduced here in the same order (the integer parts are exact anyway):
//   Q8_0 / Q5_0 / Q4_0 (llamafile tinyBLAS_Q0_AVX for M >= 2, ggml_vec_dot_*_q8_0 for M = 1,
//       the same arithmetic): activations quantized per 32 values (quantize_row_q8_0, f16 scale);
//       8 f32 lanes, lane i += (dw*da) * isum(values 4i..4i+3) by fma per block, then hsum.
//   Q6_K, M < 8 (ggml_vec_dot_q6_K_q8_K, AVX2 body): activations quantized per 256 (Q8_K); per
//       super-block 8 int32 lanes (lane L: values with (v mod 32) div 4 == L, times their scale,
//       minus 32 * the scaled bsums of values 32L..32L+31), lane += (dy*dx) * lane_int by fma,
//       then hsum.
//   Q6_K, M >= 8 (tiled matmul, VNNI microkernel): per super-block the exact integer dot S;
//       out += (float(S) * dx) * dy, super-blocks in order.
//   Q4_K (repacked q4_K_8x8 when rows % 8 == 0): the first M - M%4 rows go through the 4-row gemm
//       (one fma per 64 values: acc += float(I) * (dx*dy), mins likewise; out = acc - mins), the
//       rest through the gemv (one fma per 256 values).
// Other formats (and Q4_K with rows % 8 != 0) are not covered: supports() says so.
// Needs AVX-512 VNNI (cpu_has_avx512_vnni()); callers check.
#pragma once
#include <cstdint>

#include "quant/weight.h"

namespace g4::ggml_exact {

// True when `w` (format and shape) has a llama.cpp-exact kernel here.
bool supports(const WeightView& w);

// y[M, w.rows] = x[M, w.cols] · Wᵀ as llama.cpp computes it for a batch of M rows. Threaded over
// weight rows (the result does not depend on the thread count).
void matmul(const float* x, int64_t M, const WeightView& w, float* y);

}  // namespace g4::ggml_exact
