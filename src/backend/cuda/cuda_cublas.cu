// cuBLAS loaded at run time (cuda_cublas.h).
#include "backend/cuda/cuda_cublas.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace g4::cuda {

struct Cublas::Fns {
  void* lib = nullptr;
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSetWorkspace_v2) set_workspace = nullptr;
  // The 32-bit-size cublasGemmEx (C++ also sees a 64-bit overload).
  using GemmFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                                    const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                                    cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmFn gemm = nullptr;
  using GemmBatchedFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void*, const void*, cudaDataType, int, long long, const void*,
                                           cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                           long long, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmBatchedFn gemm_batched = nullptr;
  cublasHandle_t handle = nullptr;

  ~Fns() {
    if (handle) destroy(handle);
    if (lib) dlclose(lib);
  }
};

namespace {
void check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "cuBLAS error %d in %s\n", int(st), what);
  std::abort();
}
}  // namespace

std::unique_ptr<Cublas> Cublas::open(std::string* why) {
  auto f = std::make_unique<Fns>();
  for (const char* name : {"libcublas.so.13", "/usr/local/cuda/lib64/libcublas.so.13", "libcublas.so.12",
                           "/usr/local/cuda/lib64/libcublas.so.12", "libcublas.so"}) {
    if ((f->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL))) break;
  }
  if (!f->lib) {
    if (why) *why = "cuBLAS not found (libcublas.so.13 or .12)";
    return nullptr;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(f->lib, name));
    return fn != nullptr;
  };
  if (!sym(f->create, "cublasCreate_v2") || !sym(f->destroy, "cublasDestroy_v2") ||
      !sym(f->set_stream, "cublasSetStream_v2") || !sym(f->set_workspace, "cublasSetWorkspace_v2") ||
      !sym(f->gemm, "cublasGemmEx") || !sym(f->gemm_batched, "cublasGemmStridedBatchedEx")) {
    if (why) *why = "cuBLAS lacks an entry point this build uses";
    return nullptr;
  }
  if (f->create(&f->handle) != CUBLAS_STATUS_SUCCESS) {
    f->handle = nullptr;
    if (why) *why = "cublasCreate failed";
    return nullptr;
  }
  return std::unique_ptr<Cublas>(new Cublas(std::move(f)));
}

Cublas::Cublas(std::unique_ptr<Fns> f) : f_(std::move(f)) {}
Cublas::~Cublas() = default;

void Cublas::bind(cudaStream_t s, void* workspace, size_t workspace_bytes) const {
  check(f_->set_stream(f_->handle, s), "cublasSetStream");
  check(f_->set_workspace(f_->handle, workspace, workspace_bytes), "cublasSetWorkspace");
}

void Cublas::gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
                  cudaDataType at, int lda, const void* B, cudaDataType bt, int ldb, float beta, void* C,
                  cudaDataType ct, int ldc, cublasComputeType_t compute) const {
  check(f_->gemm(f_->handle, ta, tb, m, n, k, &alpha, A, at, lda, B, bt, ldb, &beta, C, ct, ldc, compute,
                 CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
}

void Cublas::gemm_batched(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* A,
                          cudaDataType at, int lda, long long sa, const void* B, cudaDataType bt, int ldb,
                          long long sb, float beta, void* C, cudaDataType ct, int ldc, long long sc, int batch,
                          cublasComputeType_t compute) const {
  check(f_->gemm_batched(f_->handle, ta, tb, m, n, k, &alpha, A, at, lda, sa, B, bt, ldb, sb, &beta, C, ct, ldc, sc,
                         batch, compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

}  // namespace g4::cuda
