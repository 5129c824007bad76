// One-row int8 GEMVs whose blocks stage their weight rows in shared memory
// (BackendOptions::row_fetch Shared, cuda_stage_rows.cuh), and those whose lanes fetch their next
// unit ahead (BackendOptions::gemv_ahead), against a backend whose GEMVs read each unit from global
// memory when they dot it (L2, ahead off): the same bits for every weight format, on odd row counts
// (a last block of fewer rows), 2-byte aligned Q6_K rows, the q/k/v launch of mixed MLX bits, the
// fused gate/up with GELU and the residual epilogue. Skips, printing why, without CUDA or a GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"
#include "backend/backend.h"
#include "backend_test_util.h"
#include "core/dtype.h"
#include "moe_test_experts.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;

using Outputs = std::vector<std::vector<float>>;

// A bf16 + int8-dots CUDA backend with the given row fetch and unit fetch; null (with *why)
// without CUDA.
std::unique_ptr<Backend> cuda_backend(BackendOptions::RowFetch fetch, bool ahead, std::string* why) {
  BackendOptions opt = test::cuda_int8_options();
  opt.row_fetch = fetch;
  opt.gemv_ahead = ahead;
  return make_cuda_backend(why, opt);
}

// Whether a CUDA backend can be made here; prints why not.
bool have_cuda() {
  std::string why;
  if (cuda_backend(BackendOptions::RowFetch::L2, false, &why)) return true;
  std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
  return false;
}

// run's outputs plain, staged and fetched ahead, compared bit for bit (EXPECT_EQ on floats: bf16
// values widened, so equal floats are equal bits, NaN aside: random weights give none here).
void expect_same_bits(const std::string& what, const std::function<Outputs(Backend&)>& run) {
  std::string why;
  const Outputs plain = run(*cuda_backend(BackendOptions::RowFetch::L2, false, &why));
  const Outputs staged = run(*cuda_backend(BackendOptions::RowFetch::Shared, false, &why));
  const Outputs ahead = run(*cuda_backend(BackendOptions::RowFetch::L2, true, &why));
  ASSERT_EQ(staged.size(), plain.size()) << what;
  ASSERT_EQ(ahead.size(), plain.size()) << what;
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(staged[i], plain[i]) << what << ", staged, output " << i;
    EXPECT_EQ(ahead[i], plain[i]) << what << ", ahead, output " << i;
  }
}

// y = x·Wᵀ for one row, in f32 and in bf16.
Outputs one_matmul(Backend& cu, const WeightView& W) {
  const WeightView dW = cu.place_weight(W);
  const auto x = bf16_rounded(randn(size_t(W.cols), uint32_t(W.rows + W.cols), 1.5f));
  Buf dx = test::upload_act(cu, x), df = cu.alloc_f32(size_t(W.rows)), dy = cu.alloc_act(size_t(W.rows));
  cu.matmul(dx, 1, dW, ActPrecision::BF16, df);
  cu.matmul(dx, 1, dW, ActPrecision::BF16, dy);
  Outputs out = {test::download(cu, df, size_t(W.rows)), test::download(cu, dy, size_t(W.rows))};
  for (const Buf& p : {dx, df, dy}) cu.free(p);
  return out;
}

TEST(CudaStagedRows, EveryFormatOneRow) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA";
  std::mt19937 rng(21);
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ5_K, WFormat::GgufQ6_K, WFormat::GgufQ8_0, WFormat::GgufQ4_0,
                    WFormat::GgufQ5_0}) {
    for (int64_t cols : {int64_t(256), int64_t(2560), int64_t(10240)}) {
      const int64_t rows = 37;
      auto data = test::random_blocks(f, rows, cols, rng);
      const WeightView W{f, rows, cols, data.data(), gguf_row_bytes(f, cols)};
      expect_same_bits(std::string(wformat_name(f)) + " cols " + std::to_string(cols),
                       [&](Backend& cu) { return one_matmul(cu, W); });
    }
  }
  auto tall = test::random_blocks(WFormat::GgufQ6_K, 32768 + 5, 768, rng);  // rows at every even address
  const WeightView T{WFormat::GgufQ6_K, 32768 + 5, 768, tall.data(), gguf_row_bytes(WFormat::GgufQ6_K, 768)};
  expect_same_bits("tall Q6_K", [&](Backend& cu) { return one_matmul(cu, T); });
  uint32_t seed = 30;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128}) {
      const test::OwnedWeight w = test::random_mlx(29, 640, bits, group, DType::BF16, seed++);
      expect_same_bits("mlx " + std::to_string(bits) + "-bit g" + std::to_string(group),
                       [&](Backend& cu) { return one_matmul(cu, w.view); });
    }
  for (WFormat f : {WFormat::BF16, WFormat::F16, WFormat::F32}) {
    const test::OwnedWeight w = test::random_float(33, 1184, f, 9);
    expect_same_bits(std::string(wformat_name(f)), [&](Backend& cu) { return one_matmul(cu, w.view); });
  }
}

// The fused one-row launches: q/k/v of mixed MLX bits from one normed row, gate/up with GELU
// (MLX's tanh form and ggml's table), and down with its residual epilogue.
TEST(CudaStagedRows, FusedDecodeOps) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA";
  const int64_t C = 1536, O = 768;
  std::mt19937 rng(56);
  const auto nw = randn(size_t(C), 50), pw = randn(size_t(C), 51);
  const auto x = bf16_rounded(randn(size_t(C), 52, 2.f)), h = bf16_rounded(randn(size_t(O), 57)),
             res = bf16_rounded(randn(size_t(C), 58, 3.f));
  const test::OwnedWeight q = test::random_mlx(O, C, 4, 64, DType::BF16, 53), k = test::random_mlx(256, C, 8, 64, DType::BF16, 54),
                          v = test::random_mlx(256, C, 4, 64, DType::BF16, 55);
  auto gb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng), ub = test::random_blocks(WFormat::GgufQ4_K, O, C, rng),
       db = test::random_blocks(WFormat::GgufQ6_K, C, O, rng);
  const WeightView G{WFormat::GgufQ4_K, O, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView U{WFormat::GgufQ4_K, O, C, ub.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  const WeightView D{WFormat::GgufQ6_K, C, O, db.data(), gguf_row_bytes(WFormat::GgufQ6_K, O)};
  expect_same_bits("q/k/v, gate/up, down + residual", [&](Backend& cu) {
    Buf dnw = cu.alloc_f32(size_t(C)), dpw = cu.alloc_f32(size_t(C));
    cu.from_host(nw.data(), nw.size(), dnw);
    cu.from_host(pw.data(), pw.size(), dpw);
    Outputs out;
    const WeightView dq = cu.place_weight(q.view), dk = cu.place_weight(k.view), dv = cu.place_weight(v.view);
    Buf dx = test::upload_act(cu, x), dxn = cu.alloc_act(size_t(C)), yq = cu.alloc_act(size_t(O)), yk = cu.alloc_act(256),
        yv = cu.alloc_act(256);
    cu.norm_matmuls(dx, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, {{&dq, yq}, {&dk, yk}, {&dv, yv}}, ActPrecision::BF16);
    out.push_back(test::download(cu, yq, size_t(O)));
    out.push_back(test::download(cu, yk, 256));
    out.push_back(test::download(cu, yv, 256));
    const WeightView dG = cu.place_weight(G), dU = cu.place_weight(U), dD = cu.place_weight(D);
    for (bool table : {false, true}) {
      Buf dg = cu.alloc_act(size_t(O)), du = cu.alloc_act(size_t(O));
      cu.gate_up_gelu(dx, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, dG, dU, table, ActPrecision::BF16, dg, du);
      out.push_back(test::download(cu, dg, size_t(O)));
      for (const Buf& p : {dg, du}) cu.free(p);
    }
    Buf dh = test::upload_act(cu, h), dr = test::upload_act(cu, res), dys = cu.alloc_act(size_t(C));
    cu.matmul_norm_add(dh, 1, dD, dys, dr, dpw.f32(), 1e-6f, ActPrecision::BF16);
    out.push_back(test::download(cu, dr, size_t(C)));
    for (const Buf& p : {dnw, dpw, dx, dxn, yq, yk, yv, dh, dr, dys}) cu.free(p);
    return out;
  });
}

// Decode-sized routed experts (the int8 expert GEMV, cuda_gemv_q8.cu's q8_moe_kernel): its lanes
// fetching ahead give the plain loop's bits, for every GGUF format and MLX mixed precision.
TEST(CudaStagedRows, RoutedExpertsDecode) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA";
  const int rows = 3, E = 8, k = 2, d = 512;
  const auto x = bf16_rounded(randn(size_t(rows) * d, 60));
  const std::vector<int32_t> idx = {0, 5, 3, 5, 7, 1};  // rows x k, distinct within a row
  const std::vector<float> wts = {0.7f, 0.3f, 0.55f, 0.45f, 0.9f, 0.1f};
  for (auto [mixed, fmt] : {std::pair{false, WFormat::GgufQ4_K}, {true, WFormat::GgufQ4_K}, {false, WFormat::GgufQ5_K},
                            {false, WFormat::GgufQ6_K}, {false, WFormat::GgufQ8_0}, {false, WFormat::GgufQ5_0},
                            {false, WFormat::GgufQ4_0}}) {
    const std::string what = mixed ? "MLX 3/6/5-bit experts" : std::string(wformat_name(fmt)) + " experts";
    expect_same_bits(what, [&](Backend& cu) {
      std::mt19937 rng(61);  // the same weights on every backend
      const test::TestExperts ex = test::make_test_experts(cu, E, 256, d, mixed, 62, rng, fmt);
      Buf dx = test::upload_act(cu, x), dout = cu.alloc_act(size_t(rows) * d);
      Buf di = cu.alloc_i32(idx.size()), dw = cu.alloc_f32(wts.size());
      cu.from_host(idx.data(), idx.size(), di);
      cu.from_host(wts.data(), wts.size(), dw);
      cu.moe_experts(dx, rows, d, di, dw, k, ex.dev_gate, ex.dev_up, ex.dev_down, ActPrecision::BF16, dout);
      Outputs out = {test::download(cu, dout, size_t(rows) * d)};
      for (const Buf& p : {dx, dout, di, dw}) cu.free(p);
      return out;
    });
  }
}

}  // namespace
}  // namespace g4
