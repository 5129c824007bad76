// Decode GEMVs held back for the ops after them on the CUDA backend (BackendOptions::
// hold_gemvs; cuda_pending.h PendingGemv): gate/up's output written in int8 form for the down
// projection, and the per-layer input's gate with its gelu_mul folded into the epilogue, its output
// written in int8 form for the projection after it. Each chain must give the bits of the ops one by
// one (fuse off): every output, and the residual the deferred epilogues update. One row (held), and
// three rows of a row-exact launch (never held: the ops one by one either way). Skips, printing
// why, without CUDA or a GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "backend/backend.h"
#include "backend_test_util.h"
#include "core/dtype.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;

std::unique_ptr<Backend> int8_backend(bool row_exact, bool fuse, std::string* why) {
  BackendOptions opt;
  opt.activations = DType::BF16;
  opt.int8_dots = true;
  opt.row_exact = row_exact;
  opt.fuse_decode_ops = fuse;
  opt.hold_gemvs = fuse;
  return make_cuda_backend(why, opt);
}


// gate/up with GELU (tanh form and ggml's table) from a normed row, then the down projection with
// its post-norm and residual add: the down launch reads gate/up's int8 output rows.
TEST(CudaHeldGemv, GateUpRowsForTheDownProjection) {
  const int64_t C = 512, I = 1024;
  std::mt19937 rng(120);
  const test::GgufWeight G = test::random_gguf_weight(WFormat::GgufQ4_K, I, C, rng),
                         U = test::random_gguf_weight(WFormat::GgufQ4_K, I, C, rng),
                         D = test::random_gguf_weight(WFormat::GgufQ6_K, C, I, rng);
  const auto nw = randn(size_t(C), 121), pw = randn(size_t(C), 122);
  for (bool row_exact : {false, true})
    for (bool table : {false, true}) {
      const int M = row_exact ? 3 : 1;
      const auto x = bf16_rounded(randn(size_t(M * C), 123, 2.f));
      std::vector<float> gate[2], resid[2];
      for (int fuse = 0; fuse < 2; ++fuse) {
        std::string why;
        std::unique_ptr<Backend> cu = int8_backend(row_exact, fuse == 1, &why);
        if (!cu) {
          std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
          GTEST_SKIP() << "no CUDA";
        }
        const WeightView dG = cu->place_weight(G.view), dU = cu->place_weight(U.view), dD = cu->place_weight(D.view);
        Buf dnw = test::upload(*cu, nw), dpw = test::upload(*cu, pw), dx = test::upload_act(*cu, x);
        Buf xn = cu->alloc_act(size_t(M * C)), g = cu->alloc_act(size_t(M * I)), u = cu->alloc_act(size_t(M * I)),
            y = cu->alloc_act(size_t(M * C));
        cu->gate_up_gelu(dx, M, InputNorm{dnw.f32(), 1e-6f, xn}, dG, dU, table, ActPrecision::BF16, g, u);
        cu->matmul_norm_add(g, M, dD, y, dx, dpw.f32(), 1e-6f, ActPrecision::BF16);
        resid[fuse] = test::download(*cu, dx, size_t(M * C));
        gate[fuse] = test::download(*cu, g, size_t(M * I));
        for (const Buf& p : {dnw, dpw, dx, xn, g, u, y}) cu->free(p);
      }
      const std::string what = std::string(row_exact ? "3 row-exact rows" : "one row") + (table ? ", ggml gelu" : ", tanh gelu");
      EXPECT_EQ(gate[1], gate[0]) << what << ": gate/up output";
      EXPECT_EQ(resid[1], resid[0]) << what << ": residual after the down projection";
    }
}

// The per-layer input block: the residual update left by the down projection, the gate matmul of
// the residual (taking that update), gelu_mul with the layer's per-layer input in place, then the
// projection with its post-norm and residual add. With the fold, skipping the gelu_mul launches
// (G4_CUDA_SKIP) changes nothing: the fold is what computed them.
TEST(CudaHeldGemv, PerLayerInputGateFoldsItsGelu) {
  const int64_t C = 512, F = 256, P = 256;  // residual, the down projection's input, per-layer width
  std::mt19937 rng(130);
  const test::GgufWeight D = test::random_gguf_weight(WFormat::GgufQ4_K, C, F, rng),
                         Wg = test::random_gguf_weight(WFormat::GgufQ4_K, P, C, rng),
                         Wp = test::random_gguf_weight(WFormat::GgufQ6_K, C, P, rng);
  const auto pw1 = randn(size_t(C), 131), pw2 = randn(size_t(C), 132);
  for (bool row_exact : {false, true})
    for (bool table : {false, true}) {
      const int M = row_exact ? 3 : 1;
      const auto h = bf16_rounded(randn(size_t(M * F), 133)), res = bf16_rounded(randn(size_t(M * C), 134, 3.f)),
                 ple = bf16_rounded(randn(size_t(M * P), 135));
      std::vector<float> got[3][2];  // [fuse off, fuse on, fuse on with gelu_mul skipped][pg, resid]
      for (int run = 0; run < (row_exact ? 2 : 3); ++run) {
        std::string why;
        if (run == 2) setenv("G4_CUDA_SKIP", "gelu_mul,gelu_mul_ggml", 1);
        std::unique_ptr<Backend> cu = int8_backend(row_exact, run > 0, &why);
        unsetenv("G4_CUDA_SKIP");
        if (!cu) {
          std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
          GTEST_SKIP() << "no CUDA";
        }
        const WeightView dD = cu->place_weight(D.view), dWg = cu->place_weight(Wg.view), dWp = cu->place_weight(Wp.view);
        Buf d1 = test::upload(*cu, pw1), d2 = test::upload(*cu, pw2), dh = test::upload_act(*cu, h),
            dr = test::upload_act(*cu, res), dple = test::upload_act(*cu, ple);
        Buf y = cu->alloc_act(size_t(M * C)), pg = cu->alloc_act(size_t(M * P));
        cu->matmul_norm_add(dh, M, dD, y, dr, d1.f32(), 1e-6f, ActPrecision::BF16);
        cu->matmul(dr, M, dWg, ActPrecision::BF16, pg);
        if (table) cu->gelu_mul_ggml(pg, dple, size_t(M * P), pg);
        else cu->gelu_mul(pg, dple, size_t(M * P), ActPrecision::BF16, pg);
        cu->matmul_norm_add(pg, M, dWp, y, dr, d2.f32(), 1e-6f, ActPrecision::BF16);
        got[run][1] = test::download(*cu, dr, size_t(M * C));
        got[run][0] = test::download(*cu, pg, size_t(M * P));
        for (const Buf& p : {d1, d2, dh, dr, dple, y, pg}) cu->free(p);
      }
      const std::string what = std::string(row_exact ? "3 row-exact rows" : "one row") + (table ? ", ggml gelu" : ", tanh gelu");
      EXPECT_EQ(got[1][0], got[0][0]) << what << ": gelu(gate) * per-layer input";
      EXPECT_EQ(got[1][1], got[0][1]) << what << ": residual after the projection";
      if (row_exact) continue;
      EXPECT_EQ(got[2][0], got[0][0]) << what << ": the fold computed the skipped gelu_mul";
      EXPECT_EQ(got[2][1], got[0][1]) << what << ": residual, gelu_mul skipped";
    }
}

}  // namespace
}  // namespace g4
