// The CUDA decode GEMVs on int8 activations (BackendOptions::int8_dots with bf16 activations,
// cuda_gemv_q8.cu) against the reference backend, for every weight format they take, on odd
// sizes.
//
// Two contracts:
//   - exact arithmetic: with the activation row rounded to int8 blocks on the host exactly as the
//     kernel's prepare step does (q8_roundtrip), the reference's f32 product on those values equals
//     the kernel's f32 output up to the summation order (2e-5 of the output's magnitude);
//   - accuracy: against the reference on the unrounded row, the int8 rounding of x moves a dot by
//     at most 2e-2 of the output's magnitude (printed per case: typically 3e-3 to 8e-3).
// Skips, printing why, when the build has no CUDA or the machine no GPU (CI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <tuple>
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

// What the prepare step makes of a row: blocks of 32, d = max|x| / 127, q = rint(x / d) (ties to
// even), x' = d q. Per row of `cols`.
std::vector<float> q8_roundtrip(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[32 * b + i]));
    const float d = amax / 127.f, id = d != 0.f ? 1.f / d : 0.f;
    for (int i = 0; i < 32; ++i) {
      const float p = x[32 * b + i] * id;
      const float q = std::min(127.f, std::max(-127.f, std::nearbyint(p)));
      out[32 * b + i] = d * q;
    }
  }
  return out;
}

class CudaQ8Test : public ::testing::Test {
 public:
  void SetUp() override {
    std::string why;
    BackendOptions opt;
    opt.activations = DType::BF16;
    opt.int8_dots = true;
    cu = make_cuda_backend(&why, opt);
    if (!cu) {
      std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA";
    }
    ref = make_reference_backend();
  }
  Buf up(const std::vector<float>& h) { return test::upload_act(*cu, h); }
  std::vector<float> down(const Buf& d, size_t n) { return test::download(*cu, d, n); }

  // One decode row through W: the exact contract (f32 output) and the accuracy contract. Float
  // weights are dotted with the unrounded row (exact against it).
  void check(const WeightView& W, const std::string& what) {
    const bool float_w = W.fmt == WFormat::BF16 || W.fmt == WFormat::F16 || W.fmt == WFormat::F32;
    const WeightView dW = cu->place_weight(W);
    const auto x = bf16_rounded(randn(size_t(W.cols), uint32_t(W.rows + W.cols), 1.5f));
    const auto xq = float_w ? x : q8_roundtrip(x);
    std::vector<float> want(size_t(W.rows)), exact(size_t(W.rows));
    ref->matmul(xq.data(), 1, W, ActPrecision::F32, want.data());
    ref->matmul(x.data(), 1, W, ActPrecision::F32, exact.data());
    Buf dx = up(x), df = cu->alloc_f32(want.size()), dy = cu->alloc_act(want.size());
    cu->matmul(dx, 1, dW, ActPrecision::BF16, df);
    const auto got = down(df, want.size());
    EXPECT_LE(rel_err(got, want), 2e-5) << what << ": against the reference on the int8-rounded row";
    const double acc = rel_err(got, exact);
    EXPECT_LE(acc, 2e-2) << what << ": int8 rounding of x";
    cu->matmul(dx, 1, dW, ActPrecision::BF16, dy);
    EXPECT_LE(rel_err(down(dy, want.size()), want), 8e-3) << what << " (bf16 out)";
    std::printf("%-28s int8-rounding error %.2e\n", what.c_str(), acc);
    for (const Buf& p : {dx, df, dy}) cu->free(p);
  }
  std::unique_ptr<Backend> cu, ref;
};

TEST_F(CudaQ8Test, GgufFormats) {
  std::mt19937 rng(11);
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ5_K, WFormat::GgufQ6_K, WFormat::GgufQ8_0, WFormat::GgufQ4_0,
                    WFormat::GgufQ5_0}) {
    for (int64_t cols : {int64_t(256), int64_t(2560), int64_t(10240)}) {  // 1 super-block, E4B's widths
      const int64_t rows = 37;
      auto data = test::random_blocks(f, rows, cols, rng);
      check(WeightView{f, rows, cols, data.data(), gguf_row_bytes(f, cols)},
            std::string(wformat_name(f)) + " cols " + std::to_string(cols));
    }
  }
  // The LM head's shape: many rows (Q6_K rows of 210-byte blocks start at every even address).
  auto data = test::random_blocks(WFormat::GgufQ6_K, 32768 + 5, 768, rng);
  check(WeightView{WFormat::GgufQ6_K, 32768 + 5, 768, data.data(), gguf_row_bytes(WFormat::GgufQ6_K, 768)}, "tall Q6_K");
}

TEST_F(CudaQ8Test, MlxAffineEveryBitsAndGroup) {
  uint32_t seed = 40;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128}) {
      test::OwnedWeight w = test::random_mlx(29, 640, bits, group, DType::BF16, seed++);
      check(w.view, "mlx " + std::to_string(bits) + "-bit g" + std::to_string(group));
    }
  for (DType sdt : {DType::F16, DType::F32}) {  // scale and bias dtypes other than bf16
    test::OwnedWeight w = test::random_mlx(21, 512, 4, 64, sdt, seed++);
    check(w.view, std::string("mlx 4-bit scales ") + (sdt == DType::F16 ? "f16" : "f32"));
  }
}

TEST_F(CudaQ8Test, FloatWeights) {
  for (WFormat f : {WFormat::BF16, WFormat::F16, WFormat::F32}) {
    test::OwnedWeight w = test::random_float(33, 1184, f, 9);
    check(w.view, std::string(wformat_name(f)));
  }
}

// The fused decode ops on the int8 path: the input norm in the prepare step (q/k/v with mixed MLX
// bits, gate/up with GELU) and the residual epilogue, against the reference on unrounded inputs.
TEST_F(CudaQ8Test, FusedDecodeOps) {
  const int64_t C = 1536, O = 768;  // both multiples of 256 (K-quant rows)
  const auto nw = randn(size_t(C), 50), pw = randn(size_t(O), 51);
  Buf dnw = cu->alloc_f32(C), dpw = cu->alloc_f32(O);
  cu->from_host(nw.data(), nw.size(), dnw);
  cu->from_host(pw.data(), pw.size(), dpw);
  const auto x = bf16_rounded(randn(size_t(C), 52, 2.f));
  {  // q (4-bit), k (8-bit), v (4-bit) from one normed row: MLX mixed precision in one call
    test::OwnedWeight q = test::random_mlx(O, C, 4, 64, DType::BF16, 53), k = test::random_mlx(256, C, 8, 64, DType::BF16, 54),
                      v = test::random_mlx(256, C, 4, 64, DType::BF16, 55);
    std::vector<float> xn(x.size()), wq(static_cast<size_t>(O)), wk(256), wv(256);
    ref->norm_matmuls(x.data(), 1, InputNorm{nw.data(), 1e-6f, xn.data()},
                      {{&q.view, wq.data()}, {&k.view, wk.data()}, {&v.view, wv.data()}}, ActPrecision::F32);
    const WeightView dq = cu->place_weight(q.view), dk = cu->place_weight(k.view), dv = cu->place_weight(v.view);
    Buf dx = up(x), dxn = cu->alloc_act(x.size()), yq = cu->alloc_act(O), yk = cu->alloc_act(256), yv = cu->alloc_act(256);
    cu->norm_matmuls(dx, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, {{&dq, yq}, {&dk, yk}, {&dv, yv}}, ActPrecision::BF16);
    EXPECT_LE(rel_err(down(yq, O), wq), 2e-2) << "q";
    EXPECT_LE(rel_err(down(yk, 256), wk), 2e-2) << "k";
    EXPECT_LE(rel_err(down(yv, 256), wv), 2e-2) << "v";
    for (const Buf& p : {dx, dxn, yq, yk, yv}) cu->free(p);
  }
  std::mt19937 rng(56);
  auto gb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng), ub = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView U{WFormat::GgufQ4_K, O, C, ub.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  {  // gelu(xn·Gᵀ) * (xn·Uᵀ), MLX's tanh form and ggml's table
    for (bool table : {false, true}) {
      std::vector<float> want(static_cast<size_t>(O)), us(want.size()), xn(x.size());
      ref->gate_up_gelu(x.data(), 1, InputNorm{nw.data(), 1e-6f, xn.data()}, G, U, table, ActPrecision::F32,
                        want.data(), us.data());
      Buf dx = up(x), dg = cu->alloc_act(O), du = cu->alloc_act(O), dxn = cu->alloc_act(x.size());
      cu->gate_up_gelu(dx, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, cu->place_weight(G), cu->place_weight(U), table,
                       ActPrecision::BF16, dg, du);
      EXPECT_LE(rel_err(down(dg, O), want), 2e-2) << "gate_up_gelu table=" << table;
      for (const Buf& p : {dx, dg, du, dxn}) cu->free(p);
    }
  }
  {  // x_resid += rms_norm(h·Dᵀ)·w (down_proj with the residual epilogue)
    auto db = test::random_blocks(WFormat::GgufQ6_K, C, O, rng);
    const WeightView D{WFormat::GgufQ6_K, C, O, db.data(), gguf_row_bytes(WFormat::GgufQ6_K, O)};
    const auto h = bf16_rounded(randn(size_t(O), 57)), res = bf16_rounded(randn(size_t(C), 58, 3.f));
    std::vector<float> want = res, ys(static_cast<size_t>(C));
    ref->matmul_norm_add(h.data(), 1, D, ys.data(), want.data(), nw.data(), 1e-6f, ActPrecision::F32);
    Buf dh = up(h), dr = up(res), dys = cu->alloc_act(ys.size());
    cu->matmul_norm_add(dh, 1, cu->place_weight(D), dys, dr, dnw.f32(), 1e-6f, ActPrecision::BF16);
    EXPECT_LE(rel_err(down(dr, want.size()), want), 2e-2) << "matmul_norm_add";
    for (const Buf& p : {dh, dr, dys}) cu->free(p);
  }
  for (const Buf& p : {dnw, dpw}) cu->free(p);
}

// A one-row matmul_norm_add's post-norm and residual add is deferred to the next op: fused into
// the prepare of an int8 GEMV on the same row (q/k/v with their input norm, gate/up, a plain
// matmul of the residual), or launched alone before any other op and before a read. Each chain is
// checked against the reference doing the same ops in order: the consumer's outputs and the
// residual itself, whose bits must be those of the update (and the layer scalar) launched alone.
TEST_F(CudaQ8Test, DeferredEpilogueMeetsTheNextOp) {
  const int64_t C = 1536, O = 768;  // residual width C; the producer projects O -> C
  std::mt19937 rng(80);
  auto db = test::random_blocks(WFormat::GgufQ4_K, C, O, rng), gb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng),
       ub = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const WeightView D{WFormat::GgufQ4_K, C, O, db.data(), gguf_row_bytes(WFormat::GgufQ4_K, O)};
  const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView U{WFormat::GgufQ4_K, O, C, ub.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView dD = cu->place_weight(D), dG = cu->place_weight(G), dU = cu->place_weight(U);
  const auto pw = randn(size_t(C), 81), nw = randn(size_t(C), 82);
  Buf dpw = cu->alloc_f32(C), dnw = cu->alloc_f32(C);
  cu->from_host(pw.data(), pw.size(), dpw);
  cu->from_host(nw.data(), nw.size(), dnw);
  const auto h = bf16_rounded(randn(size_t(O), 83)), res = bf16_rounded(randn(size_t(C), 84, 3.f));
  // With a layer scalar after the residual update (sc != 1: it joins the deferred epilogue).
  for (float sc : {1.f, 0.5f}) {
  for (const char* next : {"norm_matmuls", "gate_up_gelu", "matmul", "rms_norm", "read"}) {
    std::vector<float> resid = res, ys(static_cast<size_t>(C)), want(static_cast<size_t>(O)), up_s(want.size()),
                       xn(static_cast<size_t>(C));
    ref->matmul_norm_add(h.data(), 1, D, ys.data(), resid.data(), pw.data(), 1e-6f, ActPrecision::F32);
    if (sc != 1.f) ref->scale(resid.data(), sc, resid.size(), ActPrecision::F32, resid.data());
    Buf dh = up(h), dr = up(res), dys = cu->alloc_act(C), dout = cu->alloc_act(std::max(C, O)),
        dup = cu->alloc_act(O), dxn = cu->alloc_act(C);
    std::vector<float> plain;  // the residual with the update and the scale launched one by one
    {
      Buf pr = up(res);
      cu->matmul_norm_add(dh, 1, dD, dys, pr, dpw.f32(), 1e-6f, ActPrecision::BF16);
      (void)down(pr, resid.size());
      if (sc != 1.f) cu->scale(pr, sc, resid.size(), ActPrecision::BF16, pr);
      plain = down(pr, resid.size());
      cu->free(pr);
    }
    cu->matmul_norm_add(dh, 1, dD, dys, dr, dpw.f32(), 1e-6f, ActPrecision::BF16);
    if (sc != 1.f) cu->scale(dr, sc, resid.size(), ActPrecision::BF16, dr);
    const std::string n = next + std::string(sc != 1.f ? " (scaled)" : "");
    size_t out_n = 0;
    if (n.rfind("norm_matmuls", 0) == 0) {
      ref->norm_matmuls(resid.data(), 1, InputNorm{nw.data(), 1e-6f, xn.data()}, {{&G, want.data()}}, ActPrecision::F32);
      cu->norm_matmuls(dr, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, {{&dG, dout}}, ActPrecision::BF16);
      out_n = size_t(O);
    } else if (n.rfind("gate_up_gelu", 0) == 0) {
      ref->gate_up_gelu(resid.data(), 1, InputNorm{nw.data(), 1e-6f, xn.data()}, G, U, false, ActPrecision::F32,
                        want.data(), up_s.data());
      cu->gate_up_gelu(dr, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, dG, dU, false, ActPrecision::BF16, dout, dup);
      out_n = size_t(O);
    } else if (n.rfind("matmul", 0) == 0) {
      ref->matmul(resid.data(), 1, G, ActPrecision::F32, want.data());
      cu->matmul(dr, 1, dG, ActPrecision::BF16, dout);
      out_n = size_t(O);
    } else if (n.rfind("rms_norm", 0) == 0) {
      want.resize(size_t(C));
      ref->rms_norm(resid.data(), 1, int(C), nw.data(), 1e-6f, ActPrecision::F32, want.data());
      cu->rms_norm(dr, 1, int(C), dnw.f32(), 1e-6f, ActPrecision::BF16, dout);
      out_n = size_t(C);
    }
    const auto got = down(dr, resid.size());
    EXPECT_EQ(got, plain) << "residual, next op " << n << ": not the bits of the ops one by one";
    EXPECT_LE(rel_err(got, resid), 2e-2) << "residual, next op " << n;
    if (out_n) {
      EXPECT_LE(rel_err(down(dout, out_n), want), 2e-2) << "output of " << n;
    }
    for (const Buf& p : {dh, dr, dys, dout, dup, dxn}) cu->free(p);
  }
  }
  for (const Buf& p : {dpw, dnw}) cu->free(p);
}

// The routed experts at decode sizes (rows <= 8: the device path) on int8 rows, rows sharing
// experts, against the reference: Q4_K experts (gate/up 256 x 512, down 512 x 256), and MLX
// experts whose projections differ in bits and group (mixed precision, as mlx-lm quantizes them:
// gate and up then take separate launches).
TEST_F(CudaQ8Test, RoutedExperts) {
  const int rows = 5, E = 8, k = 2, d = 512, I = 256;
  std::mt19937 rng(60);
  const auto scores = randn(size_t(rows) * E, 61), pes = randn(size_t(E), 62);
  std::vector<int32_t> ri(size_t(rows) * k);
  std::vector<float> rw(ri.size());
  ref->router_topk(scores.data(), rows, E, k, pes.data(), ActPrecision::F32, ri.data(), rw.data());
  const auto x = bf16_rounded(randn(size_t(rows) * d, 63));
  for (bool mixed : {false, true}) {
    const test::TestExperts ex = test::make_test_experts(*cu, E, I, d, mixed, 70, rng);
    std::vector<float> want(size_t(rows) * d);
    ref->moe_experts(x.data(), rows, d, ri.data(), rw.data(), k, ex.gate, ex.up, ex.down, ActPrecision::F32, want.data());
    Buf dx = up(x), dout = cu->alloc_act(want.size()), di = cu->alloc_i32(ri.size()), dw = cu->alloc_f32(rw.size());
    cu->from_host(ri.data(), ri.size(), di);
    cu->from_host(rw.data(), rw.size(), dw);
    cu->moe_experts(dx, rows, d, di, dw, k, ex.dev_gate, ex.dev_up, ex.dev_down, ActPrecision::BF16, dout);
    const double e = rel_err(down(dout, want.size()), want);
    EXPECT_LE(e, 2e-2) << (mixed ? "MLX 3/6/5-bit experts" : "Q4_K experts");
    std::printf("routed experts (%s) int8-rounding error %.2e\n", mixed ? "MLX 3/6/5-bit" : "Q4_K", e);
    for (const Buf& p : {dx, dout, di, dw}) cu->free(p);
  }
}

}  // namespace
}  // namespace g4
