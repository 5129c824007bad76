// cuBLAS loaded at run time (libcublas.so.13, or .12): one handle and the entry points this build
// calls. The binary does not depend on the toolkit's largest library, and runs on the kernels of
// its callers' fallbacks where it is missing. Used by the prefill GEMMs (cuda_blas.h) and the
// training arithmetic's products (cuda_grad_arith.cu). Failing calls abort with cuBLAS's status.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <string>

namespace g4::cuda {

class Cublas {
 public:
  // Null, with the reason in *why, when the library, an entry point or a handle is missing.
  static std::unique_ptr<Cublas> open(std::string* why);
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  // Every call after this runs on stream s with the given workspace.
  void bind(cudaStream_t s, void* workspace, size_t workspace_bytes) const;
  // cublasGemmEx, column-major: C[m, n] = alpha · op(A)[m, k] · op(B)[k, n] + beta · C.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
            cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, float beta, void* C, cudaDataType ct,
            int ldc, cublasComputeType_t compute) const;
  // cublasGemmStridedBatchedEx: `batch` such products, the i-th on A + i·sa, B + i·sb, C + i·sc
  // (strides in elements; 0 reuses one operand).
  void gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
                    cudaDataType at, int lda, long long sa, const void* B, cudaDataType bt, int ldb, long long sb,
                    float beta, void* C, cudaDataType ct, int ldc, long long sc, int batch,
                    cublasComputeType_t compute) const;

  struct Fns;

 private:
  explicit Cublas(std::unique_ptr<Fns> f);
  std::unique_ptr<Fns> f_;
};

}  // namespace g4::cuda
