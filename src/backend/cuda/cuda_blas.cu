// Prefill GEMMs through cuBLAS (cuda_blas.h): dequantize a chunk of weight rows to bf16, norm the
// input rows once per row block, one cublasGemmEx per (chunk, row block); gate/up launches write
// both products into an f32 scratch and a small kernel applies gelu(gate)·up.
//
// Why cuBLAS and not our own MMA kernel: the issue allows cuBLAS for bf16 weights, and once the
// weights are bf16 in memory nothing we would write by hand beats its Hopper kernels; the bf16
// copy costs 4 bytes a weight of extra traffic, small next to the GEMM at prefill row counts.
#include "backend/cuda/cuda_blas.h"

#include <algorithm>
#include <unordered_map>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_alloc.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_cublas.h"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_dequant8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma_bf16.cuh"

namespace g4::cuda {
namespace {

constexpr size_t kWeightBytes = size_t(96) << 20;  // one chunk of bf16 weight rows (gate and up: both)
constexpr size_t kActBytes = size_t(32) << 20;     // gate/up products of one chunk, f32
constexpr size_t kCopyHeadroom = size_t(2) << 30;  // device memory a bf16 weight copy leaves free
constexpr size_t kWorkspaceBytes = size_t(32) << 20;
constexpr int kThreads = 256;

// Whether w's rows are plain bf16 already (cuBLAS reads them in place: no scratch, no copy).
bool plain_bf16(const DevWeight& w) { return w.fmt == WFormat::BF16 && w.row_bytes == w.cols * 2; }

// Rows r0 .. r0 + nrows of w as bf16 rows of w.cols: a thread per quarter of a 32-value unit
// (dequant8; adjacent threads read adjacent bytes), 8 values stored in one 16-byte write.
template <WFormat F>
__global__ void __launch_bounds__(kThreads) dequant_rows_kernel(DevWeight w, int64_t r0, int nrows, bf16* out) {
  pdl_enter();
  const int64_t units = w.cols / 32;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= int64_t(nrows) * units * 4) return;
  const int64_t q = i / 4, rr = q / units, u = q % units, r = r0 + rr;
  const int p = int(i % 4);
  float v[8];
  dequant8<F>(w.data + r * w.row_bytes, w, r, u, p, v);
  store_bf16x8(v, out + rr * w.cols + u * 32 + 8 * p);
}

// y[m, n0 + j] = gelu(t[m, j]) · t[m, nc + j] for m < rows, j < nc; t rows of 2·nc f32.
__global__ void __launch_bounds__(kThreads) gelu_mul_kernel(const float* t, int rows, int nc, void* y, int64_t ldy,
                                                            int64_t n0, bool y_f32, const uint16_t* table) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= int64_t(rows) * nc) return;
  const int64_t m = i / nc, j = i % nc;
  const float g = t[m * 2 * nc + j], u = t[m * 2 * nc + nc + j];
  store_out(y, m * ldy + n0 + j, table ? gelu_ggml_mul(g, u, table) : gelu_tanh_mul(g, u), y_f32);
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

void dequant_rows(cudaStream_t s, const DevWeight& w, int64_t r0, int nrows, bf16* out) {
  with_format(w.fmt, [&](auto f) {
    launch_kernel(dequant_rows_kernel<decltype(f)::value>, dim3(blocks_for(int64_t(nrows) * (w.cols / 32) * 4)),
                  dim3(kThreads), 0, s, w, r0, nrows, out);
  });
  G4_CUDA_LAUNCHED();
}

}  // namespace

// cuBLAS (loaded at run time, cuda_cublas.h) and the scratch of the launches.
struct Blas::Impl {
  std::unique_ptr<Cublas> lib;
  bf16* weights = nullptr;  // kWeightBytes
  bf16* input = nullptr;    // kBlasRowBlock × kBlasMaxCols normed input rows
  float* act = nullptr;     // kActBytes
  void* workspace = nullptr;
  std::unordered_map<const uint8_t*, bf16*> copies;  // bf16 copies of weights, by their data
  size_t copy_bytes = 0;
  bool out_of_room = false;  // a copy was refused for want of device memory: none is tried again
  // w's rows as bf16 without dequantizing: in place when plain bf16, else its kept copy; or null.
  const bf16* bf16_rows(const DevWeight& w) const {
    if (plain_bf16(w)) return reinterpret_cast<const bf16*>(w.data);
    const auto it = copies.find(w.data);
    return it == copies.end() ? nullptr : it->second;
  }

  // C[n, m] (column-major, ldc) = A[k, n]ᵀ · B[k, m]: y rows of length n from m input rows of k.
  void gemm_rows(int n, int m, int k, const bf16* A, int lda, const bf16* B, void* C, cudaDataType ct, int ldc) const {
    lib->gemm(CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, 1.f, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, k, 0.f, C, ct, ldc,
              CUBLAS_COMPUTE_32F);
  }
};

Blas::Blas(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Blas::~Blas() = default;

std::unique_ptr<Blas> Blas::create(DeviceAllocator& mem, std::string* why) {
  auto impl = std::make_unique<Impl>();
  if (!(impl->lib = Cublas::open(why))) return nullptr;
  impl->weights = static_cast<bf16*>(mem.alloc(kWeightBytes));
  impl->input = static_cast<bf16*>(mem.alloc(size_t(kBlasRowBlock) * size_t(kBlasMaxCols) * 2));
  impl->act = static_cast<float*>(mem.alloc(kActBytes));
  impl->workspace = mem.alloc(kWorkspaceBytes);
  return std::unique_ptr<Blas>(new Blas(std::move(impl)));
}

bool Blas::applies(const MatArgs& a, int M, int min_rows) const {
  if (a.xt != DType::BF16 || M < min_rows || a.resid || a.pre_y || a.defer_post || a.n < 1 || a.n > 3 ||
      (a.yt != DType::BF16 && a.yt != DType::F32))
    return false;
  for (int i = 0; i < a.n; ++i)
    if (a.w[i].cols % 32 != 0 || a.w[i].cols > kBlasMaxCols || a.w[i].cols != a.w[0].cols) return false;
  return true;
}

namespace {
// The GEMMs of a launch and the weights each reads: one per weight of a matmuls launch (n = 1);
// gate_up_gelu's one, over gate and up (n = 2).
struct GemmWeights {
  const DevWeight* w[2];
  int n;
};
int gemm_count(const MatArgs& a, int act) { return act ? 1 : a.n; }
GemmWeights gemm_weights(const MatArgs& a, int act, int i) {
  return act ? GemmWeights{{&a.w[0], &a.w2}, 2} : GemmWeights{{&a.w[i], nullptr}, 1};
}
}  // namespace

bool Blas::reads_bf16(const MatArgs& a, int act) const {
  for (int i = 0; i < gemm_count(a, act); ++i) {
    const GemmWeights g = gemm_weights(a, act, i);
    for (int j = 0; j < g.n; ++j)
      if (!impl_->bf16_rows(*g.w[j])) return false;
  }
  return true;
}

void Blas::run(cudaStream_t s, const MatArgs& a, int M, int act) const {
  const Impl& b = *impl_;
  b.lib->bind(s, b.workspace, kWorkspaceBytes);
  const int64_t K = a.w[0].cols;
  const size_t ysize = a.yt == DType::F32 ? 4 : 2;
  const cudaDataType yct = a.yt == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
  for (int m0 = 0; m0 < M; m0 += kBlasRowBlock) {
    const int mb = std::min(kBlasRowBlock, M - m0);
    const bf16* x = static_cast<const bf16*>(a.x) + int64_t(m0) * K;
    if (a.norm_w) {  // the block's rows normed once, for every weight of the launch
      rms_norm(s, x, mb, int(K), a.norm_w, a.eps, b.input, DType::BF16);
      x = b.input;
    }
    for (int i = 0; i < gemm_count(a, act); ++i) {
      const GemmWeights g = gemm_weights(a, act, i);
      const DevWeight& w = *g.w[0];
      const int64_t N = w.rows;
      uint8_t* y = static_cast<uint8_t*>(a.y[i]) + size_t(m0) * size_t(N) * ysize;
      const bf16* copy = b.bf16_rows(w);
      const bf16* copy2 = act ? b.bf16_rows(*g.w[1]) : nullptr;
      const bool copied = copy && (!act || copy2);  // every weight of the GEMM read as bf16 in place
      // Rows per chunk: what the weight scratch holds (gate and up side by side) when the weights
      // are dequantized into it (read in place: no bound), and for gate/up what the f32 product
      // scratch holds; whole multiples of 128 rows except the last.
      int64_t nc = copied ? N : int64_t(kWeightBytes / (size_t(K) * 2 * (act ? 2 : 1)));
      if (act) nc = std::min<int64_t>(nc, int64_t(kActBytes / (size_t(mb) * 2 * 4)));
      if (nc < N) nc = std::max<int64_t>(128, nc / 128 * 128);
      nc = std::min(nc, N);
      // Gate and up copied side by side (cache_weights) and one chunk: one GEMM over both.
      const bool one_gemm = copied && act && copy2 == copy + N * K && nc >= N;
      if (one_gemm) nc = N;
      for (int64_t n0 = 0; n0 < N; n0 += nc) {
        const int n = int(std::min(nc, N - n0));
        const bf16* A = b.weights;
        if (copied) A = copy + n0 * K;
        else dequant_rows(s, w, n0, n, b.weights);
        if (!act) {
          b.gemm_rows(n, mb, int(K), A, int(K), x, y + size_t(n0) * ysize, yct, int(N));
          continue;
        }
        if (one_gemm) {
          b.gemm_rows(2 * n, mb, int(K), copy, int(K), x, b.act, CUDA_R_32F, 2 * n);
        } else if (copied) {  // gate and up products side by side, as from one GEMM over both
          b.gemm_rows(n, mb, int(K), A, int(K), x, b.act, CUDA_R_32F, 2 * n);
          b.gemm_rows(n, mb, int(K), copy2 + n0 * K, int(K), x, b.act + n, CUDA_R_32F, 2 * n);
        } else {
          dequant_rows(s, *g.w[1], n0, n, b.weights + int64_t(n) * K);
          b.gemm_rows(2 * n, mb, int(K), A, int(K), x, b.act, CUDA_R_32F, 2 * n);
        }
        launch_kernel(gelu_mul_kernel, dim3(blocks_for(int64_t(mb) * n)), dim3(kThreads), 0, s,
                      static_cast<const float*>(b.act), mb, n, static_cast<void*>(y), N, n0, a.yt == DType::F32,
                      act == 2 ? a.table : static_cast<const uint16_t*>(nullptr));
        G4_CUDA_LAUNCHED();
      }
    }
  }
}

void Blas::cache_weights(cudaStream_t s, const MatArgs& a, int act, DeviceAllocator& mem, size_t budget_bytes) {
  Impl& b = *impl_;
  // gate_up_gelu's two weights are copied together, gate then up in one allocation (run reads
  // both with one GEMM); matmul launches' weights one by one.
  for (int i = 0; i < gemm_count(a, act) && !b.out_of_room; ++i) {
    const GemmWeights g = gemm_weights(a, act, i);
    size_t bytes = 0;
    bool wanted = false;
    for (int j = 0; j < g.n; ++j) {
      bytes += size_t(g.w[j]->rows) * size_t(g.w[j]->cols) * 2;
      wanted |= !b.bf16_rows(*g.w[j]);
    }
    if (!wanted || b.copy_bytes + bytes > budget_bytes) continue;
    // A copy is only made while kCopyHeadroom of device memory stays free (KV caches grow later):
    // a budget larger than the device leaves the rest dequantized per launch, never out of memory.
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess || free_bytes < bytes + kCopyHeadroom) {
      b.out_of_room = true;  // later launches do not ask the device again
      return;
    }
    bf16* d = static_cast<bf16*>(mem.alloc(bytes));
    for (int j = 0; j < g.n; ++j) {
      const DevWeight& w = *g.w[j];
      for (int64_t r0 = 0; r0 < w.rows; r0 += 65536)
        dequant_rows(s, w, r0, int(std::min<int64_t>(65536, w.rows - r0)), d + r0 * w.cols);
      if (!b.copies.count(w.data)) b.copies[w.data] = d;  // a weight copied before keeps that copy
      d += w.rows * w.cols;
    }
    b.copy_bytes += bytes;
  }
}

void Blas::forget(const void* data, size_t elems, DeviceAllocator& mem) {
  Impl& b = *impl_;
  const auto it = b.copies.find(static_cast<const uint8_t*>(data));
  if (it == b.copies.end()) return;
  bf16* copy = it->second;
  b.copies.erase(it);
  for (const auto& [w, c] : b.copies)
    if (c >= copy && c < copy + elems) return;  // another weight's copy lies in that memory (gate/up pairs)
  mem.free(copy, /*deferred=*/false);  // an allocation's start (a single weight's copy); else ignored by the allocator
  b.copy_bytes -= std::min(b.copy_bytes, elems * 2);
}

void blas_matmuls(cudaStream_t s, const Blas* b, MatArgs a, int M, int act) { b->run(s, a, M, act); }

}  // namespace g4::cuda
