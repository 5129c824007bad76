// Matmuls over a few activation rows (batched decode of 2 to 32 sequences, short prefill chunks) on
// bf16 tensor cores, reading each weight once for all rows.
//
// Accuracy contract (as cuBLAS prefill, cuda_blas.h): products of bf16-rounded weights and bf16
// activations summed in f32; outputs rounded once to the output type. Q4_K weights are computed in
// bf16 arithmetic: bf16(q · bf16(d) - bf16(dmin·m)), one rounding after the unit's scale and min
// are themselves rounded to bf16. The SIMT kernels
// (cuda_matmul.cu) stay the path for f32 activations and for widths this kernel does not take,
// and the op tests compare both with the reference backend.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// (More rows go to cuBLAS, cuda_blas.h kBlasMinRows; from kBlasCachedMinRows when the weights are
// read as bf16 there.)
constexpr int kSmallMinRows = 2, kSmallMaxRows = 32;
// The reduction step (columns of every weight row per MMA step): widths must be multiples (K-quant
// widths, of their 256-column super-blocks).
constexpr int kSmallStep = 128;

// Whether M rows of activations of type xt into weights of width cols take this path (the backend
// then norms the input separately: the kernel has no input norm). Not with the tensor cores off.
inline bool small_mma_rows(DType xt, int M, int64_t cols) {
  return xt == DType::BF16 && M >= kSmallMinRows && M <= kSmallMaxRows && cols % kSmallStep == 0 &&
         !tc_matmul_disabled();
}
// Whether launch a of M rows runs here: small_mma_rows for every weight, no input norm, no fused
// epilogue (resid, deferred post-norm), x and the weights 16-byte aligned, weights not f32.
bool small_mma_applies(const MatArgs& a, int M);
// y[i][M, w[i].rows] = x · w[i]ᵀ for i < a.n (act 0), or y[0] = gelu(x·w[0]ᵀ) · (x·w2ᵀ) (act 1:
// MLX's tanh form; 2: ggml's table, a.table); y of type a.yt.
void small_mma(cudaStream_t s, const MatArgs& a, int M, int act);

}  // namespace g4::cuda
