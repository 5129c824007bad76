// The int8 GEMV of several prepared rows on the tensor cores (cuda_gemv_mma.cu): a row-exact
// verify forward's 2 to 64 rows into K-quant weights (Q4_K, Q5_K, Q6_K), each row with the bits
// the dp4a GEMV (cuda_gemv_q8.cu) gives it alone, at lpr lanes a row. Chosen by the dp4a GEMV's
// launch when MatArgs::mma_rows is set.
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// MatArgs::mma_rows: 0 the dp4a GEMV always; kMmaByRule as q8_mma_takes decides; kMmaWherePossible
// every launch of 2 or more rows the kernel handles (bench_cuda_gemv times both kernels at any M).
constexpr uint8_t kMmaByRule = 1, kMmaWherePossible = 2;
// The rule, from per-kernel times (bench_cuda_gemv --rows M; docs/cuda-notes.md stops 51 and 53):
// at 2 rows the dp4a GEMV is faster everywhere. At 4 rows (H100, E4B and 31B shapes) the MMA GEMV
// is faster for Q4_K / Q5_K weights of kMmaLargeValues values or more (E4B gate 26.7 -> 14.8 us,
// down 28.5 -> 27.6; 31B q 35.2 -> 24.5, o 41.7 -> 32.6, down 107.8 -> 81.9) and slower for Q6_K
// and for the smaller E4B q / k / v; the fused gate+up launch gains at E4B's 26M values a weight
// (27.9 -> 24.4 us) and loses at 31B's 116M (102.3 -> 119.4), so 4-row gelu launches take it below
// kMmaLargeGeluValues only. At 8 rows it is 1.1-3x faster for every E4B and 31B shape and format
// (31B Q4_K gate+up 175.3 -> 125.4 us) but one, 31B's Q6_K gate+up (184.9 -> 209.0; Q4_K_M files
// keep gate and up in Q4_K), and the dp4a GEMV takes 5 to 8 rows in one 8-row pass, which costs as
// 8: kMmaMinRows rows and up take it.
constexpr int kMmaMinRows = 5;
constexpr int kMmaLargeMinRows = 4;
constexpr int64_t kMmaLargeValues = int64_t(16) << 20;
constexpr int64_t kMmaLargeGeluValues = int64_t(64) << 20;
// Whether the MMA kernel handles a (act: Act): every weight (and w2) Q4_K, Q5_K or Q6_K alike, no
// residual epilogue (MatArgs::resid).
bool q8_mma_handles(const MatArgs& a, int act);
// Whether the launch of a over M rows takes the MMA GEMV (a.mma_rows, the rule above).
bool q8_mma_takes(const MatArgs& a, int M, int act);
// y[i][m] = w[i] · x[m] for m < M over the rows prepared in a.q8 (q8_mma_takes), each as the dp4a
// GEMV at lpr lanes a row computes it. One launch.
void q8_mma_gemv(cudaStream_t s, const MatArgs& a, int M, int act, int lpr);

}  // namespace g4::cuda
