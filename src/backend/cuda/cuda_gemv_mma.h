// The int8 GEMV of several prepared rows on the tensor cores (cuda_gemv_mma.cu): a row-exact
// verify forward's 2 to 64 rows into K-quant weights (Q4_K, Q5_K, Q6_K), each row with the bits
// the dp4a GEMV (cuda_gemv_q8.cu) gives it alone, at lpr lanes a row. Chosen by the dp4a GEMV's
// launch when MatArgs::mma_rows is set.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// The fewest prepared rows the MMA GEMV takes. Measured per kernel at the E4B shapes (H100 / H200,
// docs/cuda-notes.md stop 51): at 2 rows the dp4a GEMV is faster everywhere, at 4 it is mixed
// (MMA faster only for Q4_K / Q5_K gate, up and down), at 8 the MMA GEMV is 1.3-3x faster for
// every shape and format; the dp4a GEMV takes 5 to 8 rows in one 8-row pass, which costs as 8.
constexpr int kMmaMinRows = 5;
// Whether the MMA GEMV takes a over M rows (act: Act): M >= kMmaMinRows, every weight (and w2)
// Q4_K, Q5_K or Q6_K alike, no residual epilogue (MatArgs::resid).
bool q8_mma_takes(const MatArgs& a, int M, int act);
// y[i][m] = w[i] · x[m] for m < M over the rows prepared in a.q8 (q8_mma_takes), each as the dp4a
// GEMV at lpr lanes a row computes it. One launch.
void q8_mma_gemv(cudaStream_t s, const MatArgs& a, int M, int act, int lpr);

}  // namespace g4::cuda
