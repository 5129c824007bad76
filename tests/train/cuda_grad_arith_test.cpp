// The CUDA training arithmetic (backend/cuda/cuda_grad_arith.cu) against the host one
// (train/host_grad_arith.cpp, plain f32 over dense_ops.h), op by op on random inputs of odd sizes:
// every output within 2e-5 · max(1, max |host|) (f32 sums in another order; 5e-5 for attention
// and the products), with the products on the reference kernels, on cuBLAS in f32, and on cuBLAS
// over bf16 operands (products and attention within 2e-2 · max(1, max |host|), the head's loss
// within 5e-3 relative; the other ops are the same kernels). Skips, saying why, without a CUDA build or GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backend/grad_arith.h"
#include "quant/affine_quantize.h"
#include "train/grad_backend.h"

namespace g4 {
namespace {

using Floats = std::vector<float>;

// Values as an MLX 4-bit matrix [rows, cols] (f32 scales and biases), held with its view.
struct Mlx4 {
  std::vector<uint8_t> codes;
  Floats scales, biases;
  WeightView view;
  Mlx4(const Floats& v, int rows, int cols, int group)
      : codes(size_t(rows) * cols / 2), scales(size_t(rows) * cols / group), biases(scales.size()) {
    affine_quantize(v.data(), v.size(), 4, group, false, codes.data(), scales.data(), biases.data());
    view = mlx_affine_view(codes.data(), rows, cols, 4, group, scales.data(), biases.data(), DType::F32);
  }
};

// Parameter: where the products run: the reference kernels, cuBLAS in f32, or cuBLAS on bf16
// operands (BackendOptions::blas, ::activations).
enum class Products { Kernels, Cublas, CublasBf16 };

constexpr double kTol = 2e-5, kSumTol = 5e-5;
// The products' bound: f32 sums, or (bf16 operands) both operands rounded to 8 bits of mantissa.
double product_tol() { return ::testing::TestWithParam<Products>::GetParam() == Products::CublasBf16 ? 2e-2 : kSumTol; }

class CudaGradArith : public ::testing::TestWithParam<Products> {
 protected:
  void SetUp() override {
    std::string why;
    BackendOptions opt;
    opt.blas = GetParam() != Products::Kernels;
    opt.activations = GetParam() == Products::CublasBf16 ? DType::BF16 : DType::F32;
    dev_ = make_cuda_grad_arith(&why, opt);
    if (!dev_) GTEST_SKIP() << "no CUDA training arithmetic here: " << why;
    host_ = train::make_host_grad_arith();
  }

  Floats rand(size_t n, float scale = 1.f) {
    std::normal_distribution<float> nd;
    Floats v(n);
    for (float& x : v) x = scale * nd(rng_);
    return v;
  }
  // A device copy of v (freed with the test).
  float* up(const Floats& v) { return static_cast<float*>(up_bytes(v.data(), v.size() * 4)); }
  void* up_bytes(const void* p, size_t bytes) {
    blocks_.emplace_back(*dev_, bytes, false);
    dev_->base().write_bytes(p, bytes, Buf(blocks_.back().data(), DType::U8, int64_t(bytes), 0));
    return blocks_.back().data();
  }
  Floats down(const float* d, size_t n) {
    Floats v(n);
    dev_->base().read_bytes(Buf(const_cast<float*>(d), DType::F32, int64_t(n), 0), n * 4, v.data());
    return v;
  }
  // matmul_wt and matmul_w_acc of M random rows through host weight hw (and its device placement).
  void check_products(int M, const WeightView& hw) {
    const WeightView dw = dev_->base().place_weight(hw);
    const Floats x = rand(size_t(M) * hw.cols), dy = rand(size_t(M) * hw.rows);
    Floats y(size_t(M) * hw.rows), dx = rand(x.size());
    float *dyv = up(y), *ddx = up(dx);
    host_->matmul_wt(x.data(), M, hw, y.data()), dev_->matmul_wt(up(x), M, dw, dyv);
    expect_near(dyv, y, product_tol(), "matmul_wt");
    host_->matmul_w_acc(dy.data(), M, hw, dx.data()), dev_->matmul_w_acc(up(dy), M, dw, ddx);
    expect_near(ddx, dx, product_tol(), "matmul_w_acc");
  }
  // Device result d[0, n) against the host's h.
  void expect_near(const float* d, const Floats& h, double rel, const char* what) {
    const Floats got = down(d, h.size());
    double mx = 1.0, worst = 0.0;
    for (float x : h) mx = std::max(mx, double(std::fabs(x)));
    for (size_t i = 0; i < h.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - h[i]));
    EXPECT_LE(worst, rel * mx) << what << ": max |cuda - host| " << worst << " at scale " << mx;
  }

  std::unique_ptr<GradArith> dev_, host_;
  std::vector<ArithBlock> blocks_;
  std::mt19937 rng_{12345};
};


TEST_P(CudaGradArith, ElementwiseOps) {
  const size_t n = 1037;
  const Floats a = rand(n, 3.f), b = rand(n), dy = rand(n);
  float *da = up(a), *db = up(b), *ddy = up(dy);
  Floats y(n), g = dy;
  float* dyo = up(Floats(n));
  host_->add(a.data(), b.data(), n, y.data()), dev_->add(da, db, n, dyo);
  expect_near(dyo, y, kTol, "add");
  host_->scale(a.data(), -0.7f, n, y.data()), dev_->scale(da, -0.7f, n, dyo);
  expect_near(dyo, y, kTol, "scale");
  Floats acc = b;
  float* dacc = up(b);
  host_->axpy_acc(1.3f, a.data(), n, acc.data()), dev_->axpy_acc(1.3f, da, n, dacc);
  expect_near(dacc, acc, kTol, "axpy_acc");
  Floats x = a;
  float* dx = up(a);
  host_->softcap_fwd(x.data(), n, 2.5f), dev_->softcap_fwd(dx, n, 2.5f);
  expect_near(dx, x, kTol, "softcap_fwd");
  float* dg = up(dy);
  host_->softcap_bwd(a.data(), n, 2.5f, g.data()), dev_->softcap_bwd(da, n, 2.5f, dg);
  expect_near(dg, g, kTol, "softcap_bwd");
  host_->dropout_fwd(a.data(), n, 0.3f, 99, y.data()), dev_->dropout_fwd(da, n, 0.3f, 99, dyo);
  expect_near(dyo, y, kTol, "dropout_fwd");
  Floats gx = b;
  float* dgx = up(b);
  host_->dropout_bwd(dy.data(), n, 0.3f, 99, gx.data()), dev_->dropout_bwd(ddy, n, 0.3f, 99, dgx);
  expect_near(dgx, gx, kTol, "dropout_bwd");
  host_->gelu_mul_fwd(a.data(), b.data(), n, y.data()), dev_->gelu_mul_fwd(da, db, n, dyo);
  expect_near(dyo, y, kTol, "gelu_mul_fwd");
  Floats hg(n, 0.f), hu = a;
  float *dgg = up(hg), *duu = up(a);
  host_->gelu_mul_bwd(a.data(), b.data(), dy.data(), n, hg.data(), hu.data());
  dev_->gelu_mul_bwd(da, db, ddy, n, dgg, duu);
  expect_near(dgg, hg, kTol, "gelu_mul_bwd dg");
  expect_near(duu, hu, kTol, "gelu_mul_bwd du");
}

TEST_P(CudaGradArith, NormAndRope) {
  const int rows = 7, dim = 333, heads = 3, D = 40;
  const Floats x = rand(size_t(rows) * dim, 2.f), w = rand(dim), dy = rand(x.size());
  for (const bool weighted : {true, false}) {
    const float* hw = weighted ? w.data() : nullptr;
    const float* dw = weighted ? up(w) : nullptr;
    Floats y(x.size()), inv(rows), dx = rand(x.size());
    float *ddx_ = up(dx), *dy_ = up(Floats(x.size())), *dinv = up(Floats(rows));
    host_->rms_norm_fwd(x.data(), rows, dim, hw, 1e-6f, y.data(), inv.data());
    dev_->rms_norm_fwd(up(x), rows, dim, dw, 1e-6f, dy_, dinv);
    expect_near(dy_, y, kTol, "rms_norm_fwd");
    expect_near(dinv, inv, kTol, "rms_norm_fwd inv");
    host_->rms_norm_bwd(x.data(), inv.data(), rows, dim, hw, dy.data(), dx.data());
    dev_->rms_norm_bwd(up(x), up(inv), rows, dim, dw, up(dy), ddx_);
    expect_near(ddx_, dx, kSumTol, "rms_norm_bwd");
  }
  RopeTable t;
  for (int j = 0; j < D / 2; ++j) t.inv_freq.push_back(j % 5 == 4 ? 0.f : std::pow(10000.f, -2.f * j / D));
  t.position_scale = 0.5f;
  Floats q = rand(size_t(rows) * heads * D);
  float* dq = up(q);
  host_->rope_fwd(q.data(), rows, heads, D, 1000, t), dev_->rope_fwd(dq, rows, heads, D, 1000, t);
  expect_near(dq, q, kTol, "rope_fwd");
  host_->rope_bwd(q.data(), rows, heads, D, 1000, t), dev_->rope_bwd(dq, rows, heads, D, 1000, t);
  expect_near(dq, q, kTol, "rope_bwd");
}

TEST_P(CudaGradArith, RowGathersAndScatters) {
  const size_t src_rows = 11, dim = 37;
  const std::vector<int64_t> rows = {3, 0, 10, 3, 7, 3};  // repeats: scatters add in order
  const std::vector<int64_t> distinct = {5, 1, 9, 0};
  const Floats src = rand(src_rows * dim), small = rand(rows.size() * dim), w = rand(8);
  const std::vector<int64_t> widx = {7, 2, 5, 0, 1, 3};
  float *dsrc = up(src), *dsmall = up(small), *dw = up(w);
  Floats out(rows.size() * dim);
  float* dout = up(out);
  host_->gather_rows(src.data(), rows, dim, out.data()), dev_->gather_rows(dsrc, rows, dim, dout);
  expect_near(dout, out, 0, "gather_rows");
  Floats acc = src;
  float* dacc = up(src);
  host_->scatter_rows_acc(small.data(), rows, dim, acc.data()), dev_->scatter_rows_acc(dsmall, rows, dim, dacc);
  expect_near(dacc, acc, kTol, "scatter_rows_acc");
  Floats from = src, into = rand(distinct.size() * dim);
  float *dfrom = up(src), *dinto = up(into);
  host_->take_rows_acc(from.data(), distinct, dim, into.data()), dev_->take_rows_acc(dfrom, distinct, dim, dinto);
  expect_near(dinto, into, kTol, "take_rows_acc");
  expect_near(dfrom, from, 0, "take_rows_acc zeroes its rows");
  Floats wide = rand(5 * 50);
  float* dwide = up(wide);
  const Floats cols = rand(5 * 13);
  host_->cols_acc(cols.data(), 5, 13, 50, 21, wide.data()), dev_->cols_acc(up(cols), 5, 13, 50, 21, dwide);
  expect_near(dwide, wide, kTol, "cols_acc");
  host_->gather_scaled(src.data(), rows, w.data(), widx, dim, out.data());
  dev_->gather_scaled(dsrc, rows, dw, widx, dim, dout);
  expect_near(dout, out, kTol, "gather_scaled");
  Floats acc2 = src;
  float* dacc2 = up(src);
  host_->scatter_scaled_acc(small.data(), rows, w.data(), widx, dim, acc2.data());
  dev_->scatter_scaled_acc(dsmall, rows, dw, widx, dim, dacc2);
  expect_near(dacc2, acc2, kTol, "scatter_scaled_acc");
  Floats dots = rand(8);
  float* ddots = up(dots);
  host_->row_dots_acc(src.data(), rows, small.data(), widx, dim, dots.data());
  dev_->row_dots_acc(dsrc, rows, dsmall, widx, dim, ddots);
  expect_near(ddots, dots, kSumTol, "row_dots_acc");
}

// Many rows, in and out of order with repeats (the attention's K/V gradients, an MoE's expert
// rows): each destination adds its rows in index order, as the host does, so the sums are equal.
TEST_P(CudaGradArith, ScatterOfManyRowsAddsInIndexOrder) {
  const size_t n = 3000, dst_rows = 1200, dim = 5;
  std::vector<int64_t> sorted(n), shuffled(n);
  for (size_t i = 0; i < n; ++i) sorted[i] = int64_t(i * dst_rows / n), shuffled[i] = int64_t((i * 7919) % dst_rows);
  const Floats src = rand(n * dim), w = rand(4);
  std::vector<int64_t> widx(n);
  for (size_t i = 0; i < n; ++i) widx[i] = int64_t(i % 4);
  float *dsrc = up(src), *dw = up(w);
  for (const auto* rows : {&sorted, &shuffled}) {
    Floats acc = rand(dst_rows * dim), acc2 = acc;
    float *dacc = up(acc), *dacc2 = up(acc);
    host_->scatter_rows_acc(src.data(), *rows, dim, acc.data()), dev_->scatter_rows_acc(dsrc, *rows, dim, dacc);
    expect_near(dacc, acc, 0, "scatter_rows_acc");
    host_->scatter_scaled_acc(src.data(), *rows, w.data(), widx, dim, acc2.data());
    dev_->scatter_scaled_acc(dsrc, *rows, dw, widx, dim, dacc2);
    expect_near(dacc2, acc2, kTol, "scatter_scaled_acc");  // the device may fuse w·src + acc
  }
}

TEST_P(CudaGradArith, ProductsOverF32AndQuantizedWeights) {
  const int M = 67, rows = 97, cols = 160;
  const Floats wv = rand(size_t(rows) * cols, 0.2f);
  check_products(M, f32_view(wv.data(), rows, cols));
  check_products(M, Mlx4(wv, rows, cols, 32).view);
  const Floats x = rand(size_t(M) * cols), dy = rand(size_t(M) * rows);
  Floats c = rand(size_t(cols) * rows);
  float* dc = up(c);
  host_->gemm_tn_acc(x.data(), dy.data(), c.data(), M, cols, rows);
  dev_->gemm_tn_acc(up(x), up(dy), dc, M, cols, rows);
  expect_near(dc, c, kSumTol, "gemm_tn_acc");
}

// A weight of more than one chunk of dequantized rows (the cuBLAS path's 2^25 floats): 3300 rows
// of 10240.
TEST_P(CudaGradArith, ProductsOverSeveralWeightChunks) {
  const int rows = 3300, cols = 10240;
  check_products(3, Mlx4(rand(size_t(rows) * cols, 0.01f), rows, cols, 64).view);
}

// A LoRA delta's forward and backward (f32 products whatever the dtype: the adapters stay f32).
TEST_P(CudaGradArith, LoraDeltaForwardAndBackward) {
  const int M = 37, in = 50, r = 3, out = 70;
  const float s = 0.7f;
  const Floats x = rand(size_t(M) * in), A = rand(size_t(r) * in), B = rand(size_t(out) * r);
  const Floats dy = rand(size_t(M) * out);
  const WeightView hA = f32_view(A.data(), r, in), hB = f32_view(B.data(), out, r);
  const WeightView dA = f32_view(up(A), r, in), dB = f32_view(up(B), out, r);
  const float* dx_in = up(x);
  Floats t(size_t(M) * r), y = rand(size_t(M) * out);
  float *dt = up(t), *dyv = up(y);
  host_->lora_fwd(x.data(), M, hA, hB, s, t.data(), y.data());
  dev_->lora_fwd(dx_in, M, dA, dB, s, dt, dyv);
  expect_near(dt, t, kSumTol, "lora_fwd t");
  expect_near(dyv, y, kSumTol, "lora_fwd y");
  Floats gA = rand(A.size()), gB = rand(B.size()), gx = rand(x.size());
  float *dgA = up(gA), *dgB = up(gB), *dgx = up(gx);
  host_->lora_bwd(x.data(), t.data(), dy.data(), M, hA, hB, s, gA.data(), gB.data(), gx.data());
  dev_->lora_bwd(dx_in, dt, up(dy), M, dA, dB, s, dgA, dgB, dgx);
  expect_near(dgA, gA, kSumTol, "lora_bwd gA");
  expect_near(dgB, gB, kSumTol, "lora_bwd gB");
  expect_near(dgx, gx, kSumTol, "lora_bwd dx");
}

TEST_P(CudaGradArith, AttentionCausalWindowedGqa) {
  const int T = 29, H = 4, Hk = 2, D = 40;
  const Floats q = rand(size_t(T) * H * D), k = rand(size_t(T) * Hk * D), v = rand(k.size()), dout = rand(q.size());
  float *dq_in = up(q), *dk_in = up(k), *dv_in = up(v), *ddout = up(dout);
  for (const int window : {0, 8}) {
    Floats probs(size_t(H) * T * T), out(q.size());
    float *dprobs = up(probs), *dout_ = up(out);
    host_->attention_fwd(q.data(), k.data(), v.data(), T, H, Hk, D, window, 0.3f, probs.data(), out.data());
    dev_->attention_fwd(dq_in, dk_in, dv_in, T, H, Hk, D, window, 0.3f, dprobs, dout_);
    expect_near(dprobs, probs, product_tol(), "attention_fwd probs");
    expect_near(dout_, out, product_tol(), "attention_fwd out");
    Floats gq = rand(q.size()), gk = rand(k.size()), gv = rand(v.size());
    float *dgq = up(gq), *dgk = up(gk), *dgv = up(gv);
    host_->attention_bwd(q.data(), k.data(), v.data(), probs.data(), dout.data(), T, H, Hk, D, window, 0.3f,
                         gq.data(), gk.data(), gv.data());
    dev_->attention_bwd(dq_in, dk_in, dv_in, dprobs, ddout, T, H, Hk, D, window, 0.3f, dgq, dgk, dgv);
    expect_near(dgq, gq, product_tol(), "attention_bwd dq");
    expect_near(dgk, gk, product_tol(), "attention_bwd dk");
    expect_near(dgv, gv, product_tol(), "attention_bwd dv");
  }
}

TEST_P(CudaGradArith, HeadLossOverVocabularyChunks) {
  // 777 vocabulary rows: chunks of 768 and 9; two rows without a target.
  const int V = 777, K = 96, M = 9;
  const Floats x = rand(size_t(M) * K);
  const Mlx4 E(rand(size_t(V) * K, 0.3f), V, K, 32);
  const WeightView &hE = E.view, dE = dev_->base().place_weight(hE);
  std::vector<int32_t> targets;
  for (int r = 0; r < M; ++r) targets.push_back(r == 2 || r == 6 ? -1 : (r * 97 + 5) % V);
  for (const float cap : {0.f, 3.f}) {
    Floats dx = rand(x.size());
    float* ddx = up(dx);
    const double lh = host_->lm_head_loss(x.data(), M, hE, cap, targets, 0.5f, dx.data());
    const double ld = dev_->lm_head_loss(up(x), M, dE, cap, targets, 0.5f, ddx);
    EXPECT_NEAR(ld, lh, (GetParam() == Products::CublasBf16 ? 5e-3 : 1e-5) * std::fabs(lh)) << "cap " << cap;
    expect_near(ddx, dx, product_tol(), "lm_head_loss dx");
  }
}

TEST_P(CudaGradArith, RouterBackward) {
  const int rows = 9, E = 12, k = 3;
  const Floats scores = rand(size_t(rows) * E), dw = rand(size_t(rows) * k), scale = rand(E);
  std::vector<int32_t> idx;
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < k; ++j) idx.push_back((r * 5 + j * 4) % E);
  Floats ds = rand(scores.size());
  float* dds = up(ds);
  host_->router_bwd(scores.data(), idx, dw.data(), rows, E, k, scale.data(), ds.data());
  dev_->router_bwd(up(scores), idx, up(dw), rows, E, k, up(scale), dds);
  expect_near(dds, ds, kTol, "router_bwd");
}

INSTANTIATE_TEST_SUITE_P(Products, CudaGradArith,
                         ::testing::Values(Products::Kernels, Products::Cublas, Products::CublasBf16),
                         [](const auto& info) {
                           return info.param == Products::Kernels  ? std::string("kernels")
                                  : info.param == Products::Cublas ? std::string("cublas")
                                                                   : std::string("cublas_bf16");
                         });

}  // namespace
}  // namespace g4
