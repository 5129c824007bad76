// The CUDA training arithmetic (backend/grad_arith.h): a CUDA backend with f32 activations owns
// the memory and runs the forward ops the tape takes as they are; the tape's own arithmetic runs
// as cuda_grad_kernels.h's kernels on that backend's stream, so every op runs in the tape's order
// without host waits. The tape's blocks (gradients, checkpoint copies, kept values) and the index
// lists it passes are stream-ordered allocations (cudaMallocAsync): a block freed while a queued
// kernel still reads it is released after that kernel. The products (the matmuls and the head)
// run on cuBLAS, where it loads and BackendOptions::blas is on, over weight rows dequantized a
// chunk at a time: in f32 (CUBLAS_COMPUTE_32F, no TF32), or, with BackendOptions::activations
// BF16, on bf16 operands (the activation rows and the weights rounded to bf16, as autocast runs
// them) with f32 accumulation and f32 results; the adapters' weight gradients stay f32. Without
// cuBLAS the reference kernels run (cuda_grad_kernels.h, f32 whatever the dtype), which tests
// compare both with. Every buffer is f32 either way.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_cublas.h"
#include "backend/cuda/cuda_grad_kernels.h"
#include "backend/grad_arith.h"

namespace g4 {
namespace {

using cuda_impl::CudaBackend;

class CudaGradArith final : public GradArith {
 public:
  explicit CudaGradArith(const BackendOptions& opt) : base_(std::make_unique<CudaBackend>(f32_options(opt))) {
    dev().make_current();
    bf16_ = opt.activations == DType::BF16;
    if (opt.blas) {
      std::string why;
      blas_ = cuda::Cublas::open(&why);
      if (!blas_) std::fprintf(stderr, "cuda training: %s; products on the reference kernels\n", why.c_str());
    }
    cudaMemPool_t pool;
    G4_CUDA(cudaDeviceGetDefaultMemPool(&pool, dev().id()));
    uint64_t keep = UINT64_MAX;  // freed blocks stay in the pool for the next ones
    G4_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep));
  }
  ~CudaGradArith() override {
    workspace_.reset();
    dequant_.reset();
    dev().sync();
    for (auto& [t, e] : rope_) cudaFree(e.dev);
  }

  Backend& base() override { return *base_; }

  void* alloc_bytes(size_t bytes, bool zero) override {
    dev().make_current();
    void* p = nullptr;
    G4_CUDA(cudaMallocAsync(&p, bytes == 0 ? 64 : bytes, stream()));
    if (zero && bytes) G4_CUDA(cudaMemsetAsync(p, 0, bytes, stream()));
    return p;
  }
  void free_bytes(void* p) override {
    dev().make_current();
    G4_CUDA(cudaFreeAsync(p, stream()));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) G4_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream()));
  }
  void zero(float* p, size_t n) override {
    if (n) G4_CUDA(cudaMemsetAsync(p, 0, n * 4, stream()));
  }
  void add_from_host(const float* host, size_t n, float* dst) override {
    const DeviceCopy<float> d(*this, host, n);
    cuda::grad::axpy_acc(stream(), 1.f, d.p, n, dst);
  }
  std::vector<int32_t> read_i32(const int32_t* p, size_t n) override {
    std::vector<int32_t> out(n);
    if (n) G4_CUDA(cudaMemcpyAsync(out.data(), p, n * 4, cudaMemcpyDeviceToHost, stream()));
    dev().sync();
    return out;
  }

  void add(const float* a, const float* b, size_t n, float* y) override { cuda::grad::add(stream(), a, b, n, y); }
  void scale(const float* a, float s, size_t n, float* y) override { cuda::grad::scale(stream(), a, s, n, y); }
  void axpy_acc(float s, const float* x, size_t n, float* y) override { cuda::grad::axpy_acc(stream(), s, x, n, y); }
  void softcap_fwd(float* x, size_t n, float cap) override { cuda::grad::softcap_fwd(stream(), x, n, cap); }
  void softcap_bwd(const float* x, size_t n, float cap, float* g) override {
    cuda::grad::softcap_bwd(stream(), x, n, cap, g);
  }
  void dropout_fwd(const float* x, size_t n, float p, uint64_t seed, float* y) override {
    cuda::grad::dropout_fwd(stream(), x, n, p, seed, y);
  }
  void dropout_bwd(const float* dy, size_t n, float p, uint64_t seed, float* dx) override {
    cuda::grad::dropout_bwd(stream(), dy, n, p, seed, dx);
  }
  void gelu_mul_fwd(const float* g, const float* u, size_t n, float* y) override {
    cuda::grad::gelu_mul_fwd(stream(), g, u, n, y);
  }
  void gelu_mul_bwd(const float* g, const float* u, const float* dy, size_t n, float* dg, float* du) override {
    cuda::grad::gelu_mul_bwd(stream(), g, u, dy, n, dg, du);
  }

  void rms_norm_fwd(const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv) override {
    cuda::grad::rms_norm_fwd(stream(), x, rows, dim, w, eps, y, inv);
  }
  void rms_norm_bwd(const float* x, const float* inv, int rows, int dim, const float* w, const float* dy,
                    float* dx) override {
    cuda::grad::rms_norm_bwd(stream(), x, inv, rows, dim, w, dy, dx);
  }
  void rope_fwd(float* x, int rows, int heads, int head_dim, int pos0, const RopeTable& t) override {
    cuda::grad::rope(stream(), x, rows, heads, head_dim, pos0, inv_freq(t, head_dim), t.position_scale, 1.f);
  }
  void rope_bwd(float* dx, int rows, int heads, int head_dim, int pos0, const RopeTable& t) override {
    cuda::grad::rope(stream(), dx, rows, heads, head_dim, pos0, inv_freq(t, head_dim), t.position_scale, -1.f);
  }
  void gather_rows(const float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) override {
    const DeviceCopy<int64_t> r(*this, rows);
    cuda::grad::gather_rows(stream(), src, r.p, rows.size(), dim, dst);
  }
  void scatter_rows_acc(const float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) override {
    const DeviceCopy<int64_t> r(*this, rows);
    cuda::grad::scatter_rows_acc(stream(), src, r.p, rows.size(), dim, dst);
  }
  void take_rows_acc(float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) override {
    const DeviceCopy<int64_t> r(*this, rows);
    cuda::grad::take_rows_acc(stream(), src, r.p, rows.size(), dim, dst);
  }
  void cols_acc(const float* src, int rows, int n, int dst_dim, int off, float* dst) override {
    cuda::grad::cols_acc(stream(), src, rows, n, dst_dim, off, dst);
  }
  void gather_scaled(const float* src, const std::vector<int64_t>& rows, const float* w,
                     const std::vector<int64_t>& widx, size_t dim, float* dst) override {
    const DeviceCopy<int64_t> r(*this, rows), wi(*this, widx);
    cuda::grad::gather_scaled(stream(), src, r.p, w, wi.p, rows.size(), dim, dst);
  }
  void scatter_scaled_acc(const float* src, const std::vector<int64_t>& rows, const float* w,
                          const std::vector<int64_t>& widx, size_t dim, float* dst) override {
    const DeviceCopy<int64_t> r(*this, rows), wi(*this, widx);
    cuda::grad::scatter_scaled_acc(stream(), src, r.p, w, wi.p, rows.size(), dim, dst);
  }
  void row_dots_acc(const float* a, const std::vector<int64_t>& rows, const float* b,
                    const std::vector<int64_t>& widx, size_t dim, float* out) override {
    const DeviceCopy<int64_t> r(*this, rows), wi(*this, widx);
    cuda::grad::row_dots_acc(stream(), a, r.p, b, wi.p, rows.size(), dim, out);
  }

  void matmul_wt(const float* x, int M, const WeightView& W, float* y) override {
    if (blas_) return products_wt(x, M, cuda_args::dev(W), 0, W.rows, y, W.rows);
    cuda::grad::matmul_wt(stream(), x, M, cuda_args::dev(W), y);
  }
  void matmul_w_acc(const float* dy, int M, const WeightView& W, float* dx) override {
    if (blas_) return products_w(dy, W.rows, M, cuda_args::dev(W), 0, W.rows, dx);
    cuda::grad::matmul_w_acc(stream(), dy, M, cuda_args::dev(W), dx);
  }
  void gemm_tn_acc(const float* a, const float* b, float* c, int M, int K, int N) override {
    if (!blas_) return cuda::grad::gemm_tn_acc(stream(), a, b, c, M, K, N);
    if (M == 0 || K == 0 || N == 0) return;
    bind_blas();  // c [K, N] row-major is cᵀ [N, K] column-major: cᵀ += bᵀ · a
    blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, N, K, M, 1.f, b, CUDA_R_32F, N, a, CUDA_R_32F, K, 1.f, c, CUDA_R_32F, N,
                CUBLAS_COMPUTE_32F);
  }

  // On cuBLAS: per head h (kv head g = h / (H / Hk)), f32 products over every [T, T] score (the
  // masked ones too) with the row steps between them; column-major views of the row-major [T, H, D]
  // and [T, Hk, D] rows (leading dimensions H·D, Hk·D) and of each head's [T, T] block.
  void attention_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                     float scale, float* probs, float* out) override {
    if (!blas_ || T == 0) return cuda::grad::attention_fwd(stream(), q, k, v, T, H, Hk, D, window, scale, probs, out);
    bind_blas();
    const int ldq = H * D, ldk = Hk * D;
    for (int h = 0; h < H; ++h) {  // scores: S_hᵀ = K_g · Q_hᵀ
      const int g = h / (H / Hk);
      blas_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, 1.f, k + g * D, CUDA_R_32F, ldk, q + h * D, CUDA_R_32F, ldq,
                  0.f, probs + size_t(h) * T * T, CUDA_R_32F, T, CUBLAS_COMPUTE_32F);
    }
    cuda::grad::attn_softmax(stream(), probs, T, H, window, scale);
    for (int h = 0; h < H; ++h) {  // out_hᵀ = V_gᵀ · P_hᵀ
      const int g = h / (H / Hk);
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, 1.f, v + g * D, CUDA_R_32F, ldk, probs + size_t(h) * T * T,
                  CUDA_R_32F, T, 0.f, out + h * D, CUDA_R_32F, ldq, CUBLAS_COMPUTE_32F);
    }
  }
  void attention_bwd(const float* q, const float* k, const float* v, const float* probs, const float* dout, int T,
                     int H, int Hk, int D, int window, float scale, float* dq, float* dk, float* dv) override {
    const ArithBlock scratch(*this, size_t(H) * size_t(T) * size_t(T) * 4, false);
    if (!blas_ || T == 0)
      return cuda::grad::attention_bwd(stream(), q, k, v, probs, dout, T, H, Hk, D, window, scale, dq, dk, dv,
                                       scratch.f32());
    bind_blas();
    const int ldq = H * D, ldk = Hk * D;
    float* dS = scratch.f32();
    for (int h = 0; h < H; ++h) {  // dP_hᵀ = V_g · dO_hᵀ
      const int g = h / (H / Hk);
      blas_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, 1.f, v + g * D, CUDA_R_32F, ldk, dout + h * D, CUDA_R_32F, ldq,
                  0.f, dS + size_t(h) * T * T, CUDA_R_32F, T, CUBLAS_COMPUTE_32F);
    }
    cuda::grad::attn_score_grad(stream(), probs, dS, T, H, window, scale);
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / Hk);
      const float* dSh = dS + size_t(h) * T * T;
      const float* Ph = probs + size_t(h) * T * T;
      // dq_hᵀ += K_gᵀ · dS_hᵀ;  dk_gᵀ += Q_hᵀ · dS_h;  dv_gᵀ += dO_hᵀ · P_h (the group's heads in order)
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, 1.f, k + g * D, CUDA_R_32F, ldk, dSh, CUDA_R_32F, T, 1.f,
                  dq + h * D, CUDA_R_32F, ldq, CUBLAS_COMPUTE_32F);
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, 1.f, q + h * D, CUDA_R_32F, ldq, dSh, CUDA_R_32F, T, 1.f,
                  dk + g * D, CUDA_R_32F, ldk, CUBLAS_COMPUTE_32F);
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, D, T, T, 1.f, dout + h * D, CUDA_R_32F, ldq, Ph, CUDA_R_32F, T, 1.f,
                  dv + g * D, CUDA_R_32F, ldk, CUBLAS_COMPUTE_32F);
    }
  }

  double lm_head_loss(const float* x, int M, const WeightView& E, float cap, const std::vector<int32_t>& targets,
                      float weight, float* dx) override {
    std::vector<int64_t> rows;  // the rows with targets, gathered
    std::vector<int32_t> tgt;
    for (int r = 0; r < M; ++r)
      if (targets[size_t(r)] >= 0) rows.push_back(r), tgt.push_back(targets[size_t(r)]);
    const int Mt = int(rows.size());
    if (Mt == 0) return 0.0;
    const int64_t V = E.rows, K = E.cols;
    const cuda::DevWeight W = cuda_args::dev(E);
    const DeviceCopy<int64_t> rdev(*this, rows);
    const DeviceCopy<int32_t> tdev(*this, tgt);
    const ArithBlock X(*this, size_t(Mt) * size_t(K) * 4, false);
    cuda::grad::gather_rows(stream(), x, rdev.p, rows.size(), size_t(K), X.f32());
    // Vocabulary chunks whose logits [Mt, n] take at most kHeadChunkFloats.
    const int64_t chunk = std::max<int64_t>(64, std::min<int64_t>(V, kHeadChunkFloats / Mt) / 64 * 64);
    const ArithBlock z(*this, size_t(Mt) * size_t(std::min(chunk, V)) * 4, false);
    const std::vector<float> neg(size_t(Mt), -INFINITY);
    const DeviceCopy<float> mx(*this, neg);
    const ArithBlock sm(*this, size_t(Mt) * 8, true), zt(*this, size_t(Mt) * 4, true), lse(*this, size_t(Mt) * 8, false),
        term(*this, size_t(Mt) * 8, false);
    auto* smp = static_cast<double*>(sm.data());
    auto* lsep = static_cast<double*>(lse.data());
    for (int64_t r0 = 0; r0 < V; r0 += chunk) {
      const int n = int(std::min(chunk, V - r0));
      head_logits(X.f32(), Mt, W, r0, n, z.f32());
      cuda::grad::head_lse(stream(), z.f32(), Mt, n, r0, cap, tdev.p, mx.p, smp, zt.f32());
    }
    cuda::grad::head_finish(stream(), Mt, mx.p, smp, zt.f32(), lsep, static_cast<double*>(term.data()));
    std::vector<double> terms(static_cast<size_t>(Mt));
    G4_CUDA(cudaMemcpyAsync(terms.data(), term.data(), terms.size() * 8, cudaMemcpyDeviceToHost, stream()));
    dev().sync();
    double total = 0.0;
    for (double t : terms) total += t;
    if (dx) {
      const ArithBlock dX(*this, size_t(Mt) * size_t(K) * 4, true);
      for (int64_t r0 = 0; r0 < V; r0 += chunk) {
        const int n = int(std::min(chunk, V - r0));
        head_logits(X.f32(), Mt, W, r0, n, z.f32());
        cuda::grad::head_grad(stream(), z.f32(), Mt, n, r0, cap, tdev.p, lsep, weight);
        if (blas_) products_w(z.f32(), n, Mt, W, r0, n, dX.f32());
        else cuda::grad::head_back(stream(), z.f32(), Mt, n, W, r0, dX.f32());
      }
      cuda::grad::scatter_rows_acc(stream(), dX.f32(), rdev.p, rows.size(), size_t(K), dx);
    }
    return total;
  }

  void router_bwd(const float* scores, const std::vector<int32_t>& idx_host, const float* dw, int rows, int E, int k,
                  const float* per_expert_scale, float* ds) override {
    G4_CHECK(k <= 32 && "CUDA router backward: at most 32 experts per token");
    const DeviceCopy<int32_t> idx(*this, idx_host);
    cuda::grad::router_bwd(stream(), scores, idx.p, dw, rows, E, k, per_expert_scale, ds);
  }

 private:
  // A host array copied to a stream-ordered device allocation, freed (in stream order) with it.
  template <class T>
  struct DeviceCopy {
    DeviceCopy(CudaGradArith& a, const T* host, size_t n) : a(a) {
      p = static_cast<T*>(a.alloc_bytes(n * sizeof(T), false));
      if (n) G4_CUDA(cudaMemcpyAsync(p, host, n * sizeof(T), cudaMemcpyHostToDevice, a.stream()));
    }
    DeviceCopy(CudaGradArith& a, const std::vector<T>& v) : DeviceCopy(a, v.data(), v.size()) {}
    ~DeviceCopy() { a.free_bytes(p); }
    DeviceCopy(const DeviceCopy&) = delete;
    DeviceCopy& operator=(const DeviceCopy&) = delete;
    CudaGradArith& a;
    T* p = nullptr;
  };
  static constexpr int64_t kHeadChunkFloats = int64_t(1) << 25;  // 128 MiB of logits per chunk
  static constexpr int64_t kDequantFloats = int64_t(1) << 25;    // 128 MiB of f32 weight rows
  static constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;
  struct RopeCopy {
    std::vector<float> host;
    float* dev = nullptr;
  };

  // z [M, n] = X [M, E.cols] · E[r0 : r0 + n]ᵀ.
  void head_logits(const float* X, int M, const cuda::DevWeight& E, int64_t r0, int n, float* z) {
    if (blas_) return products_wt(X, M, E, r0, n, z, n);
    cuda::grad::head_logits(stream(), X, M, E, r0, n, z);
  }
  void bind_blas() {
    if (workspace_.empty()) workspace_ = ArithBlock(*this, kBlasWorkspaceBytes, false);
    blas_->bind(stream(), workspace_.data(), kBlasWorkspaceBytes);
  }
  // Rows r0 + n0 .. r0 + n0 + n - 1 of W as f32 rows of W.cols: in place when W is plain f32, else
  // dequantized into the scratch (at most rows_per_chunk(W) rows).
  const __nv_bfloat16* bf16_rows(const cuda::DevWeight& W, int64_t row, int64_t n) {
    if (W.fmt == WFormat::BF16 && W.row_bytes == W.cols * 2)
      return reinterpret_cast<const __nv_bfloat16*>(W.data + row * W.row_bytes);
    if (dequant_.empty()) dequant_ = ArithBlock(*this, size_t(kDequantFloats) * 4, false);
    auto* out = static_cast<__nv_bfloat16*>(dequant_.data());
    cuda::grad::dequant_rows_bf16(stream(), W, row, n, out);
    return out;
  }
  // x [n] rounded to bf16, in a block of its own.
  ArithBlock bf16_copy(const float* x, size_t n) {
    ArithBlock b(*this, n * 2, false);
    cuda::grad::to_bf16(stream(), x, n, static_cast<__nv_bfloat16*>(b.data()));
    return b;
  }
  const float* f32_rows(const cuda::DevWeight& W, int64_t row, int64_t n) {
    if (W.fmt == WFormat::F32 && W.row_bytes == W.cols * 4) return reinterpret_cast<const float*>(W.data + row * W.row_bytes);
    if (dequant_.empty()) dequant_ = ArithBlock(*this, size_t(kDequantFloats) * 4, false);
    cuda::grad::dequant_rows_f32(stream(), W, row, n, dequant_.f32());
    return dequant_.f32();
  }
  static int64_t rows_per_chunk(const cuda::DevWeight& W) { return std::max<int64_t>(1, kDequantFloats / W.cols); }
  // y[m, j] = Σ_k x[m, k] · W[r0 + j, k] for m < M, j < N (y rows of ldy): column-major, yᵀ = W·xᵀ.
  void products_wt(const float* x, int M, const cuda::DevWeight& W, int64_t r0, int64_t N, float* y, int64_t ldy) {
    if (M == 0 || N == 0) return;
    bind_blas();
    const int K = int(W.cols);
    const ArithBlock xb = bf16_ ? bf16_copy(x, size_t(M) * size_t(K)) : ArithBlock();
    const cudaDataType t = bf16_ ? CUDA_R_16BF : CUDA_R_32F;
    const void* B = bf16_ ? xb.data() : static_cast<const void*>(x);
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_chunk(W)) {
      const int nc = int(std::min(rows_per_chunk(W), N - n0));
      const void* A = bf16_ ? static_cast<const void*>(bf16_rows(W, r0 + n0, nc)) : f32_rows(W, r0 + n0, nc);
      blas_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, nc, M, K, 1.f, A, t, K, B, t, K, 0.f, y + n0, CUDA_R_32F, int(ldy),
                  CUBLAS_COMPUTE_32F);
    }
  }
  // dx[m, k] += Σ_j dy[m, j] · W[r0 + j, k] for m < M, j < N (dy rows of ldd): dxᵀ += Wᵀ·dyᵀ.
  void products_w(const float* dy, int64_t ldd, int M, const cuda::DevWeight& W, int64_t r0, int64_t N, float* dx) {
    if (M == 0 || N == 0) return;
    bind_blas();
    const int K = int(W.cols);
    const ArithBlock db = bf16_ ? bf16_copy(dy, size_t(M) * size_t(ldd)) : ArithBlock();
    const cudaDataType t = bf16_ ? CUDA_R_16BF : CUDA_R_32F;
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_chunk(W)) {
      const int nc = int(std::min(rows_per_chunk(W), N - n0));
      const void* A = bf16_ ? static_cast<const void*>(bf16_rows(W, r0 + n0, nc)) : f32_rows(W, r0 + n0, nc);
      const void* B = bf16_ ? static_cast<const void*>(static_cast<const __nv_bfloat16*>(db.data()) + n0)
                            : static_cast<const void*>(dy + n0);
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_N, K, M, nc, 1.f, A, t, K, B, t, int(ldd), 1.f, dx, CUDA_R_32F, K,
                  CUBLAS_COMPUTE_32F);
    }
  }

  // The base backend's: f32 buffers (BackendOptions::activations only picks the products' operands).
  static BackendOptions f32_options(BackendOptions o) {
    o.activations = DType::F32;
    return o;
  }
  const cuda::Device& dev() const { return base_->device(); }
  cudaStream_t stream() const { return dev().stream(); }
  // The table's inverse frequencies (head_dim / 2) on the device, uploaded once per table (again
  // when a table at the same address holds other values).
  const float* inv_freq(const RopeTable& t, int head_dim) {
    G4_CHECK(t.inv_freq.size() >= size_t(head_dim / 2) && "RoPE table shorter than half the head");
    RopeCopy& c = rope_[&t];
    if (c.dev && c.host == t.inv_freq) return c.dev;
    dev().sync();  // an earlier upload may still be read
    if (c.dev) cudaFree(c.dev);
    G4_CUDA(cudaMalloc(&c.dev, t.inv_freq.size() * 4));
    G4_CUDA(cudaMemcpy(c.dev, t.inv_freq.data(), t.inv_freq.size() * 4, cudaMemcpyHostToDevice));
    c.host = t.inv_freq;
    return c.dev;
  }

  std::unique_ptr<CudaBackend> base_;
  std::unique_ptr<cuda::Cublas> blas_;  // null: the reference kernels
  bool bf16_ = false;                    // the products on bf16 operands
  ArithBlock workspace_, dequant_;       // cuBLAS's workspace; f32 weight rows for its products
  std::unordered_map<const RopeTable*, RopeCopy> rope_;
};

}  // namespace

std::unique_ptr<GradArith> make_cuda_grad_arith(std::string* why, const BackendOptions& opt) {
  if (!cuda::device_usable(opt.device, why)) return nullptr;
  return std::make_unique<CudaGradArith>(opt);
}

}  // namespace g4
