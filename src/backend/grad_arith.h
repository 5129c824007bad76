// Where a training tape (train/grad_backend.h's GradBackend) keeps its memory and runs its arithmetic: the
// gradient buffers, the checkpoints' saved inputs and the values a backward keeps, and the forward
// and backward (vector-Jacobian product) of every op the tape differentiates. The tape decides
// what is read, written, kept and added where; a GradArith only computes.
//
// The host arithmetic (train/host_grad_arith.cpp, make_host_grad_arith in train/grad_backend.h)
// computes in plain f32 on host memory (train/dense_ops.h and scalar loops): training follows the
// model's definition, not the inference kernels' roundings. The CUDA one (backend/cuda/
// cuda_grad_arith.cu) runs the same contracts as f32 kernels on a CUDA backend's memory and
// stream; tests compare the two op by op (tests/train/cuda_grad_arith_test.cpp).
//
// Every pointer a GradArith function takes is in that arith's memory (base()'s buffers), except
// the arguments named *_host and the index lists, which are host vectors. Row-major shapes; a
// "row" is one token position. Functions named *_acc and every backward ADD into their outputs.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "quant/weight.h"

namespace g4 {

class GradArith {
 public:
  virtual ~GradArith() = default;
  // The backend that owns this arith's memory and runs the forward ops the tape does not change
  // (allocation and copies, embed, kv_write, the row gathers, the router's top-k); it also places
  // the model's weights.
  virtual Backend& base() = 0;

  // --- Memory ---
  // `bytes` of memory, 64-byte aligned, zeroed when `zero` (free_bytes gives it back).
  virtual void* alloc_bytes(size_t bytes, bool zero) = 0;
  virtual void free_bytes(void* p) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void zero(float* p, size_t n) = 0;
  // dst[0, n) += host[0, n).
  virtual void add_from_host(const float* host, size_t n, float* dst) = 0;
  virtual std::vector<int32_t> read_i32(const int32_t* p, size_t n) = 0;

  // --- Elementwise, n values ---
  virtual void add(const float* a, const float* b, size_t n, float* y) = 0;    // y = a + b
  virtual void scale(const float* a, float s, size_t n, float* y) = 0;         // y = s·a
  virtual void axpy_acc(float s, const float* x, size_t n, float* y) = 0;      // y += s·x
  virtual void softcap_fwd(float* x, size_t n, float cap) = 0;                 // x = tanh(x/cap)·cap
  // g *= 1 - tanh²(x/cap), x the softcap's input.
  virtual void softcap_bwd(const float* x, size_t n, float cap, float* g) = 0;
  // y = x / (1 - p) where dropout_keeps(seed, i, p), else 0; the backward adds dy's kept values.
  virtual void dropout_fwd(const float* x, size_t n, float p, uint64_t seed, float* y) = 0;
  virtual void dropout_bwd(const float* dy, size_t n, float p, uint64_t seed, float* dx) = 0;
  // y = gelu_tanh(g)·u; dg += dy·u·gelu'(g), du += dy·gelu(g).
  virtual void gelu_mul_fwd(const float* g, const float* u, size_t n, float* y) = 0;
  virtual void gelu_mul_bwd(const float* g, const float* u, const float* dy, size_t n, float* dg, float* du) = 0;

  // --- Rows ---
  // RMSNorm of x [rows, dim] by w (null: 1); inv [rows] = each row's 1/rms (the backward's).
  virtual void rms_norm_fwd(const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv) = 0;
  virtual void rms_norm_bwd(const float* x, const float* inv, int rows, int dim, const float* w, const float* dy,
                            float* dx) = 0;
  // Half-split RoPE in place on [rows, heads, head_dim] at positions pos0 + r; the backward
  // rotates gradients back.
  virtual void rope_fwd(float* x, int rows, int heads, int head_dim, int pos0, const RopeTable& t) = 0;
  virtual void rope_bwd(float* dx, int rows, int heads, int head_dim, int pos0, const RopeTable& t) = 0;
  // dst[i] = src[rows[i]] (rows of dim values).
  virtual void gather_rows(const float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) = 0;
  // dst[rows[i]] += src[i], i in order.
  virtual void scatter_rows_acc(const float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) = 0;
  // dst[i] += src[rows[i]], then src[rows[i]] = 0 (a gradient taken from scattered rows).
  virtual void take_rows_acc(float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) = 0;
  // dst[r, off + j] += src[r, j] for r < rows, j < n (dst rows of dst_dim values).
  virtual void cols_acc(const float* src, int rows, int n, int dst_dim, int off, float* dst) = 0;
  // Weighted rows: dst[i] = w[widx[i]]·src[rows[i]] (gather_scaled); dst[rows[i]] += w[widx[i]]·src[i]
  // (scatter_scaled_acc, i in order); out[widx[i]] += src_a[rows[i]] · b[i] (row_dots_acc).
  virtual void gather_scaled(const float* src, const std::vector<int64_t>& rows, const float* w,
                             const std::vector<int64_t>& widx, size_t dim, float* dst) = 0;
  virtual void scatter_scaled_acc(const float* src, const std::vector<int64_t>& rows, const float* w,
                                  const std::vector<int64_t>& widx, size_t dim, float* dst) = 0;
  virtual void row_dots_acc(const float* a, const std::vector<int64_t>& rows, const float* b,
                            const std::vector<int64_t>& widx, size_t dim, float* out) = 0;

  // --- Products ---
  // y[M, W.rows] = x[M, W.cols]·Wᵀ, W a placed weight of base() (any format), dequantized exactly.
  virtual void matmul_wt(const float* x, int M, const WeightView& W, float* y) = 0;
  // dx[M, W.cols] += dy[M, W.rows]·W.
  virtual void matmul_w_acc(const float* dy, int M, const WeightView& W, float* dx) = 0;
  // c[K, N] += aᵀ·b, a [M, K], b [M, N] (a weight's gradient, summed over rows).
  virtual void gemm_tn_acc(const float* a, const float* b, float* c, int M, int K, int N) = 0;

  // --- A LoRA delta (Backend::lora_delta): A [r, in], B [out, r] f32 matrices of base() ---
  // t [M, r] = x·Aᵀ; y [M, out] += s · t·Bᵀ (y read and written: the delta adds in place).
  // The default runs matmul_wt twice, then scale and add over a [M, out] temporary, as the
  // backend's composition does.
  virtual void lora_fwd(const float* x, int M, const WeightView& A, const WeightView& B, float s, float* t, float* y);
  // From dy [M, out], y's gradient (read only: the delta's input y has the same gradient), with x
  // and t of the forward: gB += s · dyᵀ·t; dt = s · dy·B; gA += dtᵀ·x; dx += dt·A (dx null: not
  // wanted). The default forms dz = s·dy first, then the products as the matmuls' backwards do.
  virtual void lora_bwd(const float* x, const float* t, const float* dy, int M, const WeightView& A,
                        const WeightView& B, float s, float* gA, float* gB, float* dx);

  // --- Attention of one sequence (dense_ops.h attention_fwd / attention_bwd) ---
  // q [T, H, D], k / v [T, Hk, D] at positions 0..T-1, causal, windowed when window > 0. The
  // forward writes out [T, H, D] and probs [H, T, T]; the backward adds into dq, dk, dv.
  virtual void attention_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                             float scale, float* probs, float* out) = 0;
  virtual void attention_bwd(const float* q, const float* k, const float* v, const float* probs, const float* dout,
                             int T, int H, int Hk, int D, int window, float scale, float* dq, float* dk, float* dv) = 0;

  // --- The LM head and the next-token loss (train/dense_ops.h lm_head_loss) ---
  // z = x·Eᵀ over rows x [M, E.cols] (final-normed), softcapped when cap > 0. Returns Σ over the
  // rows whose targets_host[i] >= 0 of logsumexp(z_i) - z_i[target] and, when dx is not null,
  // adds weight · d(that sum)/dx into dx [M, E.cols]. E a placed weight of base(); the [M, vocab]
  // logits are never held at once.
  virtual double lm_head_loss(const float* x, int M, const WeightView& E, float cap,
                              const std::vector<int32_t>& targets_host, float weight, float* dx) = 0;

  // --- Router: w_j = softmax over the k selected scores · per_expert_scale[e_j] ---
  // ds[r, e_j] += p_j (dp_j - Σ_i p_i dp_i), dp_j = dw[r, j]·per_expert_scale[e_j]; scores [rows, E],
  // idx_host / dw [rows, k].
  virtual void router_bwd(const float* scores, const std::vector<int32_t>& idx_host, const float* dw, int rows, int E,
                          int k, const float* per_expert_scale, float* ds) = 0;
};

// Bytes in an arith's memory, freed with this object; empty until made.
class ArithBlock {
 public:
  ArithBlock() = default;
  ArithBlock(GradArith& a, size_t bytes, bool zero) : a_(&a), p_(a.alloc_bytes(bytes, zero)), bytes_(bytes) {}
  ArithBlock(ArithBlock&& o) noexcept { *this = std::move(o); }
  ArithBlock& operator=(ArithBlock&& o) noexcept {
    if (this != &o) {
      reset();
      a_ = o.a_, p_ = o.p_, bytes_ = o.bytes_;
      o.p_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  ArithBlock(const ArithBlock&) = delete;
  ArithBlock& operator=(const ArithBlock&) = delete;
  ~ArithBlock() { reset(); }

  void reset() {
    if (p_) a_->free_bytes(p_);
    p_ = nullptr, bytes_ = 0;
  }
  bool empty() const { return p_ == nullptr; }
  void* data() const { return p_; }
  float* f32() const { return static_cast<float*>(p_); }
  size_t bytes() const { return bytes_; }

 private:
  GradArith* a_ = nullptr;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// The CUDA arithmetic over a CUDA backend of `opt`, or null with the reason in *why (no CUDA
// build, no usable GPU). Its buffers are f32 whatever opt.activations says; BF16 there runs the
// products (the matmuls but the narrowest, the head, the attention) on bf16 operands with f32
// accumulation, as autocast does, where opt.blas lets them run on cuBLAS.
std::unique_ptr<GradArith> make_cuda_grad_arith(std::string* why, const BackendOptions& opt);

}  // namespace g4
