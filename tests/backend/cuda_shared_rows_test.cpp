// Decode launches sharing their int8 activation rows on the CUDA backend (BackendOptions::
// fuse_decode_ops): a q/k/v launch of a second format reads the rows the first one prepared, and
// the output projection reads the int8 rows the held-back attention launch wrote
// (cuda_pending.h PendingAttention), and the per-layer input's projection those of the held-back
// gelu_mul (PendingGeluMul). Each gives the bits of each launch preparing its own rows.
// Skips, printing why, without CUDA or a GPU (CI).
#include <gtest/gtest.h>

#include <cstdio>
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

// q (Q4_K), k (Q4_K) and v (Q6_K: a Q4_K_M file's more-bits layers) from one normed input: two
// launches, the second reading the int8 rows the first prepared, against a backend where each
// prepares its own (fuse off): the same bits, one row and three row-exact rows.
TEST(CudaSharedRows, QkvOfTwoFormatsPrepareOnce) {
  const int64_t C = 512, Q = 256, KV = 128;
  std::mt19937 rng(91);
  auto qb = test::random_blocks(WFormat::GgufQ4_K, Q, C, rng), kb = test::random_blocks(WFormat::GgufQ4_K, KV, C, rng),
       vb = test::random_blocks(WFormat::GgufQ6_K, KV, C, rng);
  const int64_t k4 = int64_t(gguf_row_bytes(WFormat::GgufQ4_K, C)), k6 = int64_t(gguf_row_bytes(WFormat::GgufQ6_K, C));
  const WeightView Wq{WFormat::GgufQ4_K, Q, C, qb.data(), k4}, Wk{WFormat::GgufQ4_K, KV, C, kb.data(), k4},
                   Wv{WFormat::GgufQ6_K, KV, C, vb.data(), k6};
  const auto nw = randn(size_t(C), 93);
  for (bool row_exact : {false, true}) {
    const int M = row_exact ? 3 : 1;
    const auto x = bf16_rounded(randn(size_t(M * C), 95, 2.f));
    std::vector<float> got[2][3];
    for (int fuse = 0; fuse < 2; ++fuse) {
      std::string why;
      BackendOptions opt;
      opt.activations = DType::BF16;
      opt.row_exact = row_exact;
      opt.fuse_decode_ops = fuse == 1;
      std::unique_ptr<Backend> cu = make_cuda_backend(&why, opt);
      if (!cu) {
        std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
        GTEST_SKIP() << "no CUDA";
      }
      const WeightView dq = cu->place_weight(Wq), dk = cu->place_weight(Wk), dv = cu->place_weight(Wv);
      Buf dnw = cu->alloc_f32(size_t(C)), dx = test::upload_act(*cu, x), xn = cu->alloc_act(size_t(M * C));
      cu->from_host(nw.data(), nw.size(), dnw);
      Buf yq = cu->alloc_act(size_t(M * Q)), yk = cu->alloc_act(size_t(M * KV)), yv = cu->alloc_act(size_t(M * KV));
      cu->norm_matmuls(dx, M, InputNorm{dnw.f32(), 1e-6f, xn}, {{&dq, yq}, {&dk, yk}, {&dv, yv}}, ActPrecision::BF16);
      got[fuse][0] = test::download(*cu, yq, size_t(M * Q));
      got[fuse][1] = test::download(*cu, yk, size_t(M * KV));
      got[fuse][2] = test::download(*cu, yv, size_t(M * KV));
      for (const Buf& p : {dnw, dx, xn, yq, yk, yv}) cu->free(p);
    }
    const char* what = row_exact ? "row-exact, 3 rows" : "one row";
    EXPECT_EQ(got[1][0], got[0][0]) << what << ": q";
    EXPECT_EQ(got[1][1], got[0][1]) << what << ": k";
    EXPECT_EQ(got[1][2], got[0][2]) << what << ": v from the first launch's int8 rows";
  }
}

// Attention (one split, and several merged by the last block) held back for the output
// projection, which reads the attention output's int8 form: the same bits as the ops one by one.
TEST(CudaSharedRows, AttentionRowsForTheOutputProjection) {
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

// gelu(gate) * up, both forms (the tanh form and ggml's table), held back for the matmul of its
// output, which reads the int8 form the gelu_mul launch wrote: the same bits as the ops apart (a
// sync between them launches the held op alone), for a plain matmul and matmul_norm_add (the
// per-layer input's projection), one row and three row-exact rows.
TEST(CudaSharedRows, GeluMulRowsForTheNextMatmul) {
  const int64_t C = 256, O = 160;
  std::mt19937 rng(102);
  auto wb = test::random_blocks(WFormat::GgufQ4_K, O, C, rng);
  const WeightView W{WFormat::GgufQ4_K, O, C, wb.data(), int64_t(gguf_row_bytes(WFormat::GgufQ4_K, C))};
  const auto pw = randn(size_t(O), 103);
  for (bool row_exact : {false, true}) {
    std::string why;
    std::unique_ptr<Backend> cu = test::cuda_int8_backend(row_exact, &why);
    if (!cu) {
      std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA";
    }
    const int M = row_exact ? 3 : 1;
    const WeightView dW = cu->place_weight(W);
    const Buf gate = test::upload_act(*cu, bf16_rounded(randn(size_t(M * C), 104, 2.f))),
              up = test::upload_act(*cu, bf16_rounded(randn(size_t(M * C), 105))), dpw = test::upload(*cu, pw);
    const auto resid0 = bf16_rounded(randn(size_t(M * O), 106));
    for (bool ggml : {false, true}) {
      for (bool norm_add : {false, true}) {
        std::vector<float> y[2], g[2], r[2];
        for (int apart = 0; apart < 2; ++apart) {
          Buf h = cu->alloc_act(size_t(M * C)), out = cu->alloc_act(size_t(M * O)), resid = test::upload_act(*cu, resid0);
          if (ggml) cu->gelu_mul_ggml(gate, up, size_t(M * C), h);
          else cu->gelu_mul(gate, up, size_t(M * C), ActPrecision::BF16, h);
          if (apart) cu->sync();
          if (norm_add) cu->matmul_norm_add(h, M, dW, out, resid, dpw.f32(), 1e-6f, ActPrecision::BF16);
          else cu->matmul(h, M, dW, ActPrecision::BF16, out);
          y[apart] = test::download(*cu, out, size_t(M * O));
          g[apart] = test::download(*cu, h, size_t(M * C));
          r[apart] = test::download(*cu, resid, size_t(M * O));
          for (const Buf& p : {h, out, resid}) cu->free(p);
        }
        const std::string what = std::string(ggml ? "ggml table" : "tanh form") + (norm_add ? ", matmul_norm_add" : ", matmul") +
                                 (row_exact ? ", 3 row-exact rows" : ", one row");
        EXPECT_EQ(g[0], g[1]) << what << ": gelu_mul's output";
        EXPECT_EQ(y[0], y[1]) << what << ": the projection of the held gelu_mul's int8 rows";
        EXPECT_EQ(r[0], r[1]) << what << ": the residual";
      }
    }
    for (const Buf& p : {gate, up, dpw}) cu->free(p);
    cu->release_weight(dW);
  }
}

}  // namespace
}  // namespace g4
