// Prefill matmuls on cuBLAS's bf16 tensor-core GEMMs (bf16 activations only): weights of any
// format are dequantized to bf16 into a fixed scratch, a chunk of rows at a time, and multiplied
// by the (normed) activation rows with f32 accumulation (cublasGemmEx, CUBLAS_COMPUTE_32F).
//
// Accuracy contract: the products are those of bf16-rounded weights and bf16 activations, summed
// in f32, as mlx-lm computes in bf16 (its quantized matmuls dequantize into bf16); the weights'
// rounding (2^-9 relative) is what this adds over the 3xTF32 kernels (cuda_tc_matmul.cu), which
// keep f32 weights. Op tests bound the result against the f32 reference (cuda_bf16_test.cpp).
//
// cuBLAS is loaded at run time (libcublas.so.13, or .12): a machine without it runs the tensor-core
// kernels instead, and the binary does not depend on the toolkit's largest library.
//
// The scratch (about 200 MiB, allocated once by create) bounds a launch's chunks: at most
// kBlasRowBlock activation rows and as many weight rows as fit; larger launches loop over chunks.
// Every pointer is fixed at creation, so steps that use it replay as CUDA graphs. With a weight
// cache budget (BackendOptions::bf16_weight_cache_gib, cache_weights), a weight's bf16 copy is made
// once and kept, and its launches read the copy instead of dequantizing into the scratch.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

class DeviceAllocator;

// Launches with fewer activation rows stay on the matmul kernels (at few rows the bf16 copy of
// the weights costs more than the kernels' own dequantizing; 2 to 32 rows: cuda_mma_small.h).
constexpr int kBlasMinRows = 33;
// With bf16 copies of every weight of a launch (cache_weights), or bf16 weights, cuBLAS reads no
// scratch and wins from fewer rows (BackendOptions::blas_cached_min_rows overrides).
constexpr int kBlasCachedMinRows = 16;
constexpr int kBlasRowBlock = 1024;       // activation rows per GEMM
constexpr int64_t kBlasMaxCols = 32768;   // the widest input (K) the normed-input scratch holds

class Blas {
 public:
  // Null, with the reason in *why, when cuBLAS cannot be loaded or initialized.
  static std::unique_ptr<Blas> create(DeviceAllocator& mem, std::string* why);
  ~Blas();
  Blas(const Blas&) = delete;
  Blas& operator=(const Blas&) = delete;

  // Whether launch `a` (matmuls, or gate_up_gelu when act != 0) of M rows runs here: bf16 input,
  // M >= min_rows, K a multiple of 32 within kBlasMaxCols, no fused epilogue (resid / deferred
  // post-norm), no int8 scratch in use.
  bool applies(const MatArgs& a, int M, int min_rows = kBlasMinRows) const;
  // Whether every weight of launch a (act: gate_up_gelu's two) is read without dequantizing: bf16
  // already, or with its copy kept.
  bool reads_bf16(const MatArgs& a, int act) const;
  // y[i][M, w[i].rows] = rms_norm?(x) · w[i]ᵀ for i < a.n (act 0), or y[0] = gelu(x·w[0]ᵀ) ·
  // (x·w2ᵀ) (act 1: MLX's tanh form; 2: ggml's table, a.table); y of type a.yt.
  void run(cudaStream_t s, const MatArgs& a, int M, int act) const;
  // Keeps a bf16 copy of every weight of launch a that has none (dequantized on stream s now), as
  // long as the copies stay within budget_bytes and 2 GiB of device memory stays free; run then
  // reads the copy. Host side, outside a
  // graph capture (the backend calls it when it issues the launch).
  // Drops the bf16 copy kept for the weight whose data is `data` (elems values; its memory too,
  // when no other weight's copy lies in it): the weight is about to be freed
  // (Backend::release_weight).
  void forget(const void* data, size_t elems, DeviceAllocator& mem);
  void cache_weights(cudaStream_t s, const MatArgs& a, int act, DeviceAllocator& mem, size_t budget_bytes);

  struct Impl;

 private:
  explicit Blas(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The launcher form (cuda_backend.h launch): b->run(s, a, M, act).
void blas_matmuls(cudaStream_t s, const Blas* b, MatArgs a, int M, int act);

}  // namespace g4::cuda
