// The CUDA training arithmetic (backend/grad_arith.h): a CUDA backend with f32 activations owns
// the memory and runs the forward ops the tape takes as they are; the tape's own arithmetic runs
// as cuda_grad_kernels.h's kernels on that backend's stream, so every op runs in the tape's order
// without host waits. The tape's blocks (gradients, checkpoint copies, kept values) and the index
// lists it passes are stream-ordered allocations (cudaMallocAsync): a block freed while a queued
// kernel still reads it is released after that kernel. The products (the matmuls, the head, the
// attention's and the LoRA deltas') run on cuBLAS, where it loads and BackendOptions::blas is on;
// weights are dequantized a chunk of rows at a time. In f32 (CUBLAS_COMPUTE_32F, no TF32), or,
// with BackendOptions::activations BF16, on bf16 operands with f32 accumulation and f32 results,
// as autocast runs them: the matmuls over weights of more than kF32MaxRows rows, the head, and the
// attention (q, k, v, the probs and their gradients rounded). The LoRA deltas and narrow weights
// (routers) stay f32. Without cuBLAS the reference kernels run (cuda_grad_kernels.h, f32 whatever
// the dtype), which tests compare both with. Every buffer is f32 either way.
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
    cache_left_ = bf16_ ? size_t(std::max(0, opt.bf16_weight_cache_gib)) << 30 : 0;
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
    bf16_cache_.clear();
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
    scatter_grouped(src, rows, nullptr, nullptr, dim, dst);
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
    const DeviceCopy<int64_t> wi(*this, widx);
    scatter_grouped(src, rows, w, wi.p, dim, dst);
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

  // On cuBLAS, f32 whatever the dtype (the rank-r products are small; autocast's bf16 would round
  // the adapters' own updates): the scale folds into the products' alpha and the delta adds into
  // y as the second product's beta, so no [M, out] temporary is formed. Column-major: x [in, M],
  // A [in, r], B [r, out], t [r, M], y and dy [out, M], each of leading dimension its rows.
  void lora_fwd(const float* x, int M, const WeightView& A, const WeightView& B, float s, float* t,
                float* y) override {
    if (!blas_ || M == 0) return GradArith::lora_fwd(x, M, A, B, s, t, y);
    bind_blas();
    const int r = int(A.rows), in = int(A.cols), out = int(B.rows);
    blas_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, r, M, in, 1.f, f32_of(A), CUDA_R_32F, in, x, CUDA_R_32F, in, 0.f, t,
                CUDA_R_32F, r, CUBLAS_COMPUTE_32F);
    blas_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, out, M, r, s, f32_of(B), CUDA_R_32F, r, t, CUDA_R_32F, r, 1.f, y,
                CUDA_R_32F, out, CUBLAS_COMPUTE_32F);
  }
  void lora_bwd(const float* x, const float* t, const float* dy, int M, const WeightView& A, const WeightView& B,
                float s, float* gA, float* gB, float* dx) override {
    if (!blas_ || M == 0) return GradArith::lora_bwd(x, t, dy, M, A, B, s, gA, gB, dx);
    bind_blas();
    const int r = int(A.rows), in = int(A.cols), out = int(B.rows);
    const ArithBlock dt(*this, size_t(M) * size_t(r) * 4, false);
    // gB [r, out] += s · t · dyᵀ;  dt [r, M] = s · B · dy
    blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, r, out, M, s, t, CUDA_R_32F, r, dy, CUDA_R_32F, out, 1.f, gB, CUDA_R_32F,
                r, CUBLAS_COMPUTE_32F);
    blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_N, r, M, out, s, f32_of(B), CUDA_R_32F, r, dy, CUDA_R_32F, out, 0.f,
                dt.f32(), CUDA_R_32F, r, CUBLAS_COMPUTE_32F);
    // gA [in, r] += x · dtᵀ;  dx [in, M] += A · dt
    blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, in, r, M, 1.f, x, CUDA_R_32F, in, dt.f32(), CUDA_R_32F, r, 1.f, gA,
                CUDA_R_32F, in, CUBLAS_COMPUTE_32F);
    if (dx)
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_N, in, M, r, 1.f, f32_of(A), CUDA_R_32F, in, dt.f32(), CUDA_R_32F, r, 1.f,
                  dx, CUDA_R_32F, in, CUBLAS_COMPUTE_32F);
  }

  // On cuBLAS: per head h (kv head g = h / (H / Hk)), f32 products over every [T, T] score (the
  // masked ones too) with the row steps between them; column-major views of the row-major [T, H, D]
  // and [T, Hk, D] rows (leading dimensions H·D, Hk·D) and of each head's [T, T] block.
  void attention_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                     float scale, float* probs, float* out) override {
    if (!blas_ || T == 0) return cuda::grad::attention_fwd(stream(), q, k, v, T, H, Hk, D, window, scale, probs, out);
    bind_blas();
    if (bf16_) return attention_fwd_bf16(q, k, v, T, H, Hk, D, window, scale, probs, out);
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
    if (bf16_) return attention_bwd_bf16(q, k, v, probs, dout, T, H, Hk, D, window, scale, dq, dk, dv, scratch.f32());
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
      scatter_grouped(dX.f32(), rows, nullptr, nullptr, size_t(K), dx);
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
  // dst[rows[i]] += (w ? w[widx[i]] : 1)·src[i], rows in index order (cuda_grad_kernels.h's plan:
  // the destination rows, each group's start, the sources by row then index).
  void scatter_grouped(const float* src, const std::vector<int64_t>& rows, const float* w, const int64_t* widx,
                       size_t dim, float* dst) {
    const size_t n = rows.size();
    if (n == 0 || dim == 0) return;
    std::vector<int64_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = int64_t(i);
    if (!std::is_sorted(rows.begin(), rows.end()))
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return rows[size_t(a)] < rows[size_t(b)]; });
    std::vector<int64_t> dst_rows, starts;
    for (size_t j = 0; j < n; ++j)
      if (j == 0 || rows[size_t(order[j])] != rows[size_t(order[j - 1])])
        dst_rows.push_back(rows[size_t(order[j])]), starts.push_back(int64_t(j));
    starts.push_back(int64_t(n));
    std::vector<int64_t> plan = std::move(dst_rows);
    const size_t groups = plan.size();
    plan.insert(plan.end(), starts.begin(), starts.end());
    plan.insert(plan.end(), order.begin(), order.end());
    const DeviceCopy<int64_t> p(*this, plan);
    cuda::grad::scatter_grouped_acc(stream(), src, w, widx, p.p, groups, dim, dst);
  }
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
    if (const __nv_bfloat16* whole = cached_bf16(W)) return whole + row * W.cols;
    if (dequant_.empty()) dequant_ = ArithBlock(*this, size_t(kDequantFloats) * 4, false);
    auto* out = static_cast<__nv_bfloat16*>(dequant_.data());
    cuda::grad::dequant_rows_bf16(stream(), W, row, n, out);
    return out;
  }
  // W's bf16 copy, made at its first use while BackendOptions::bf16_weight_cache_gib has room and
  // 2 GiB of device memory stay free, and kept (the weights do not change while training); null:
  // no room.
  const __nv_bfloat16* cached_bf16(const cuda::DevWeight& W) {
    const auto it = bf16_cache_.find(W.data);
    if (it != bf16_cache_.end())  // a view of another extent at this address goes uncached
      return it->second.rows == W.rows && it->second.cols == W.cols ? it->second.bf16() : nullptr;
    const size_t bytes = size_t(W.rows) * size_t(W.cols) * 2;
    size_t free = 0, total = 0;
    if (bytes > cache_left_ || cudaMemGetInfo(&free, &total) != cudaSuccess || free < bytes + (size_t(2) << 30))
      return nullptr;  // as the inference cache (cuda_blas.h): 2 GiB stay free
    cache_left_ -= bytes;
    CachedWeight& c = bf16_cache_[W.data];
    c.block = ArithBlock(*this, bytes, false);
    c.rows = W.rows, c.cols = W.cols;
    cuda::grad::dequant_rows_bf16(stream(), W, 0, W.rows, static_cast<__nv_bfloat16*>(c.block.data()));
    return c.bf16();
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
  // Whether a product over W runs on bf16 operands: with BackendOptions::activations BF16, every
  // weight of more than kF32MaxRows rows. Narrower ones (an MoE router's [experts, hidden], a
  // per-layer-input gate) stay f32: they cost little, and a router's top-k is where a bf16
  // rounding would flip a discrete choice.
  static constexpr int64_t kF32MaxRows = 256;
  bool on_bf16(const cuda::DevWeight& W) const { return bf16_ && W.rows > kF32MaxRows; }
  static int64_t rows_per_chunk(const cuda::DevWeight& W) { return std::max<int64_t>(1, kDequantFloats / W.cols); }
  // y[m, j] = Σ_k x[m, k] · W[r0 + j, k] for m < M, j < N (y rows of ldy): column-major, yᵀ = W·xᵀ.
  void products_wt(const float* x, int M, const cuda::DevWeight& W, int64_t r0, int64_t N, float* y, int64_t ldy) {
    if (M == 0 || N == 0) return;
    bind_blas();
    const int K = int(W.cols);
    const bool half = on_bf16(W);
    const ArithBlock xb = half ? bf16_copy(x, size_t(M) * size_t(K)) : ArithBlock();
    const cudaDataType t = half ? CUDA_R_16BF : CUDA_R_32F;
    const void* B = half ? xb.data() : static_cast<const void*>(x);
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_chunk(W)) {
      const int nc = int(std::min(rows_per_chunk(W), N - n0));
      const void* A = half ? static_cast<const void*>(bf16_rows(W, r0 + n0, nc)) : f32_rows(W, r0 + n0, nc);
      blas_->gemm(CUBLAS_OP_T, CUBLAS_OP_N, nc, M, K, 1.f, A, t, K, B, t, K, 0.f, y + n0, CUDA_R_32F, int(ldy),
                  CUBLAS_COMPUTE_32F);
    }
  }
  // dx[m, k] += Σ_j dy[m, j] · W[r0 + j, k] for m < M, j < N (dy rows of ldd): dxᵀ += Wᵀ·dyᵀ.
  void products_w(const float* dy, int64_t ldd, int M, const cuda::DevWeight& W, int64_t r0, int64_t N, float* dx) {
    if (M == 0 || N == 0) return;
    bind_blas();
    const int K = int(W.cols);
    const bool half = on_bf16(W);
    const ArithBlock db = half ? bf16_copy(dy, size_t(M) * size_t(ldd)) : ArithBlock();
    const cudaDataType t = half ? CUDA_R_16BF : CUDA_R_32F;
    for (int64_t n0 = 0; n0 < N; n0 += rows_per_chunk(W)) {
      const int nc = int(std::min(rows_per_chunk(W), N - n0));
      const void* A = half ? static_cast<const void*>(bf16_rows(W, r0 + n0, nc)) : f32_rows(W, r0 + n0, nc);
      const void* B = half ? static_cast<const void*>(static_cast<const __nv_bfloat16*>(db.data()) + n0)
                            : static_cast<const void*>(dy + n0);
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_N, K, M, nc, 1.f, A, t, K, B, t, int(ldd), 1.f, dx, CUDA_R_32F, K,
                  CUBLAS_COMPUTE_32F);
    }
  }

  // Attention on bf16 operands (BackendOptions::activations BF16): q, k, v, dout and the [H, T, T]
  // probs and score gradients rounded to bf16, f32 sums and f32 results; the probs kept for the
  // backward stay f32. Operands head-major ([heads, T, D], to_bf16_heads), so each kv group's
  // heads are one strided batch and the K/V gradients one product over the group's heads: in
  // column-major terms a head's rows are a [D, T] block of leading dimension D, a head's [T, T]
  // probs its transpose [T(keys), T(queries)] of leading dimension T.
  ArithBlock bf16_heads(const float* x, int T, int heads, int D) {
    ArithBlock b(*this, size_t(T) * size_t(heads) * size_t(D) * 2, false);
    cuda::grad::to_bf16_heads(stream(), x, T, heads, D, static_cast<__nv_bfloat16*>(b.data()));
    return b;
  }
  static const __nv_bfloat16* bf(const ArithBlock& b) { return static_cast<const __nv_bfloat16*>(b.data()); }
  void attention_fwd_bf16(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                          float scale, float* probs, float* out) {
    const int G = H / Hk;
    const long long TD = (long long)T * D, TT = (long long)T * T;
    const ArithBlock qb = bf16_heads(q, T, H, D), kb = bf16_heads(k, T, Hk, D), vb = bf16_heads(v, T, Hk, D);
    const ArithBlock pb(*this, size_t(H) * size_t(TT) * 2, false);
    auto* P16 = static_cast<__nv_bfloat16*>(pb.data());
    for (int g = 0; g < Hk; ++g)  // S_hᵀ = K_g · Q_hᵀ, h = g·G .. g·G + G - 1
      blas_->gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, 1.f, bf(kb) + g * TD, CUDA_R_16BF, D, 0,
                          bf(qb) + g * G * TD, CUDA_R_16BF, D, TD, 0.f, probs + g * G * TT, CUDA_R_32F, T, TT, G,
                          CUBLAS_COMPUTE_32F);
    cuda::grad::attn_softmax(stream(), probs, T, H, window, scale, P16);
    for (int g = 0; g < Hk; ++g)  // out_hᵀ = V_gᵀ · P_hᵀ, into out [T, H, D]
      blas_->gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, 1.f, bf(vb) + g * TD, CUDA_R_16BF, D, 0,
                          P16 + g * G * TT, CUDA_R_16BF, T, TT, 0.f, out + g * G * D, CUDA_R_32F, H * D, D, G,
                          CUBLAS_COMPUTE_32F);
  }
  void attention_bwd_bf16(const float* q, const float* k, const float* v, const float* probs, const float* dout, int T,
                          int H, int Hk, int D, int window, float scale, float* dq, float* dk, float* dv, float* dS) {
    const int G = H / Hk;
    const long long TD = (long long)T * D, TT = (long long)T * T;
    const ArithBlock qb = bf16_heads(q, T, H, D), kb = bf16_heads(k, T, Hk, D), vb = bf16_heads(v, T, Hk, D),
                     db = bf16_heads(dout, T, H, D);
    const ArithBlock ds16(*this, size_t(H) * size_t(TT) * 2, false), p16(*this, size_t(H) * size_t(TT) * 2, false);
    auto* dSb = static_cast<__nv_bfloat16*>(ds16.data());
    auto* Pb = static_cast<__nv_bfloat16*>(p16.data());
    for (int g = 0; g < Hk; ++g)  // dP_hᵀ = V_g · dO_hᵀ
      blas_->gemm_batched(CUBLAS_OP_T, CUBLAS_OP_N, T, T, D, 1.f, bf(vb) + g * TD, CUDA_R_16BF, D, 0,
                          bf(db) + g * G * TD, CUDA_R_16BF, D, TD, 0.f, dS + g * G * TT, CUDA_R_32F, T, TT, G,
                          CUBLAS_COMPUTE_32F);
    cuda::grad::attn_score_grad(stream(), probs, dS, T, H, window, scale, dSb, Pb);
    for (int g = 0; g < Hk; ++g) {
      // dq_hᵀ += K_gᵀ · dS_hᵀ (into dq [T, H, D])
      blas_->gemm_batched(CUBLAS_OP_N, CUBLAS_OP_N, D, T, T, 1.f, bf(kb) + g * TD, CUDA_R_16BF, D, 0,
                          dSb + g * G * TT, CUDA_R_16BF, T, TT, 1.f, dq + g * G * D, CUDA_R_32F, H * D, D, G,
                          CUBLAS_COMPUTE_32F);
      // dk_gᵀ += Σ_h Q_hᵀ · dS_h and dv_gᵀ += Σ_h dO_hᵀ · P_h: the group's heads one after another
      // along the product's inner dimension (G·T).
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, D, T, G * T, 1.f, bf(qb) + g * G * TD, CUDA_R_16BF, D, dSb + g * G * TT,
                  CUDA_R_16BF, T, 1.f, dk + g * D, CUDA_R_32F, Hk * D, CUBLAS_COMPUTE_32F);
      blas_->gemm(CUBLAS_OP_N, CUBLAS_OP_T, D, T, G * T, 1.f, bf(db) + g * G * TD, CUDA_R_16BF, D, Pb + g * G * TT,
                  CUDA_R_16BF, T, 1.f, dv + g * D, CUDA_R_32F, Hk * D, CUBLAS_COMPUTE_32F);
    }
  }

  // An adapter matrix's f32 values (a plain f32 weight of this arith's memory).
  static const float* f32_of(const WeightView& W) {
    G4_CHECK(W.fmt == WFormat::F32 && "CUDA LoRA delta: the adapter matrices are f32");
    return static_cast<const float*>(W.data);
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
  struct CachedWeight {
    ArithBlock block;
    int64_t rows = 0, cols = 0;
    const __nv_bfloat16* bf16() const { return static_cast<const __nv_bfloat16*>(block.data()); }
  };
  std::unordered_map<const uint8_t*, CachedWeight> bf16_cache_;  // whole weights' bf16 copies, by data
  size_t cache_left_ = 0;                                       // bytes the cache may still take
  std::unordered_map<const RopeTable*, RopeCopy> rope_;
};

}  // namespace

std::unique_ptr<GradArith> make_cuda_grad_arith(std::string* why, const BackendOptions& opt) {
  if (!cuda::device_usable(opt.device, why)) return nullptr;
  return std::make_unique<CudaGradArith>(opt);
}

}  // namespace g4
