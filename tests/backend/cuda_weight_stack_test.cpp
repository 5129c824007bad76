// Weights placed as a stack (Backend::place_stack: a layer's q|k|v, gate|up) on the CUDA backend:
// parts of one layout lie back to back in one allocation, and the launches over them, planned once
// at placement (cuda_weight_plans.h), give the bits of the same weights placed one by one, whose
// launches take their plan at the call. On one decode row (the int8 GEMVs, bf16 activations), for
// q|k|v of one format, of two formats (Q4_K_M's Q6_K v), of mixed MLX bits, and gate|up with GELU;
// then the adapted modules' separate launches. Skips, printing why, without CUDA or a GPU (CI).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"
#include "backend/backend.h"
#include "backend_test_util.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;

using Outputs = std::vector<std::vector<float>>;

// A weight's bytes owned by the test: GGUF blocks or an MLX / float test weight.
struct Part {
  std::vector<uint8_t> blocks;
  test::OwnedWeight owned;
  WeightView view;
};

Part gguf_part(WFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  Part p;
  p.blocks = test::random_blocks(f, rows, cols, rng);
  p.view = WeightView{f, rows, cols, p.blocks.data(), gguf_row_bytes(f, cols)};
  return p;
}

Part mlx_part(int64_t rows, int64_t cols, int bits, uint32_t seed) {
  Part p;
  p.owned = test::random_mlx(rows, cols, bits, 64, DType::BF16, seed);
  p.view = p.owned.view;
  return p;
}

Part float_part(int64_t rows, int64_t cols, uint32_t seed) {
  Part p;
  p.owned = test::random_float(rows, cols, WFormat::BF16, seed);
  p.view = p.owned.view;
  return p;
}

size_t data_bytes(const WeightView& w) { return size_t(w.rows) * size_t(w.row_bytes); }
size_t round256(size_t n) { return (n + 255) / 256 * 256; }

// One decode row through q/k/v (norm_matmuls) on a backend that placed them stacked or one by one.
Outputs run_qkv(Backend& cu, const std::vector<Part>& parts, bool stacked) {
  const int64_t C = parts[0].view.cols;
  const auto nw = randn(size_t(C), 70), x = bf16_rounded(randn(size_t(C), 71, 2.f));
  WeightView w[3];
  for (size_t i = 0; i < parts.size(); ++i) w[i] = parts[i].view;
  if (stacked) {
    cu.place_stack({&w[0], &w[1], &w[2]}, StackUse::Outputs);
  } else {
    for (size_t i = 0; i < parts.size(); ++i) w[i] = cu.place_weight(w[i]);
  }
  Buf dnw = test::upload(cu, nw), dx = test::upload_act(cu, x), dxn = cu.alloc_act(size_t(C));
  std::vector<Buf> ys;
  for (size_t i = 0; i < parts.size(); ++i) ys.push_back(cu.alloc_act(size_t(w[i].rows)));
  const InputNorm norm{dnw.f32(), 1e-6f, dxn};
  if (parts.size() == 3)
    cu.norm_matmuls(dx, 1, norm, {{&w[0], ys[0]}, {&w[1], ys[1]}, {&w[2], ys[2]}}, ActPrecision::BF16);
  else
    cu.norm_matmuls(dx, 1, norm, {{&w[0], ys[0]}, {&w[1], ys[1]}}, ActPrecision::BF16);
  Outputs out;
  for (size_t i = 0; i < parts.size(); ++i) out.push_back(test::download(cu, ys[i], size_t(w[i].rows)));
  // Each alone, as an adapted module's separate launch reads it.
  for (size_t i = 0; i < parts.size(); ++i) {
    cu.matmul(dxn, 1, w[i], ActPrecision::BF16, ys[i]);
    out.push_back(test::download(cu, ys[i], size_t(w[i].rows)));
  }
  for (const Buf& p : {dnw, dx, dxn}) cu.free(p);
  for (const Buf& p : ys) cu.free(p);
  return out;
}

// One decode row through gate|up with GELU (MLX's tanh form and ggml's table).
Outputs run_gate_up(Backend& cu, const Part& gate, const Part& up, bool stacked) {
  const int64_t C = gate.view.cols, I = gate.view.rows;
  const auto nw = randn(size_t(C), 72), x = bf16_rounded(randn(size_t(C), 73, 2.f));
  WeightView g = gate.view, u = up.view;
  if (stacked) {
    cu.place_stack({&g, &u}, StackUse::Gated);
  } else {
    g = cu.place_weight(g);
    u = cu.place_weight(u);
  }
  Buf dnw = test::upload(cu, nw), dx = test::upload_act(cu, x), dxn = cu.alloc_act(size_t(C));
  Buf dg = cu.alloc_act(size_t(I)), du = cu.alloc_act(size_t(I));
  Outputs out;
  for (bool table : {false, true}) {
    cu.gate_up_gelu(dx, 1, InputNorm{dnw.f32(), 1e-6f, dxn}, g, u, table, ActPrecision::BF16, dg, du);
    out.push_back(test::download(cu, dg, size_t(I)));
  }
  for (const Buf& p : {dnw, dx, dxn, dg, du}) cu.free(p);
  return out;
}

void expect_same(const std::string& what, const Outputs& stacked, const Outputs& alone) {
  ASSERT_EQ(stacked.size(), alone.size()) << what;
  for (size_t i = 0; i < alone.size(); ++i) EXPECT_EQ(stacked[i], alone[i]) << what << ", output " << i;
}

TEST(CudaWeightStack, StackedLaunchesGiveTheBitsOfWeightsPlacedAlone) {
  std::string why;
  if (!test::cuda_int8_backend(false, &why)) {
    std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
    GTEST_SKIP() << "no CUDA";
  }
  std::mt19937 rng(74);
  const int64_t C = 2560;
  struct Case {
    std::string what;
    std::vector<Part> parts;
  };
  std::vector<Case> cases;
  cases.push_back({"Q4_K q|k|v", {}});
  for (int64_t rows : {2048, 512, 512}) cases.back().parts.push_back(gguf_part(WFormat::GgufQ4_K, rows, C, rng));
  cases.push_back({"Q4_K q|k, Q6_K v", {}});
  for (int64_t rows : {2048, 512}) cases.back().parts.push_back(gguf_part(WFormat::GgufQ4_K, rows, C, rng));
  cases.back().parts.push_back(gguf_part(WFormat::GgufQ6_K, 512, C, rng));
  cases.push_back({"Q6_K q|k (K = V)", {}});
  for (int64_t rows : {1024, 256}) cases.back().parts.push_back(gguf_part(WFormat::GgufQ6_K, rows, C, rng));
  cases.push_back({"MLX 4 / 8 / 4-bit q|k|v", {}});
  cases.back().parts.push_back(mlx_part(1024, C, 4, 75));
  cases.back().parts.push_back(mlx_part(256, C, 8, 76));
  cases.back().parts.push_back(mlx_part(256, C, 4, 77));
  for (const Case& c : cases) {
    const Outputs alone = run_qkv(*test::cuda_int8_backend(false, &why), c.parts, false);
    auto be = test::cuda_int8_backend(false, &why);
    const Outputs stacked = run_qkv(*be, c.parts, true);
    expect_same(c.what, stacked, alone);
  }
  // gate|up: Q4_K, MLX 4-bit, and bf16 weights.
  const Part gq = gguf_part(WFormat::GgufQ4_K, 1280, C, rng), uq = gguf_part(WFormat::GgufQ4_K, 1280, C, rng);
  const Part gm = mlx_part(1280, C, 4, 78), um = mlx_part(1280, C, 4, 79);
  const Part gb = float_part(640, C, 80), ub = float_part(640, C, 81);
  for (auto [what, g, u] : {std::tuple{"Q4_K gate|up", &gq, &uq}, std::tuple{"MLX 4-bit gate|up", &gm, &um},
                            std::tuple{"bf16 gate|up", &gb, &ub}}) {
    const Outputs alone = run_gate_up(*test::cuda_int8_backend(false, &why), *g, *u, false);
    const Outputs stacked = run_gate_up(*test::cuda_int8_backend(false, &why), *g, *u, true);
    expect_same(what, stacked, alone);
  }
}

// A stack's parts of one layout lie back to back in one allocation, each 256-byte aligned as it
// would be alone; a part of another layout starts an allocation of its own; absent parts are
// skipped.
TEST(CudaWeightStack, PartsOfOneLayoutShareAnAllocation) {
  std::string why;
  auto be = test::cuda_int8_backend(false, &why);
  if (!be) {
    std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
    GTEST_SKIP() << "no CUDA";
  }
  std::mt19937 rng(82);
  const Part q = gguf_part(WFormat::GgufQ4_K, 200, 512, rng), k = gguf_part(WFormat::GgufQ4_K, 33, 512, rng),
             v = gguf_part(WFormat::GgufQ6_K, 33, 512, rng);
  WeightView wq = q.view, wk = k.view, wv = v.view, none;
  be->place_stack({&wq, &wk, &none, &wv}, StackUse::Outputs);
  EXPECT_EQ(none.data, nullptr);
  const auto* q0 = static_cast<const uint8_t*>(wq.data);
  EXPECT_EQ(static_cast<const uint8_t*>(wk.data) - q0, ptrdiff_t(round256(data_bytes(wq))));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(wk.data) % 256, 0u);
  EXPECT_NE(wv.data, v.view.data);  // placed, in an allocation of its own
  EXPECT_EQ(reinterpret_cast<uintptr_t>(wv.data) % 256, 0u);
  const Part a = mlx_part(96, 256, 4, 83), b = mlx_part(40, 256, 4, 84);
  WeightView wa = a.view, wb = b.view;
  be->place_stack({&wa, &wb}, StackUse::Gated);
  EXPECT_EQ(static_cast<const uint8_t*>(wb.data) - static_cast<const uint8_t*>(wa.data),
            ptrdiff_t(round256(data_bytes(wa))));
  const size_t sb = size_t(wa.rows) * size_t(wa.cols / wa.group_size) * 2;
  EXPECT_EQ(static_cast<const uint8_t*>(wb.scales) - static_cast<const uint8_t*>(wa.scales), ptrdiff_t(round256(sb)));
  EXPECT_EQ(static_cast<const uint8_t*>(wb.biases) - static_cast<const uint8_t*>(wa.biases), ptrdiff_t(round256(sb)));
}

}  // namespace
}  // namespace g4
