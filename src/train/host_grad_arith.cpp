// HostGradArith (backend/grad_arith.h): the tape's arithmetic in plain f32 on host memory. The
// products, norms, RoPE, GeGLU and attention are train/dense_ops.h's; the loops here are scalar
// and compiled with the default floating-point rules (no reassociation), so their sums run in
// index order.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "train/dense_ops.h"
#include "backend/grad_arith.h"

namespace g4::train {
namespace {

class HostGradArith final : public GradArith {
 public:
  HostGradArith() : base_(make_reference_backend()) {}
  Backend& base() override { return *base_; }

  void* alloc_bytes(size_t bytes, bool zero) override {
    const size_t rounded = bytes == 0 ? 64 : (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded);
    if (!p) throw std::bad_alloc();
    if (zero) std::memset(p, 0, rounded);
    return p;
  }
  void free_bytes(void* p) override { std::free(p); }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) std::memcpy(dst, src, bytes);
  }
  void zero(float* p, size_t n) override { std::fill_n(p, n, 0.f); }
  void add_from_host(const float* host, size_t n, float* dst) override {
    for (size_t i = 0; i < n; ++i) dst[i] += host[i];
  }
  std::vector<int32_t> read_i32(const int32_t* p, size_t n) override { return {p, p + n}; }

  void add(const float* a, const float* b, size_t n, float* y) override {
    for (size_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
  }
  void scale(const float* a, float s, size_t n, float* y) override {
    for (size_t i = 0; i < n; ++i) y[i] = a[i] * s;
  }
  void axpy_acc(float s, const float* x, size_t n, float* y) override {
    for (size_t i = 0; i < n; ++i) y[i] += s * x[i];
  }
  void softcap_fwd(float* x, size_t n, float cap) override {
    for (size_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / cap) * cap;
  }
  void softcap_bwd(const float* x, size_t n, float cap, float* g) override {
    for (size_t i = 0; i < n; ++i) {
      const float t = std::tanh(x[i] / cap);
      g[i] *= 1.f - t * t;
    }
  }
  void dropout_fwd(const float* x, size_t n, float p, uint64_t seed, float* y) override {
    const float s = 1.f / (1.f - p);
    for (size_t i = 0; i < n; ++i) y[i] = dropout_keeps(seed, i, p) ? x[i] * s : 0.f;
  }
  void dropout_bwd(const float* dy, size_t n, float p, uint64_t seed, float* dx) override {
    const float s = 1.f / (1.f - p);
    for (size_t i = 0; i < n; ++i)
      if (dropout_keeps(seed, i, p)) dx[i] += dy[i] * s;
  }
  void gelu_mul_fwd(const float* g, const float* u, size_t n, float* y) override { train::gelu_mul_fwd(g, u, n, y); }
  void gelu_mul_bwd(const float* g, const float* u, const float* dy, size_t n, float* dg, float* du) override {
    train::gelu_mul_bwd(g, u, dy, n, dg, du);
  }

  void rms_norm_fwd(const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv) override {
    train::rms_norm_fwd(x, rows, dim, w, eps, y, inv);
  }
  void rms_norm_bwd(const float* x, const float* inv, int rows, int dim, const float* w, const float* dy,
                    float* dx) override {
    train::rms_norm_bwd(x, inv, rows, dim, w, dy, dx);
  }
  void rope_fwd(float* x, int rows, int heads, int head_dim, int pos0, const RopeTable& t) override {
    train::rope_fwd(x, rows, heads, head_dim, pos0, t);
  }
  void rope_bwd(float* dx, int rows, int heads, int head_dim, int pos0, const RopeTable& t) override {
    train::rope_bwd(dx, rows, heads, head_dim, pos0, t);
  }
  void gather_rows(const float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) override {
    for (size_t i = 0; i < rows.size(); ++i) std::memcpy(dst + i * dim, src + size_t(rows[i]) * dim, dim * 4);
  }
  void scatter_rows_acc(const float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) override {
    for (size_t i = 0; i < rows.size(); ++i) add_row(src + i * dim, dim, dst + size_t(rows[i]) * dim);
  }
  void take_rows_acc(float* src, const std::vector<int64_t>& rows, size_t dim, float* dst) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      float* s = src + size_t(rows[i]) * dim;
      add_row(s, dim, dst + i * dim);
      std::fill_n(s, dim, 0.f);
    }
  }
  void cols_acc(const float* src, int rows, int n, int dst_dim, int off, float* dst) override {
    for (int r = 0; r < rows; ++r) add_row(src + size_t(r) * n, size_t(n), dst + size_t(r) * dst_dim + off);
  }
  void gather_scaled(const float* src, const std::vector<int64_t>& rows, const float* w,
                     const std::vector<int64_t>& widx, size_t dim, float* dst) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      const float s = w[widx[i]];
      const float* x = src + size_t(rows[i]) * dim;
      for (size_t c = 0; c < dim; ++c) dst[i * dim + c] = s * x[c];
    }
  }
  void scatter_scaled_acc(const float* src, const std::vector<int64_t>& rows, const float* w,
                          const std::vector<int64_t>& widx, size_t dim, float* dst) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      const float s = w[widx[i]];
      float* o = dst + size_t(rows[i]) * dim;
      for (size_t c = 0; c < dim; ++c) o[c] += s * src[i * dim + c];
    }
  }
  void row_dots_acc(const float* a, const std::vector<int64_t>& rows, const float* b,
                    const std::vector<int64_t>& widx, size_t dim, float* out) override {
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* x = a + size_t(rows[i]) * dim;
      float dot = 0.f;
      for (size_t c = 0; c < dim; ++c) dot += x[c] * b[i * dim + c];
      out[widx[i]] += dot;
    }
  }

  void matmul_wt(const float* x, int M, const WeightView& W, float* y) override { train::matmul_wt(x, M, W, y); }
  void matmul_w_acc(const float* dy, int M, const WeightView& W, float* dx) override {
    train::matmul_w_acc(dy, M, W, dx);
  }
  void gemm_tn_acc(const float* a, const float* b, float* c, int M, int K, int N) override {
    train::gemm_tn_acc(a, b, c, M, K, N);
  }

  void attention_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                     float scale, float* probs, float* out) override {
    train::attention_fwd(q, k, v, T, H, Hk, D, window, scale, probs, out);
  }
  void attention_bwd(const float* q, const float* k, const float* v, const float* probs, const float* dout, int T,
                     int H, int Hk, int D, int window, float scale, float* dq, float* dk, float* dv) override {
    train::attention_bwd(q, k, v, probs, dout, T, H, Hk, D, window, scale, dq, dk, dv);
  }

  double lm_head_loss(const float* x, int M, const WeightView& E, float cap, const std::vector<int32_t>& targets,
                      float weight, float* dx) override {
    return train::lm_head_loss(x, M, E, cap, targets.data(), weight, dx);
  }

  void router_bwd(const float* scores, const std::vector<int32_t>& idx, const float* dw, int rows, int E, int k,
                  const float* per_expert_scale, float* ds) override {
    std::vector<float> pr(static_cast<size_t>(k)), dp(static_cast<size_t>(k));
    for (int r = 0; r < rows; ++r) {
      const float* s = scores + size_t(r) * E;
      const int32_t* e = idx.data() + size_t(r) * k;
      float mx = -INFINITY, sum = 0.f, dot = 0.f;
      for (int j = 0; j < k; ++j) mx = std::max(mx, s[e[j]]);
      for (int j = 0; j < k; ++j) sum += (pr[size_t(j)] = std::exp(s[e[j]] - mx));
      for (int j = 0; j < k; ++j) {
        pr[size_t(j)] /= sum;
        dp[size_t(j)] = dw[size_t(r) * k + j] * per_expert_scale[e[j]];
        dot += pr[size_t(j)] * dp[size_t(j)];
      }
      for (int j = 0; j < k; ++j) ds[size_t(r) * E + e[j]] += pr[size_t(j)] * (dp[size_t(j)] - dot);
    }
  }

 private:
  static void add_row(const float* src, size_t n, float* dst) {
    for (size_t i = 0; i < n; ++i) dst[i] += src[i];
  }

  std::unique_ptr<Backend> base_;
};

}  // namespace

std::unique_ptr<GradArith> make_host_grad_arith() { return std::make_unique<HostGradArith>(); }

}  // namespace g4::train
