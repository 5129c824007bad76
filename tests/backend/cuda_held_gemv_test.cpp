// The CUDA backend's held-back int8 GEMV (cuda_pending.h PendingGemv): a decode matmul or gate/up
// launch is held for the op after it, which may join it:
//   - a matmul (or matmul_norm_add) of its output with no input norm skips its prepare launch and
//     reads the int8 form the GEMV wrote of its output: the same bits as the ops one by one;
//   - gelu_mul (both GELU forms) of its output by a vector becomes the GEMV's store: the gate is
//     rounded once instead of twice, so the result is within bf16 rounding of the ops one by one.
// Each chain runs twice on the same backend: as the decode step issues it, and with a sync after
// every op (nothing held back). One row, and three rows with row-exact steps (the multi-row GEMV
// and its per-group counters). Skips, printing why, without CUDA or a GPU (CI).
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
#include "core/dtype.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;
using test::rel_err;

// The feed-forward and per-layer-input chains of an E-style decode layer at small sizes.
struct Chain {
  static constexpr int64_t C = 512, I = 768, Pw = 64;  // K-quant widths: multiples of 256  // hidden, MLP width, per-layer input width
  std::mt19937 rng{91};
  std::vector<uint8_t> gb = test::random_blocks(WFormat::GgufQ4_K, I, C, rng),
                       ub = test::random_blocks(WFormat::GgufQ4_K, I, C, rng),
                       db = test::random_blocks(WFormat::GgufQ6_K, C, I, rng),
                       pgb = test::random_blocks(WFormat::GgufQ8_0, Pw, C, rng);
  test::OwnedWeight proj = test::random_mlx(C, Pw, 4, 32, DType::BF16, 92);
  WeightView G{WFormat::GgufQ4_K, I, C, gb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  WeightView U{WFormat::GgufQ4_K, I, C, ub.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
  WeightView D{WFormat::GgufQ6_K, C, I, db.data(), gguf_row_bytes(WFormat::GgufQ6_K, I)};
  WeightView PG{WFormat::GgufQ8_0, Pw, C, pgb.data(), gguf_row_bytes(WFormat::GgufQ8_0, C)};
  std::vector<float> nw = randn(size_t(C), 93), pw = randn(size_t(C), 94);

  struct Out {
    std::vector<float> mlp, down, resid, ple_gate, ple_out;
  };
  // x [M, C] through gate/up (ggml table or tanh form), down (a plain matmul), then the per-layer
  // input's gate, gelu_mul by ple [M, Pw] and its projection with the post-norm into resid.
  Out run(Backend& be, int M, bool table, bool one_by_one) {
    const WeightView dG = be.place_weight(G), dU = be.place_weight(U), dD = be.place_weight(D),
                     dPG = be.place_weight(PG), dP = be.place_weight(proj.view);
    const auto x = bf16_rounded(randn(size_t(M * C), 95, 2.f)), ple = bf16_rounded(randn(size_t(M * Pw), 96));
    const auto res = bf16_rounded(randn(size_t(M * C), 97, 3.f));
    Buf dnw = be.alloc_f32(size_t(C)), dpw = be.alloc_f32(size_t(C));
    be.from_host(nw.data(), nw.size(), dnw);
    be.from_host(pw.data(), pw.size(), dpw);
    Buf dx = test::upload_act(be, x), dple = test::upload_act(be, ple), dres = test::upload_act(be, res);
    Buf xn = be.alloc_act(size_t(M * C)), g = be.alloc_act(size_t(M * I)), u = be.alloc_act(size_t(M * I)),
        y = be.alloc_act(size_t(M * C)), pg = be.alloc_act(size_t(M * Pw)), po = be.alloc_act(size_t(M * C));
    auto step = [&] {
      if (one_by_one) be.sync();
    };
    be.gate_up_gelu(dx, M, InputNorm{dnw.f32(), 1e-6f, xn}, dG, dU, table, ActPrecision::BF16, g, u, nullptr, nullptr);
    step();
    be.matmul(g, M, dD, ActPrecision::BF16, y);
    step();
    be.matmul(dx, M, dPG, ActPrecision::BF16, pg);
    step();
    if (table) be.gelu_mul_ggml(pg, dple, size_t(M * Pw), pg);
    else be.gelu_mul(pg, dple, size_t(M * Pw), ActPrecision::BF16, pg);
    step();
    be.matmul_norm_add(pg, M, dP, po, dres, dpw.f32(), 1e-6f, ActPrecision::BF16, nullptr);
    Out o;
    o.mlp = test::download(be, g, size_t(M * I));
    o.down = test::download(be, y, size_t(M * C));
    o.resid = test::download(be, dres, size_t(M * C));
    o.ple_gate = test::download(be, pg, size_t(M * Pw));
    for (const Buf& p : {dnw, dpw, dx, dple, dres, xn, g, u, y, pg, po}) be.free(p);
    for (const WeightView& w : {dG, dU, dD, dPG, dP}) be.release_weight(w);
    return o;
  }
};

TEST(CudaHeldGemv, JoinedOpsMatchTheOpsOneByOne) {
  for (bool row_exact : {false, true}) {
    std::string why;
    std::unique_ptr<Backend> cu = test::cuda_int8_backend(row_exact, &why);
    if (!cu) {
      std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA";
    }
    const int M = row_exact ? 3 : 1;
    Chain c;
    for (bool table : {false, true}) {
      const std::string what = std::string(row_exact ? "row-exact, 3 rows" : "one row") + (table ? ", ggml gelu" : ", tanh gelu");
      const Chain::Out held = c.run(*cu, M, table, false), apart = c.run(*cu, M, table, true);
      EXPECT_EQ(held.mlp, apart.mlp) << what << ": gate/up";
      EXPECT_EQ(held.down, apart.down) << what << ": down from the GEMV's own int8 rows";
      // The gate rounded once (in the GEMV's store) against twice (store, then gelu_mul).
      const double eg = rel_err(held.ple_gate, apart.ple_gate), er = rel_err(held.resid, apart.resid);
      EXPECT_LE(eg, 8e-3) << what << ": per-layer input gate";
      EXPECT_LE(er, 8e-3) << what << ": residual after the projection";
      std::printf("%-28s gate %.2e, residual %.2e from the ops one by one\n", what.c_str(), eg, er);
    }
  }
}

// Attention (one split, and several merged by the last block) held back for the output
// projection, which reads the attention output's int8 form: the same bits as the ops one by one.
TEST(CudaHeldGemv, AttentionJoinsTheOutputProjection) {
  std::string why;
  std::unique_ptr<Backend> cu = test::cuda_int8_backend(false, &why);
  if (!cu) {
    std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
    GTEST_SKIP() << "no CUDA";
  }
  const int H = 4, Hk = 2, D = 64, O = 160;
  std::mt19937 rng(98);
  auto ob = test::random_blocks(WFormat::GgufQ4_0, O, H * D, rng);
  const WeightView dW = cu->place_weight(WeightView{WFormat::GgufQ4_0, O, H * D, ob.data(), gguf_row_bytes(WFormat::GgufQ4_0, H * D)});
  for (int cap : {16, 300}) {  // one split; several (attention_splits)
    const int pos = cap - 3;
    std::vector<int32_t> book(size_t(cap), -1);
    Buf kc = cu->alloc_act(size_t(cap) * Hk * D), vc = cu->alloc_act(size_t(cap) * Hk * D);
    const KvBuffer kv = test::f32_kv(kc, vc, book.data(), cap, Hk, D, 0);
    {
      const Buf k = test::upload_act(*cu, randn(size_t(pos + 1) * Hk * D, 99)),
                v = test::upload_act(*cu, randn(size_t(pos + 1) * Hk * D, 100));
      AttnSeq all;
      all.row0 = 0;
      all.n = pos + 1;
      all.pos0 = 0;
      all.kv = kv;
      cu->kv_write(all, k, v);
      cu->free(k);
      cu->free(v);
    }
    AttnSeq s;
    s.row0 = 0;
    s.n = 1;
    s.pos0 = pos;
    s.kv = kv;
    const Buf q = test::upload_act(*cu, randn(size_t(H) * D, 101));
    std::vector<float> got[2];
    for (int apart = 0; apart < 2; ++apart) {
      Buf att = cu->alloc_act(size_t(H) * D), y = cu->alloc_act(size_t(O));
      cu->attention(q, H, {s}, 0.125f, ActPrecision::BF16, att);
      if (apart) cu->sync();
      cu->matmul(att, 1, dW, ActPrecision::BF16, y);
      got[apart] = test::download(*cu, y, size_t(O));
      cu->free(att);
      cu->free(y);
    }
    EXPECT_EQ(got[0], got[1]) << "cache of " << cap << ": the projection of the held attention's int8 rows";
    for (const Buf& p : {kc, vc, q}) cu->free(p);
  }
  cu->release_weight(dW);
}

}  // namespace
}  // namespace g4
