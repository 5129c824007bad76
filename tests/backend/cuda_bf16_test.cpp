// The CUDA backend's bf16 activation path (BackendOptions::activations = BF16, the default) against
// the f32 reference backend. Inputs are rounded to bf16 once on upload (from_host), and the
// reference runs on those same rounded values, so what is measured is the kernels' own error: f32
// accumulation, then one rounding of every stored output to bf16 (2^-9 relative). Bounds are
// relative to the reference's magnitude (test::rel_err): 8e-3 for one op (output rounding plus
// the f32 accumulation order), 2e-2 for attention (scores and softmax weights from bf16 q, k, v).
// An f32 output (the logits) from bf16 inputs must match to f32 accuracy (2e-5).
// Skips, printing why, when the build has no CUDA or the machine no GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"
#include "backend/backend.h"
#include "backend_test_util.h"
#include "moe_test_experts.h"
#include "core/dtype.h"

namespace g4 {
namespace {
using test::randn;
using test::bf16_rounded;
using test::rel_err;

class CudaBf16Test : public ::testing::Test {
 public:
  void SetUp() override {
    std::string why;
    BackendOptions opt;
    opt.activations = DType::BF16;
    opt.int8_dots = false;  // the bf16 kernels themselves; the int8 decode path: cuda_q8_test.cpp
    cu = make_cuda_backend(&why, opt);
    if (!cu) {
      std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA";
    }
    ASSERT_EQ(cu->activation_dtype(), DType::BF16);
    ref = make_reference_backend();
  }
  // A bf16 device buffer of h (rounded on the way) and the rounded values the reference sees.
  Buf up(const std::vector<float>& h) { return test::upload_act(*cu, h); }
  std::vector<float> down(const Buf& d, size_t n) { return test::download(*cu, d, n); }
  std::unique_ptr<Backend> cu, ref;
};

// The few-row tensor-core kernel (2 to 32 rows, widths a multiple of 128) and cuBLAS (33 rows and
// more, widths a multiple of 32) round the weights to bf16: their f32 outputs get PrefillOnBlas's
// bound. The CUDA-core kernels keep f32 weights.
double f32_out_bound(int M, int64_t cols) {
  if (M > 32) return cols % 32 == 0 ? 6e-3 : 2e-5;
  return M > 1 && cols % 128 == 0 ? 6e-3 : 2e-5;
}

void check(CudaBf16Test& t, const WeightView& W, const char* what) {
  const WeightView dW = t.cu->place_weight(W);
  for (int M : {1, 9, 40}) {  // decode GEMV, the few-row kernels (tensor or CUDA cores by width), prefill
    const auto x = bf16_rounded(randn(size_t(M) * size_t(W.cols), uint32_t(M + W.rows)));
    std::vector<float> want(size_t(M) * size_t(W.rows));
    t.ref->matmul(x.data(), M, W, ActPrecision::F32, want.data());
    Buf dx = t.up(x), dy = t.cu->alloc_act(want.size()), df = t.cu->alloc_f32(want.size());
    t.cu->matmul(dx, M, dW, ActPrecision::BF16, dy);
    EXPECT_LE(rel_err(t.down(dy, want.size()), want), 8e-3) << what << " M=" << M << " (bf16 out)";
    t.cu->matmul(dx, M, dW, ActPrecision::BF16, df);  // the logits' form: bf16 in, f32 out
    EXPECT_LE(rel_err(t.down(df, want.size()), want), f32_out_bound(M, W.cols)) << what << " M=" << M << " (f32 out)";
    for (const Buf& p : {dx, dy, df}) t.cu->free(p);
  }
}

TEST_F(CudaBf16Test, MatmulEveryKernelFamily) {
  std::mt19937 rng(7);
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ6_K, WFormat::GgufQ8_0, WFormat::GgufQ5_0}) {
    auto data = test::random_blocks(f, 37, 1024, rng);
    check(*this, WeightView{f, 37, 1024, data.data(), gguf_row_bytes(f, 1024)}, std::string(wformat_name(f)).c_str());
  }
  {  // the tall one-row kernel (LM head shape)
    auto data = test::random_blocks(WFormat::GgufQ6_K, 32768 + 5, 256, rng);
    check(*this, WeightView{WFormat::GgufQ6_K, 32768 + 5, 256, data.data(), gguf_row_bytes(WFormat::GgufQ6_K, 256)},
          "tall Q6_K");
  }
  test::OwnedWeight mlx = test::random_mlx(45, 512, 4, 64, DType::BF16, 3);
  check(*this, mlx.view, "mlx affine 4-bit");
  test::OwnedWeight bf = test::random_float(33, 160, WFormat::BF16, 9);
  check(*this, bf.view, "bf16");
  test::OwnedWeight odd = test::random_float(17, 150, WFormat::F32, 10);  // the per-element kernel
  check(*this, odd.view, "f32 odd width");
}

TEST_F(CudaBf16Test, NormsElementwiseEmbed) {
  const int rows = 5, dim = 640;
  const auto x = bf16_rounded(randn(size_t(rows * dim), 21, 2.f)), b = bf16_rounded(randn(size_t(rows * dim), 22));
  const auto w = randn(size_t(dim), 23);
  Buf dx = up(x), db = up(b), dy = cu->alloc_act(x.size()), dw = cu->alloc_f32(dim);
  cu->from_host(w.data(), w.size(), dw);
  std::vector<float> r(x.size());
  ref->rms_norm(x.data(), rows, dim, w.data(), 1e-6f, ActPrecision::F32, r.data());
  cu->rms_norm(dx, rows, dim, dw.f32(), 1e-6f, ActPrecision::BF16, dy);
  EXPECT_LE(rel_err(down(dy, x.size()), r), 8e-3) << "rms_norm";
  ref->gelu_mul(x.data(), b.data(), x.size(), ActPrecision::F32, r.data());
  cu->gelu_mul(dx, db, x.size(), ActPrecision::BF16, dy);
  EXPECT_LE(rel_err(down(dy, x.size()), r), 8e-3) << "gelu_mul";
  ref->add(x.data(), b.data(), x.size(), ActPrecision::F32, r.data());
  cu->add(dx, db, x.size(), ActPrecision::BF16, dy);
  EXPECT_LE(rel_err(down(dy, x.size()), r), 8e-3) << "add";
  {  // x += rms_norm(b)·w, in place
    std::vector<float> want = x, bh = b;
    ref->norm_add(want.data(), bh.data(), rows, dim, w.data(), 1e-6f, ActPrecision::F32);
    cu->norm_add(dx, db, rows, dim, dw.f32(), 1e-6f, ActPrecision::BF16);
    EXPECT_LE(rel_err(down(dx, x.size()), want), 8e-3) << "norm_add";
  }
  std::mt19937 rng(24);
  auto blocks = test::random_blocks(WFormat::GgufQ4_K, 40, 1280, rng);
  const WeightView E{WFormat::GgufQ4_K, 40, 1280, blocks.data(), gguf_row_bytes(WFormat::GgufQ4_K, 1280)};
  const std::vector<int32_t> ids = {3, 0, 39};
  Buf dids = cu->alloc_i32(ids.size()), de = cu->alloc_act(ids.size() * 1280);
  cu->from_host(ids.data(), ids.size(), dids);
  std::vector<float> want(ids.size() * 1280);
  ref->embed(E, ids.data(), int(ids.size()), 0.5f, ActPrecision::F32, want.data());
  cu->embed(cu->place_weight(E), dids, int(ids.size()), 0.5f, ActPrecision::BF16, de);
  EXPECT_EQ(down(de, want.size()), bf16_rounded(want)) << "embed: the exact values, rounded once";
  for (const Buf& p : {dx, db, dy, dw, dids, de}) cu->free(p);
}

TEST_F(CudaBf16Test, FusedDecodeOps) {
  std::mt19937 rng(31);
  const int64_t C = 2048, O = 640;
  auto wb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const WeightView W{WFormat::GgufQ4_K, O, C, wb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView dW = cu->place_weight(W);
  const auto pw = randn(size_t(O), 32), nw = randn(size_t(C), 33);
  Buf dpw = cu->alloc_f32(O), dnw = cu->alloc_f32(C);
  cu->from_host(pw.data(), pw.size(), dpw);
  cu->from_host(nw.data(), nw.size(), dnw);
  for (int M : {1, 3}) {
    const auto x = bf16_rounded(randn(size_t(M) * C, uint32_t(34 + M))), res = bf16_rounded(randn(size_t(M) * O, 35, 3.f));
    {  // x_resid += rms_norm(x·Wᵀ)·w (o_proj / down_proj with the residual epilogue)
      std::vector<float> want = res, ys(size_t(M) * O);
      ref->matmul_norm_add(x.data(), M, W, ys.data(), want.data(), pw.data(), 1e-6f, ActPrecision::F32);
      Buf dx = up(x), dr = up(res), dys = cu->alloc_act(ys.size());
      cu->matmul_norm_add(dx, M, dW, dys, dr, dpw.f32(), 1e-6f, ActPrecision::BF16);
      EXPECT_LE(rel_err(down(dr, want.size()), want), 8e-3) << "matmul_norm_add M=" << M;
      for (const Buf& p : {dx, dr, dys}) cu->free(p);
    }
    {  // gelu(xn·Gᵀ) * (xn·Uᵀ) with the input norm in the kernel (the dense MLP's first half)
      auto gb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng), ub = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
      const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
      const WeightView U{WFormat::GgufQ4_K, O, C, ub.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
      std::vector<float> want(size_t(M) * O), us(want.size()), xn(x.size());
      ref->gate_up_gelu(x.data(), M, InputNorm{nw.data(), 1e-6f, xn.data()}, G, U, false, ActPrecision::F32, want.data(),
                        us.data());
      Buf dx = up(x), dg = cu->alloc_act(want.size()), du = cu->alloc_act(want.size()), dxn = cu->alloc_act(x.size());
      cu->gate_up_gelu(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, cu->place_weight(G), cu->place_weight(U), false,
                       ActPrecision::BF16, dg, du);
      EXPECT_LE(rel_err(down(dg, want.size()), want), 1e-2) << "gate_up_gelu M=" << M;
      for (const Buf& p : {dx, dg, du, dxn}) cu->free(p);
    }
  }
  for (const Buf& p : {dpw, dnw}) cu->free(p);
}

// --cuda-bf16-cache: the cuBLAS launches read kept bf16 copies of their weights. A plain matmul is
// the same GEMM over the same bf16 values (the same bits as dequantizing per launch); gate/up runs
// two GEMMs instead of one over both (bounded against the reference). A weight past the budget
// stays dequantized per launch.
TEST_F(CudaBf16Test, Bf16WeightCache) {
  std::string why;
  BackendOptions opt;
  opt.activations = DType::BF16;
  opt.int8_dots = false;
  opt.bf16_weight_cache_gib = 1;
  const auto cached = make_cuda_backend(&why, opt);
  ASSERT_TRUE(cached) << why;
  if (!cuda_prefill_on_blas(*cu)) GTEST_SKIP() << "no cuBLAS";
  std::mt19937 rng(71);
  const int64_t C = 512, O = 300;
  auto w = test::random_blocks(WFormat::GgufQ4_K, O, C, rng), g = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  auto u = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const int64_t rb = int64_t(gguf_row_bytes(WFormat::GgufQ4_K, C));
  const WeightView W{WFormat::GgufQ4_K, O, C, w.data(), rb}, G{WFormat::GgufQ4_K, O, C, g.data(), rb},
      U{WFormat::GgufQ4_K, O, C, u.data(), rb};
  const WeightView dW = cu->place_weight(W), cW = cached->place_weight(W);
  const WeightView cG = cached->place_weight(G), cU = cached->place_weight(U);
  // 24 rows: on cuBLAS only with the copies (kBlasCachedMinRows), else on the few-row kernel.
  for (int M : {24, 40, 70}) {
    const auto x = bf16_rounded(randn(size_t(M) * C, uint32_t(72 + M)));
    std::vector<float> want(size_t(M) * O), us(want.size());
    Buf dx = up(x), dy = cu->alloc_act(want.size());
    cu->matmul(dx, M, dW, ActPrecision::BF16, dy);
    const auto plain = down(dy, want.size());
    ref->matmul(x.data(), M, W, ActPrecision::F32, want.data());
    Buf cx = test::upload_act(*cached, x), cy = cached->alloc_act(want.size()), cu2 = cached->alloc_act(want.size());
    for (int rep = 0; rep < 2; ++rep) {  // the copy made at the first launch, read at both
      cached->matmul(cx, M, cW, ActPrecision::BF16, cy);
      const auto got = test::download(*cached, cy, want.size());
      if (M >= 33) {
        EXPECT_EQ(got, plain) << "matmul M=" << M << " run " << rep;
      }
      EXPECT_LE(rel_err(got, want), 8e-3) << "matmul M=" << M << " run " << rep;
    }
    ref->gate_up_gelu(x.data(), M, InputNorm{}, G, U, true, ActPrecision::F32, want.data(), us.data());
    cached->gate_up_gelu(cx, M, InputNorm{}, cG, cU, true, ActPrecision::BF16, cy, cu2);
    EXPECT_LE(rel_err(test::download(*cached, cy, want.size()), want), 1e-2) << "gate_up_gelu M=" << M;
    for (const Buf& p : {dx, dy}) cu->free(p);
    for (const Buf& p : {cx, cy, cu2}) cached->free(p);
  }
}

// Batched decode (2 to 32 rows) on the few-row tensor-core kernel (cuda_mma_small.h): every
// activation-tile count (1, 2, 4 tiles of 8 rows, partly filled), weights whose rows end inside
// a 16-row block, reductions shorter than the block's 8 warps (K = 128) and longer (K = 5120: a
// warp's items through its ring of chunk buffers), one and three weights per launch, the gated MLP
// in both gelu forms, the input norm and the residual epilogue (both launched beside it), Q4_K /
// Q6_K (chunks at any alignment) / Q8_0 decoded from words and MLX / bf16 through dequant32. Bounds as PrefillOnBlas. A row's output must not depend on
// the other rows (the same bits at M = 9 as in the first 9 rows of M = 32), nor on the run. The
// residual update left pending by matmul_norm_add, with a scale, fused into the next input norm:
// the same bits as launched one by one.
TEST_F(CudaBf16Test, FewRowsOnTensorCores) {
  std::mt19937 rng(51);
  auto q4 = [&](int64_t rows, int64_t cols) {
    auto data = test::random_blocks(WFormat::GgufQ4_K, rows, cols, rng);
    return std::pair{std::move(data), gguf_row_bytes(WFormat::GgufQ4_K, cols)};
  };
  auto [w1, rb1] = q4(45, 5120);  // 20 super-blocks: 3 or 2 items a warp, through the buffer ring
  const WeightView W{WFormat::GgufQ4_K, 45, 5120, w1.data(), rb1};
  auto q6 = test::random_blocks(WFormat::GgufQ6_K, 21, 768, rng);  // 210-byte blocks: unaligned chunks
  const WeightView W6{WFormat::GgufQ6_K, 21, 768, q6.data(), gguf_row_bytes(WFormat::GgufQ6_K, 768)};
  auto q8 = test::random_blocks(WFormat::GgufQ8_0, 29, 128, rng);
  const WeightView W8{WFormat::GgufQ8_0, 29, 128, q8.data(), gguf_row_bytes(WFormat::GgufQ8_0, 128)};
  test::OwnedWeight mlx = test::random_mlx(50, 384, 4, 64, DType::BF16, 5);
  test::OwnedWeight bf = test::random_float(37, 256, WFormat::BF16, 6);
  std::vector<float> first9;
  for (const WeightView* w : std::initializer_list<const WeightView*>{&W, &W6, &W8, &mlx.view, &bf.view}) {
    const WeightView dW = cu->place_weight(*w);
    const auto xall = bf16_rounded(randn(size_t(32) * size_t(w->cols), 60));  // every M takes its first rows
    for (int M : {2, 7, 9, 16, 17, 25, 32}) {
      const std::vector<float> x(xall.begin(), xall.begin() + ptrdiff_t(M) * w->cols);
      std::vector<float> want(size_t(M) * size_t(w->rows));
      ref->matmul(x.data(), M, *w, ActPrecision::F32, want.data());
      Buf dx = up(x), dy = cu->alloc_act(want.size()), df = cu->alloc_f32(want.size());
      cu->matmul(dx, M, dW, ActPrecision::BF16, dy);
      const auto got = down(dy, want.size());
      EXPECT_LE(rel_err(got, want), 8e-3) << wformat_name(w->fmt) << " M=" << M << " (bf16 out)";
      cu->matmul(dx, M, dW, ActPrecision::BF16, df);
      EXPECT_LE(rel_err(down(df, want.size()), want), 6e-3) << wformat_name(w->fmt) << " M=" << M << " (f32 out)";
      cu->matmul(dx, M, dW, ActPrecision::BF16, dy);
      EXPECT_EQ(down(dy, want.size()), got) << wformat_name(w->fmt) << " M=" << M << ": a second run differs";
      if (w == &W && M == 9) first9 = got;
      if (w == &W && M == 32) {
        EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 9 * 45), first9) << "rows 0-8 differ at M=9 and M=32";
      }
      for (const Buf& p : {dx, dy, df}) cu->free(p);
    }
  }

  const int64_t C = 512, O = 200;
  const auto nw = randn(size_t(C), 52), pw = randn(size_t(O), 53);
  Buf dnw = cu->alloc_f32(C), dpw = cu->alloc_f32(O);
  cu->from_host(nw.data(), nw.size(), dnw);
  cu->from_host(pw.data(), pw.size(), dpw);
  auto [gb, grb] = q4(O, C);
  auto [ub, urb] = q4(O, C);
  auto [kb, krb] = q4(48, C);
  const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), grb}, U{WFormat::GgufQ4_K, O, C, ub.data(), urb};
  const WeightView K{WFormat::GgufQ4_K, 48, C, kb.data(), krb};
  const WeightView dG = cu->place_weight(G), dU = cu->place_weight(U), dK = cu->place_weight(K);
  for (int M : {5, 24}) {
    const auto x = bf16_rounded(randn(size_t(M) * C, uint32_t(54 + M)));
    for (bool table : {false, true}) {
      std::vector<float> want(size_t(M) * O), us(want.size()), xn(x.size());
      ref->gate_up_gelu(x.data(), M, InputNorm{nw.data(), 1e-6f, xn.data()}, G, U, table, ActPrecision::F32,
                        want.data(), us.data());
      Buf dx = up(x), dg = cu->alloc_act(want.size()), du = cu->alloc_act(want.size()), dxn = cu->alloc_act(x.size());
      cu->gate_up_gelu(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, dG, dU, table, ActPrecision::BF16, dg, du);
      EXPECT_LE(rel_err(down(dg, want.size()), want), 1e-2) << "gate_up_gelu M=" << M << " table=" << table;
      for (const Buf& p : {dx, dg, du, dxn}) cu->free(p);
    }
    {  // q, k, v of one normed input: three weights in one launch
      std::vector<float> xn(x.size()), wq(size_t(M) * O), wk(size_t(M) * 48), wv(wq.size());
      ref->rms_norm(x.data(), M, int(C), nw.data(), 1e-6f, ActPrecision::F32, xn.data());
      ref->matmul(xn.data(), M, G, ActPrecision::F32, wq.data());
      ref->matmul(xn.data(), M, K, ActPrecision::F32, wk.data());
      ref->matmul(xn.data(), M, U, ActPrecision::F32, wv.data());
      Buf dx = up(x), dq = cu->alloc_act(wq.size()), dk = cu->alloc_act(wk.size()), dv = cu->alloc_act(wv.size());
      Buf dxn = cu->alloc_act(x.size());
      cu->norm_matmuls(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, {MatOut{&dG, dq}, MatOut{&dK, dk}, MatOut{&dU, dv}},
                       ActPrecision::BF16);
      EXPECT_LE(rel_err(down(dq, wq.size()), wq), 1e-2) << "norm_matmuls q M=" << M;
      EXPECT_LE(rel_err(down(dk, wk.size()), wk), 1e-2) << "norm_matmuls k M=" << M;
      EXPECT_LE(rel_err(down(dv, wv.size()), wv), 1e-2) << "norm_matmuls v M=" << M;
      for (const Buf& p : {dx, dq, dk, dv, dxn}) cu->free(p);
    }
    {  // x_resid += rms_norm(x·Gᵀ)·pw
      const auto res = bf16_rounded(randn(size_t(M) * O, 56, 3.f));
      std::vector<float> want = res, ys(size_t(M) * O);
      const auto xc = bf16_rounded(randn(size_t(M) * C, 57));
      ref->matmul_norm_add(xc.data(), M, G, ys.data(), want.data(), pw.data(), 1e-6f, ActPrecision::F32);
      Buf dx = up(xc), dr = up(res), dys = cu->alloc_act(ys.size());
      cu->matmul_norm_add(dx, M, dG, dys, dr, dpw.f32(), 1e-6f, ActPrecision::BF16);
      EXPECT_LE(rel_err(down(dr, want.size()), want), 8e-3) << "matmul_norm_add M=" << M;
      for (const Buf& p : {dx, dr, dys}) cu->free(p);
    }
  }
  {  // matmul_norm_add, a scale of the residual, the next input norm: one fused launch, the same
     // bits as the three launched one by one (a host read of the residual flushes the pending update)
    const int64_t D = 256;
    auto [ob, orb] = q4(D, C);
    auto [nb, nrb] = q4(64, D);
    const WeightView Wo{WFormat::GgufQ4_K, D, C, ob.data(), orb}, Wn{WFormat::GgufQ4_K, 64, D, nb.data(), nrb};
    const WeightView dWo = cu->place_weight(Wo), dWn = cu->place_weight(Wn);
    const auto pw2 = randn(size_t(D), 61), nw2 = randn(size_t(D), 62);
    Buf dpw2 = cu->alloc_f32(D), dnw2 = cu->alloc_f32(D);
    cu->from_host(pw2.data(), pw2.size(), dpw2);
    cu->from_host(nw2.data(), nw2.size(), dnw2);
    for (int M : {3, 20, 48}) {  // 48: on cuBLAS (kBlasMinRows), the update still left pending
      const auto res = bf16_rounded(randn(size_t(M) * D, 63, 3.f)), xc = bf16_rounded(randn(size_t(M) * C, 64));
      std::vector<float> want_res = res, ys(size_t(M) * D), xn(size_t(M) * D), want_q(size_t(M) * 64);
      ref->matmul_norm_add(xc.data(), M, Wo, ys.data(), want_res.data(), pw2.data(), 1e-6f, ActPrecision::F32);
      ref->scale(want_res.data(), 0.5f, want_res.size(), ActPrecision::F32, want_res.data());
      ref->rms_norm(want_res.data(), M, int(D), nw2.data(), 1e-6f, ActPrecision::F32, xn.data());
      ref->matmul(xn.data(), M, Wn, ActPrecision::F32, want_q.data());
      auto run = [&](bool one_by_one) {
        Buf dx = up(xc), dr = up(res), dys = cu->alloc_act(ys.size()), dxn = cu->alloc_act(xn.size());
        Buf dq = cu->alloc_act(want_q.size());
        cu->matmul_norm_add(dx, M, dWo, dys, dr, dpw2.f32(), 1e-6f, ActPrecision::BF16);
        if (one_by_one) (void)down(dr, res.size());
        cu->scale(dr, 0.5f, res.size(), ActPrecision::BF16, dr);
        if (one_by_one) (void)down(dr, res.size());
        cu->norm_matmuls(dr, M, InputNorm{dnw2.f32(), 1e-6f, dxn}, {MatOut{&dWn, dq}}, ActPrecision::BF16);
        std::pair out{down(dr, res.size()), down(dq, want_q.size())};
        for (const Buf& p : {dx, dr, dys, dxn, dq}) cu->free(p);
        return out;
      };
      const auto fused = run(false), plain = run(true);
      EXPECT_EQ(fused.first, plain.first) << "residual, M=" << M;
      EXPECT_EQ(fused.second, plain.second) << "next matmul, M=" << M;
      EXPECT_LE(rel_err(fused.first, want_res), 8e-3) << "residual M=" << M;
      EXPECT_LE(rel_err(fused.second, want_q), 1e-2) << "next matmul M=" << M;
    }
    for (const Buf& p : {dpw2, dnw2}) cu->free(p);
  }
  for (const Buf& p : {dnw, dpw}) cu->free(p);
}

// Prefill matmuls of 33 rows or more on cuBLAS (cuda_blas.h): weights dequantized to bf16, so the
// products carry the weights' bf16 rounding (2^-9) too: 8e-3 for bf16 outputs as elsewhere, 6e-3
// for f32 outputs. Row counts past one GEMM row block (1024) and gate/up weights past one chunk
// (4096 rows) walk the launch's chunk loops.
TEST_F(CudaBf16Test, PrefillOnBlas) {
  if (!cuda_prefill_on_blas(*cu)) {
    std::printf("SKIP: cuBLAS not loadable here (the tensor-core kernels run prefill)\n");
    GTEST_SKIP() << "no cuBLAS";
  }
  std::mt19937 rng(41);
  auto one = [&](const WeightView& W, int M, const char* what) {
    const WeightView dW = cu->place_weight(W);
    const auto x = bf16_rounded(randn(size_t(M) * size_t(W.cols), uint32_t(M + W.rows)));
    std::vector<float> want(size_t(M) * size_t(W.rows));
    ref->matmul(x.data(), M, W, ActPrecision::F32, want.data());
    Buf dx = up(x), dy = cu->alloc_act(want.size()), df = cu->alloc_f32(want.size());
    cu->matmul(dx, M, dW, ActPrecision::BF16, dy);
    EXPECT_LE(rel_err(down(dy, want.size()), want), 8e-3) << what << " M=" << M << " (bf16 out)";
    cu->matmul(dx, M, dW, ActPrecision::BF16, df);
    EXPECT_LE(rel_err(down(df, want.size()), want), 6e-3) << what << " M=" << M << " (f32 out)";
    for (const Buf& p : {dx, dy, df}) cu->free(p);
  };
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ5_K, WFormat::GgufQ6_K, WFormat::GgufQ8_0, WFormat::GgufQ4_0}) {
    auto data = test::random_blocks(f, 45, 512, rng);
    one(WeightView{f, 45, 512, data.data(), gguf_row_bytes(f, 512)}, 64, std::string(wformat_name(f)).c_str());
  }
  test::OwnedWeight mlx = test::random_mlx(70, 256, 3, 32, DType::BF16, 4);
  one(mlx.view, 100, "mlx affine 3-bit g32");
  test::OwnedWeight bf = test::random_float(33, 160, WFormat::BF16, 9);  // read in place, no copy
  one(bf.view, 77, "bf16");
  auto q8 = test::random_blocks(WFormat::GgufQ8_0, 24, 64, rng);
  one(WeightView{WFormat::GgufQ8_0, 24, 64, q8.data(), gguf_row_bytes(WFormat::GgufQ8_0, 64)}, 1100, "two row blocks");

  // The input norm and gate/up through one launch each, the weights past one chunk.
  const int64_t C = 256, O = 4200;
  const int M = 70;
  auto gb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng), ub = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView U{WFormat::GgufQ4_K, O, C, ub.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const auto x = bf16_rounded(randn(size_t(M) * C, 42)), nw = randn(size_t(C), 43);
  Buf dnw = cu->alloc_f32(C);
  cu->from_host(nw.data(), nw.size(), dnw);
  for (bool table : {false, true}) {
    std::vector<float> want(size_t(M) * O), us(want.size()), xn(x.size());
    ref->gate_up_gelu(x.data(), M, InputNorm{nw.data(), 1e-6f, xn.data()}, G, U, table, ActPrecision::F32, want.data(),
                      us.data());
    Buf dx = up(x), dg = cu->alloc_act(want.size()), du = cu->alloc_act(want.size()), dxn = cu->alloc_act(x.size());
    cu->gate_up_gelu(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, cu->place_weight(G), cu->place_weight(U), table,
                     ActPrecision::BF16, dg, du);
    EXPECT_LE(rel_err(down(dg, want.size()), want), 1e-2) << "gate_up_gelu table=" << table;
    for (const Buf& p : {dx, dg, du, dxn}) cu->free(p);
  }
  {  // q, k, v of one normed input
    std::vector<float> xn(x.size()), wq(size_t(M) * O), wk(size_t(M) * 128);
    ref->rms_norm(x.data(), M, int(C), nw.data(), 1e-6f, ActPrecision::F32, xn.data());
    auto kb = test::random_blocks(WFormat::GgufQ4_K, 128, C, rng);
    const WeightView K{WFormat::GgufQ4_K, 128, C, kb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
    ref->matmul(xn.data(), M, G, ActPrecision::F32, wq.data());
    ref->matmul(xn.data(), M, K, ActPrecision::F32, wk.data());
    const WeightView dG = cu->place_weight(G), dK = cu->place_weight(K);
    Buf dx = up(x), dq = cu->alloc_act(wq.size()), dk = cu->alloc_act(wk.size()), dxn = cu->alloc_act(x.size());
    cu->norm_matmuls(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, {MatOut{&dG, dq}, MatOut{&dK, dk}}, ActPrecision::BF16);
    EXPECT_LE(rel_err(down(dq, wq.size()), wq), 1e-2) << "norm_matmuls q";
    EXPECT_LE(rel_err(down(dk, wk.size()), wk), 1e-2) << "norm_matmuls k";
    for (const Buf& p : {dx, dq, dk, dxn}) cu->free(p);
  }
  cu->free(dnw);
}

// Prefill-sized routed experts (rows > 8: grouped by expert on the device, one grouped
// tensor-core GEMM per projection) against the reference: one expert takes most rows (several
// 64-slot blocks), one none. Weights are rounded to bf16 inside the kernel, hence 2e-2. A row's
// output must not depend on the other rows of the prompt: the first 20 rows alone give the same
// bits as inside the 150. The 32-value block formats use an expert width of 224: a gate tile
// past the matrix's last row, and 32-column steps in the down projection.
TEST_F(CudaBf16Test, GroupedPrefillExperts) {
  const int rows = 150, E = 16, k = 4, d = 512, alone = 20;
  std::mt19937 rng(80);
  auto scores = randn(size_t(rows) * E, 81);
  for (int r = 0; r < rows; ++r) {
    scores[size_t(r) * E + 3] += 3.f;    // chosen by nearly every row
    scores[size_t(r) * E + 5] = -100.f;  // never chosen
  }
  const auto pes = randn(size_t(E), 82);
  std::vector<int32_t> ri(size_t(rows) * k);
  std::vector<float> rw(ri.size());
  ref->router_topk(scores.data(), rows, E, k, pes.data(), ActPrecision::F32, ri.data(), rw.data());
  const auto x = bf16_rounded(randn(size_t(rows) * d, 83));
  // Every GGUF format the grouped kernel's quarter-unit decoding reads (dequant8), and MLX mixed precision.
  for (auto [mixed, fmt] : {std::pair{false, WFormat::GgufQ4_K}, {true, WFormat::GgufQ4_K}, {false, WFormat::GgufQ5_K},
                            {false, WFormat::GgufQ6_K}, {false, WFormat::GgufQ8_0}, {false, WFormat::GgufQ5_0},
                            {false, WFormat::GgufQ4_0}}) {
    const bool blocks32 = !mixed && (fmt == WFormat::GgufQ8_0 || fmt == WFormat::GgufQ5_0 || fmt == WFormat::GgufQ4_0);
    const int I = blocks32 ? 224 : 256;
    const test::TestExperts ex = test::make_test_experts(*cu, E, I, d, mixed, 90, rng, fmt);
    const std::string what = mixed ? "MLX 3/6/5-bit experts" : std::string(wformat_name(fmt)) + " experts";
    std::vector<float> want(size_t(rows) * d);
    ref->moe_experts(x.data(), rows, d, ri.data(), rw.data(), k, ex.gate, ex.up, ex.down, ActPrecision::F32, want.data());
    std::vector<std::vector<float>> got;
    for (int n : {rows, alone}) {
      Buf dx = up(std::vector<float>(x.begin(), x.begin() + ptrdiff_t(n) * d)), dout = cu->alloc_act(size_t(n) * d);
      Buf di = cu->alloc_i32(size_t(n) * k), dw = cu->alloc_f32(size_t(n) * k);
      cu->from_host(ri.data(), size_t(n) * k, di);
      cu->from_host(rw.data(), size_t(n) * k, dw);
      cu->moe_experts(dx, n, d, di, dw, k, ex.dev_gate, ex.dev_up, ex.dev_down, ActPrecision::BF16, dout);
      got.push_back(down(dout, size_t(n) * d));
      for (const Buf& p : {dx, dout, di, dw}) cu->free(p);
    }
    const double e = rel_err(got[0], want);
    EXPECT_LE(e, 2e-2) << what;
    std::printf("grouped prefill experts (%s) bf16 error %.2e\n", what.c_str(), e);
    for (size_t i = 0; i < got[1].size(); ++i)
      ASSERT_EQ(got[1][i], got[0][i]) << what << ": row " << i / d << " differs alone and in the prompt";
  }
}

TEST_F(CudaBf16Test, AttentionOverABf16Cache) {
  // test::attention_scenario stores q, K, V and the output in the backend's activation dtype; the
  // reference gets the unrounded values, so the bound also covers the inputs' bf16 rounding.
  for (auto [pos0, n, window] : {std::tuple{0, 1, 0}, {300, 1, 0}, {40, 7, 16}, {1000, 2, 0}}) {
    EXPECT_LE(rel_err(test::attention_scenario(*cu, pos0, n, window), test::attention_scenario(*ref, pos0, n, window)),
              2e-2)
        << "pos0 " << pos0 << " n " << n << " window " << window;
  }
  for (int D : {512, 128, 72})  // other head widths, grouped KV heads; one split, a few, many
    for (int pos0 : {20, 300, 1000})
      EXPECT_LE(rel_err(test::attention_scenario(*cu, pos0, 1, 0, {}, D, 2), test::attention_scenario(*ref, pos0, 1, 0, {}, D, 2)),
                2e-2)
          << "pos0 " << pos0 << " D " << D;
}

// Prefill-sized calls (the tensor-core flash kernel): causal from 0, a chunk after earlier
// positions, a sliding window narrower than the chunk, an image block attended both ways, head
// dims 128 / 256 / 512, grouped KV heads, query tiles cut short. Same bound as decode.
TEST_F(CudaBf16Test, FlashAttentionAtPrefill) {
  struct Case {
    int pos0, n, window, D, Hk;
    std::vector<std::pair<int, int>> blocks;
  };
  for (const Case& c : std::vector<Case>{{0, 100, 0, 256, 1, {}},
                                         {300, 70, 0, 512, 2, {}},
                                         {50, 150, 64, 256, 2, {}},
                                         {0, 130, 0, 256, 1, {{20, 60}}},
                                         {10, 33, 0, 128, 4, {}},
                                         {0, 16, 8, 512, 1, {}}}) {
    const double e = rel_err(test::attention_scenario(*cu, c.pos0, c.n, c.window, c.blocks, c.D, c.Hk),
                             test::attention_scenario(*ref, c.pos0, c.n, c.window, c.blocks, c.D, c.Hk));
    EXPECT_LE(e, 2e-2) << "pos0 " << c.pos0 << " n " << c.n << " window " << c.window << " D " << c.D;
    std::printf("flash attention pos0 %d n %d window %d D %d Hk %d: error %.2e\n", c.pos0, c.n, c.window, c.D, c.Hk, e);
  }
}

// A MoE layer's fused norms (moe_norms: three rms_norms of two rows in one launch) and exit
// (moe_exit: rms_norm, add, norm_add and the layer scalar in one launch): the same bits as the
// ops launched one by one, and the reference's values within one op's bound each. Widths of one
// register slice (2816, 26B-A4B's) and two (4000); 1 row (decode) and 70 (prefill).
TEST_F(CudaBf16Test, MoeNormsAndExitAsTheirOps) {
  for (int dim : {2816, 4000}) {
    for (int rows : {1, 70}) {
      const size_t n = size_t(rows) * size_t(dim);
      const auto f = bf16_rounded(randn(n, 81, 2.f)), x = bf16_rounded(randn(n, 82, 3.f));
      const auto h1 = bf16_rounded(randn(n, 83)), h2 = bf16_rounded(randn(n, 84, 5.f));
      const auto wf = randn(size_t(dim), 85), wr = randn(size_t(dim), 86), wx = randn(size_t(dim), 87);
      const auto w2 = randn(size_t(dim), 88), w = randn(size_t(dim), 89);
      std::vector<Buf> ws;
      for (const auto* h : {&wf, &wr, &wx, &w2, &w}) {
        ws.push_back(cu->alloc_f32(size_t(dim)));
        cu->from_host(h->data(), h->size(), ws.back());
      }
      const float* dwf = ws[0].f32(), *dwr = ws[1].f32(), *dwx = ws[2].f32(), *dw2 = ws[3].f32(), *dw = ws[4].f32();
      const std::string at = " dim=" + std::to_string(dim) + " rows=" + std::to_string(rows);
      {  // moe_norms
        std::vector<float> want_h1(n), want_xr(n), want_xn(n);
        ref->moe_norms(f.data(), x.data(), rows, dim, wf.data(), wr.data(), wx.data(), 1e-6f, ActPrecision::F32,
                       want_h1.data(), want_xr.data(), want_xn.data());
        Buf df = up(f), dx = up(x), a = cu->alloc_act(n), b = cu->alloc_act(n), c = cu->alloc_act(n);
        cu->moe_norms(df, dx, rows, dim, dwf, dwr, dwx, 1e-6f, ActPrecision::BF16, a, b, c);
        const auto fh1 = down(a, n), fxr = down(b, n), fxn = down(c, n);
        cu->rms_norm(df, rows, dim, dwf, 1e-6f, ActPrecision::BF16, a);
        cu->rms_norm(dx, rows, dim, dwr, 1e-6f, ActPrecision::BF16, b);
        cu->rms_norm(dx, rows, dim, dwx, 1e-6f, ActPrecision::BF16, c);
        EXPECT_EQ(fh1, down(a, n)) << "h1" << at;
        EXPECT_EQ(fxr, down(b, n)) << "xr" << at;
        EXPECT_EQ(fxn, down(c, n)) << "xn" << at;
        EXPECT_LE(rel_err(fh1, want_h1), 8e-3) << "h1" << at;
        EXPECT_LE(rel_err(fxr, want_xr), 8e-3) << "xr" << at;
        EXPECT_LE(rel_err(fxn, want_xn), 8e-3) << "xn" << at;
        for (const Buf& p : {df, dx, a, b, c}) cu->free(p);
      }
      for (float s : {1.f, 0.5f}) {  // moe_exit, without and with the layer scalar
        std::vector<float> want = x, f2(n), h2r = h2;
        ref->moe_exit(want.data(), h1.data(), h2r.data(), rows, dim, w2.data(), w.data(), 1e-6f, s,
                      ActPrecision::F32, f2.data());
        Buf dx = up(x), d1 = up(h1), d2 = up(h2), df = cu->alloc_act(n);
        cu->moe_exit(dx, d1, d2, rows, dim, dw2, dw, 1e-6f, s, ActPrecision::BF16, df);
        const auto fused = down(dx, n);
        Buf ex = up(x), e2 = up(h2);
        cu->rms_norm(e2, rows, dim, dw2, 1e-6f, ActPrecision::BF16, e2);
        cu->add(d1, e2, n, ActPrecision::BF16, df);
        cu->norm_add(ex, df, rows, dim, dw, 1e-6f, ActPrecision::BF16);
        if (s != 1.f) cu->scale(ex, s, n, ActPrecision::BF16, ex);
        EXPECT_EQ(fused, down(ex, n)) << "moe_exit s=" << s << at;
        EXPECT_LE(rel_err(fused, want), 8e-3) << "moe_exit s=" << s << at;
        for (const Buf& p : {dx, d1, d2, df, ex, e2}) cu->free(p);
      }
      for (const Buf& p : ws) cu->free(p);
    }
  }
}

}  // namespace
}  // namespace g4
