// The CUDA backend's ops against the reference backend on random data (every weight format of
// matmul and embed, norms, rope, KV writes and attention with and without a window, the
// elementwise ops). f32 accumulation in another order: bounds are relative to the reference's
// magnitude. Skips, printing why, when the build has no CUDA or the machine no GPU (CI).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "../quant/quant_test_util.h"
#include "backend/backend.h"
#include "core/token_mask.h"
#include "backend_test_util.h"

namespace g4 {
namespace {
using test::randn;
using test::rel_err;
Buf up(Backend& be, const std::vector<float>& h) { return test::upload(be, h); }
std::vector<float> down(Backend& be, const Buf& d, size_t n) { return test::download(be, d, n); }

// The f32 path (BackendOptions::activations = F32): these tests hold it to f32 bounds; the bf16
// path's own tests are in cuda_bf16_test.cpp.
std::unique_ptr<Backend> cuda_or_skip() {
  std::string why;
  BackendOptions opt;
  opt.activations = DType::F32;
  auto be = make_cuda_backend(&why, opt);
  if (!be) std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
  return be;
}

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cu = cuda_or_skip();
    if (!cu) GTEST_SKIP() << "no CUDA";
    ref = make_reference_backend();
  }
  std::unique_ptr<Backend> cu, ref;
};

void check_matmul(Backend& cu, Backend& ref, const WeightView& host_w, const char* what) {
  const WeightView dw = cu.place_weight(host_w);
  // 40 and 77 rows take the tensor-core path (kTcMinRows), with partial tiles.
  for (int M : {1, 3, 9, 20, 40, 77}) {
    const auto x = randn(size_t(M) * size_t(host_w.cols), uint32_t(M + host_w.rows));
    std::vector<float> want(size_t(M) * size_t(host_w.rows));
    ref.matmul(x.data(), M, host_w, ActPrecision::F32, want.data());
    Buf dx = up(cu, x);
    Buf dy = cu.alloc_f32(want.size());
    cu.matmul(dx, M, dw, ActPrecision::F32, dy);
    EXPECT_LE(rel_err(down(cu, dy, want.size()), want), 2e-5) << what << " M=" << M;
    cu.free(dx);
    cu.free(dy);
  }
}

// Callers choose the device paths by on_device(): greedy decoding's argmax and the engine's top k
// on the GPU, copying one id per row instead of the logits (lost once in a refactor: every decode
// step then copied 1 MB of logits and took the argmax on the host, ~1 ms a token at E4B).
TEST_F(CudaBackendTest, SaysItIsOnTheDevice) { EXPECT_TRUE(cu->on_device()); }

TEST_F(CudaBackendTest, MatmulEveryWeightFormat) {
  std::mt19937 rng(1);
  for (WFormat f : {WFormat::GgufQ4_0, WFormat::GgufQ5_0, WFormat::GgufQ8_0, WFormat::GgufQ4_K,
                    WFormat::GgufQ5_K, WFormat::GgufQ6_K}) {
    const int64_t rows = 37, cols = 512;
    auto data = test::random_blocks(f, rows, cols, rng);
    check_matmul(*cu, *ref, WeightView{f, rows, cols, data.data(), gguf_row_bytes(f, cols)},
                 std::string(wformat_name(f)).c_str());
  }
  // A tall matrix (the LM head's shape: >= 32768 rows) takes the one-row kernel at M = 1.
  // Q6_K rows of 210 bytes alternate 4- and 2-byte alignment (its decode kernel reads 16-bit halves).
  for (WFormat f : {WFormat::GgufQ8_0, WFormat::GgufQ4_K, WFormat::GgufQ6_K}) {
    const int64_t rows = 32768 + 37, cols = 256;
    auto data = test::random_blocks(f, rows, cols, rng);
    check_matmul(*cu, *ref, WeightView{f, rows, cols, data.data(), gguf_row_bytes(f, cols)},
                 ("tall " + std::string(wformat_name(f))).c_str());
  }
  // Long K-quant rows at M = 1: 2 and 8 warps share a row (kquant_split), 37 rows leave a
  // partial block.
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ6_K}) {
    for (int64_t cols : {4096, 12288}) {
      auto data = test::random_blocks(f, 37, cols, rng);
      check_matmul(*cu, *ref, WeightView{f, 37, cols, data.data(), gguf_row_bytes(f, cols)},
                   ("long rows " + std::string(wformat_name(f)) + " " + std::to_string(cols)).c_str());
    }
  }
  // The tensor-core path picks its weight tiles by the block count (cuda_tc_matmul.cu): at 40-77
  // activation rows, 37 and 4480 rows take 32-row tiles, the tall matrix 64-row ones (on a 132-SM
  // H100 / H200).
  {
    const int64_t rows = 4480, cols = 256;
    auto data = test::random_blocks(WFormat::GgufQ4_K, rows, cols, rng);
    check_matmul(*cu, *ref, WeightView{WFormat::GgufQ4_K, rows, cols, data.data(), gguf_row_bytes(WFormat::GgufQ4_K, cols)},
                 "mid-size Q4_K");
  }
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    test::OwnedWeight w = test::random_mlx(45, 256, bits, 64, DType::BF16, uint32_t(bits));
    check_matmul(*cu, *ref, w.view, ("mlx affine " + std::to_string(bits) + "-bit").c_str());
  }
  for (WFormat f : {WFormat::F32, WFormat::BF16, WFormat::F16}) {
    test::OwnedWeight w = test::random_float(33, 160, f, 9);
    check_matmul(*cu, *ref, w.view, std::string(wformat_name(f)).c_str());
    test::OwnedWeight odd = test::random_float(17, 150, f, 10);  // cols % 32 != 0: the per-element kernel
    check_matmul(*cu, *ref, odd.view, (std::string(wformat_name(f)) + " odd width").c_str());
  }
}

TEST_F(CudaBackendTest, EmbedNormRopeElementwise) {
  std::mt19937 rng(2);
  const int64_t V = 50, d = 256;
  auto blocks = test::random_blocks(WFormat::GgufQ8_0, V, d, rng);
  const WeightView E{WFormat::GgufQ8_0, V, d, blocks.data(), gguf_row_bytes(WFormat::GgufQ8_0, d)};
  const WeightView dE = cu->place_weight(E);
  const std::vector<int32_t> ids = {3, 0, 49, 3};
  Buf dids = cu->alloc_i32(ids.size());
  cu->from_host(ids.data(), ids.size(), dids);
  std::vector<float> want(ids.size() * d);
  ref->embed(E, ids.data(), int(ids.size()), 16.f, ActPrecision::F32, want.data());
  Buf de = cu->alloc_f32(want.size());
  cu->embed(dE, dids, int(ids.size()), 16.f, ActPrecision::F32, de);
  EXPECT_EQ(down(*cu, de, want.size()), want);
  // K-quant tables (a thread per 32-value unit, many blocks per row) and a width 32 does not divide.
  for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ6_K}) {
    const int64_t w = 1280;
    auto kb = test::random_blocks(f, V, w, rng);
    const WeightView K{f, V, w, kb.data(), gguf_row_bytes(f, w)};
    std::vector<float> kwant(ids.size() * w);
    ref->embed(K, ids.data(), int(ids.size()), 0.5f, ActPrecision::F32, kwant.data());
    Buf dk = cu->alloc_f32(kwant.size());
    cu->embed(cu->place_weight(K), dids, int(ids.size()), 0.5f, ActPrecision::F32, dk);
    EXPECT_EQ(down(*cu, dk, kwant.size()), kwant) << wformat_name(f);
  }
  {
    test::OwnedWeight odd = test::random_float(V, 150, WFormat::F32, 11);
    std::vector<float> owant(ids.size() * 150);
    ref->embed(odd.view, ids.data(), int(ids.size()), 2.f, ActPrecision::F32, owant.data());
    Buf dodd = cu->alloc_f32(owant.size());
    cu->embed(cu->place_weight(odd.view), dids, int(ids.size()), 2.f, ActPrecision::F32, dodd);
    EXPECT_EQ(down(*cu, dodd, owant.size()), owant) << "f32 width 150";
  }

  const int rows = 6, dim = 640;
  const auto x = randn(size_t(rows * dim), 3, 2.f), w = randn(size_t(dim), 4), b = randn(size_t(rows * dim), 5);
  Buf dx = up(*cu, x), dw = up(*cu, w), db = up(*cu, b), dy = cu->alloc_f32(x.size());
  std::vector<float> r(x.size());
  ref->rms_norm(x.data(), rows, dim, w.data(), 1e-6f, ActPrecision::F32, r.data());
  cu->rms_norm(dx, rows, dim, dw.f32(), 1e-6f, ActPrecision::F32, dy);
  EXPECT_LE(rel_err(down(*cu, dy, x.size()), r), 1e-6);
  ref->gelu_mul(x.data(), b.data(), x.size(), ActPrecision::F32, r.data());
  cu->gelu_mul(dx, db, x.size(), ActPrecision::F32, dy);
  EXPECT_LE(rel_err(down(*cu, dy, x.size()), r), 1e-6);
  ref->gelu_mul_ggml(x.data(), b.data(), x.size(), r.data());
  cu->gelu_mul_ggml(dx, db, x.size(), dy);
  EXPECT_EQ(down(*cu, dy, x.size()), r);  // table lookup and one product: exact
  ref->add(x.data(), b.data(), x.size(), ActPrecision::F32, r.data());
  cu->add(dx, db, x.size(), ActPrecision::F32, dy);
  EXPECT_EQ(down(*cu, dy, x.size()), r);
  ref->scale(x.data(), 0.37f, x.size(), ActPrecision::F32, r.data());
  cu->scale(dx, 0.37f, x.size(), ActPrecision::F32, dy);
  EXPECT_EQ(down(*cu, dy, x.size()), r);
  r = x;
  ref->softcap(r.data(), r.size(), 3.f, ActPrecision::F32);
  cu->copy(dx, x.size(), dy);
  cu->softcap(dy, x.size(), 3.f, ActPrecision::F32);
  EXPECT_LE(rel_err(down(*cu, dy, x.size()), r), 1e-6);

  // rope: 6 rows of 2 heads of 320 (half-split), default and proportional tables
  for (RopeSpec spec : {RopeSpec{RopeKind::Default, 10000.f, 1.f, 1.f},
                        RopeSpec{RopeKind::Proportional, 1e6f, 0.25f, 1.f}}) {
    const RopeTable t = make_rope_table(spec, 320);
    r = x;
    ref->rope(r.data(), rows, 2, 320, 17, t, ActPrecision::F32);
    cu->from_host(x.data(), x.size(), dy);
    cu->rope(dy, rows, 2, 320, 17, t, ActPrecision::F32);
    EXPECT_LE(rel_err(down(*cu, dy, x.size()), r), 2e-6);
  }

  // gather_rows and copy_cols
  const std::vector<int32_t> idx = {5, 0, 2};
  Buf didx = cu->alloc_i32(idx.size());
  cu->from_host(idx.data(), idx.size(), didx);
  cu->gather_rows(dx, didx, 3, dim, dy);
  std::vector<float> g(3 * dim);
  ref->gather_rows(x.data(), idx.data(), 3, dim, g.data());
  EXPECT_EQ(down(*cu, dy, g.size()), g);
  cu->copy_cols(dx, rows, dim, 100, 64, dy);
  std::vector<float> cc(size_t(rows) * 64);
  ref->copy_cols(x.data(), rows, dim, 100, 64, cc.data());
  EXPECT_EQ(down(*cu, dy, cc.size()), cc);
}

// The fused ops (one kernel each on CUDA) against the reference backend's composed defaults.
TEST_F(CudaBackendTest, FusedOpsMatchReference) {
  const int rows = 3, dim = 640;
  const auto x = randn(size_t(rows * dim), 41, 2.f), o = randn(size_t(rows * dim), 42), w = randn(size_t(dim), 43);
  {  // norm_add: x += rms_norm(o)·w
    std::vector<float> want = x, oh = o;
    ref->norm_add(want.data(), oh.data(), rows, dim, w.data(), 1e-6f, ActPrecision::F32);
    Buf dx = up(*cu, x), dox = up(*cu, o), dw = up(*cu, w);
    cu->norm_add(dx, dox, rows, dim, dw.f32(), 1e-6f, ActPrecision::F32);
    EXPECT_LE(rel_err(down(*cu, dx, x.size()), want), 1e-6);
    for (const Buf& p : {dx, dox, dw}) cu->free(p);
  }
  // matmul_norm_add: a projection, then x += rms_norm(y)·w, for one row and for rows past one
  // launch's 8.
  for (const int64_t C : {1024, 6144}) {  // 6144: four warps per row at M = 1
    std::mt19937 wrng(61);
    const int64_t O = 640;
    auto wb = test::random_blocks(WFormat::GgufQ4_K, O, C, wrng);
    const WeightView W{WFormat::GgufQ4_K, O, C, wb.data(), gguf_row_bytes(WFormat::GgufQ4_K, C)};
    const WeightView dW = cu->place_weight(W);
    const auto pw = randn(size_t(O), 62);
    Buf dpw = up(*cu, pw);
    for (int M : {1, 11, 40}) {
      const auto xin = randn(size_t(M) * C, uint32_t(63 + M)), res = randn(size_t(M) * O, uint32_t(64 + M), 3.f);
      std::vector<float> want = res, ys(size_t(M) * O);
      ref->matmul_norm_add(xin.data(), M, W, ys.data(), want.data(), pw.data(), 1e-6f, ActPrecision::F32);
      Buf dx = up(*cu, xin), dr = up(*cu, res), dys = cu->alloc_f32(ys.size());
      cu->matmul_norm_add(dx, M, dW, dys, dr, dpw.f32(), 1e-6f, ActPrecision::F32);
      EXPECT_LE(rel_err(down(*cu, dr, want.size()), want), 2e-6) << "matmul_norm_add M=" << M << " C=" << C;
      for (const Buf& p : {dx, dr, dys}) cu->free(p);
    }
    cu->free(dpw);
  }
  // norm_rope: two sequences (2 rows at position 5, 1 row at 40) of 4 heads of 256; full and
  // partial (proportional, pairs that do not rotate) tables.
  for (RopeSpec spec : {RopeSpec{RopeKind::Default, 10000.f, 1.f, 1.f},
                        RopeSpec{RopeKind::Proportional, 1e6f, 0.25f, 1.f}}) {
    const int H = 4, D = 256;
    const RopeTable t = make_rope_table(spec, D);
    const auto q = randn(size_t(3 * H * D), 44, 3.f), nw = randn(size_t(D), 45);
    std::vector<AttnSeq> seqs(2);
    seqs[0].row0 = 0, seqs[0].n = 2, seqs[0].pos0 = 5;
    seqs[1].row0 = 2, seqs[1].n = 1, seqs[1].pos0 = 40;
    std::vector<float> want = q;
    ref->norm_rope(want.data(), H, D, nw.data(), 1e-6f, seqs, t, ActPrecision::F32);
    Buf dq = up(*cu, q), dw = up(*cu, nw);
    cu->norm_rope(dq, H, D, dw.f32(), 1e-6f, seqs, t, ActPrecision::F32);
    EXPECT_LE(rel_err(down(*cu, dq, q.size()), want), 2e-6) << "rope kind " << int(spec.kind);
    cu->free(dq);
    cu->free(dw);
  }
  // gate_up_gelu: both gelu forms, with and without the input norm, one and several rows (past one
  // launch's 8), a k-quant and a legacy format.
  std::mt19937 rng(46);
  for (auto [f, C] : {std::pair{WFormat::GgufQ5_0, int64_t(512)}, std::pair{WFormat::GgufQ4_K, int64_t(512)},
                      std::pair{WFormat::GgufQ4_K, int64_t(4096)}}) {  // 4096: two warps per row at M = 1
    const int64_t I = 80;
    auto gb = test::random_blocks(f, I, C, rng), ub = test::random_blocks(f, I, C, rng);
    const WeightView G{f, I, C, gb.data(), gguf_row_bytes(f, C)}, U{f, I, C, ub.data(), gguf_row_bytes(f, C)};
    const WeightView dG = cu->place_weight(G), dU = cu->place_weight(U);
    const auto nw = randn(size_t(C), 48);
    Buf dnw = up(*cu, nw);
    for (int M : {1, 5, 11, 45}) {
      for (bool table : {false, true}) {
        for (bool normed : {false, true}) {
          const auto xin = randn(size_t(M) * C, uint32_t(47 + M), 2.f);
          std::vector<float> want(size_t(M) * I), scratch(want.size()), xn(xin.size());
          ref->gate_up_gelu(xin.data(), M, InputNorm{normed ? nw.data() : nullptr, 1e-6f, xn.data()}, G, U, table,
                            ActPrecision::F32, want.data(), scratch.data());
          Buf dx = up(*cu, xin), dy = cu->alloc_f32(want.size()), ds = cu->alloc_f32(want.size()),
                dxn = cu->alloc_f32(xin.size());
          cu->gate_up_gelu(dx, M, InputNorm{normed ? dnw.f32() : nullptr, 1e-6f, dxn}, dG, dU, table, ActPrecision::F32,
                           dy, ds);
          // The ggml table rounds gelu's input to f16: a last-bit difference in the dot can move it
          // one f16 step, so that form gets a looser bound.
          EXPECT_LE(rel_err(down(*cu, dy, want.size()), want), table ? 2e-3 : 2e-5)
              << wformat_name(f) << " C=" << C << " M=" << M << " table " << table << " normed " << normed;
          for (const Buf& p : {dx, dy, ds, dxn}) cu->free(p);
        }
      }
    }
    cu->free(dnw);
  }
  // norm_matmuls: q/k/v-like projections of one normed input, one format (one launch) and mixed
  // formats (one launch per run of a format).
  // kquant: Q4_K q/k with a Q6_K v (a Q4_K_M layer): at one row the input is normed by its own
  // kernel first (normed_args), the matmuls read it as is.
  for (int variant : {0, 1, 2}) {
    const bool mixed = variant == 1, kquant = variant == 2;
    const int64_t C = kquant ? 1536 : 640;
    const WFormat fq = kquant ? WFormat::GgufQ4_K : WFormat::GgufQ5_0;
    const WFormat fv = kquant ? WFormat::GgufQ6_K : mixed ? WFormat::GgufQ8_0 : WFormat::GgufQ5_0;
    auto qb = test::random_blocks(fq, 96, C, rng), kb = test::random_blocks(fq, 32, C, rng),
         vb = test::random_blocks(fv, 32, C, rng);
    const WeightView Q{fq, 96, C, qb.data(), gguf_row_bytes(fq, C)},
        K{fq, 32, C, kb.data(), gguf_row_bytes(fq, C)},
        V{fv, 32, C, vb.data(), gguf_row_bytes(fv, C)};
    const WeightView dQ = cu->place_weight(Q), dK = cu->place_weight(K), dV = cu->place_weight(V);
    const auto nw = randn(size_t(C), 49);
    Buf dnw = up(*cu, nw);
    for (int M : {1, 9, 70}) {
      const auto xin = randn(size_t(M) * C, uint32_t(50 + M), 2.f);
      std::vector<float> q(size_t(M) * 96), k(size_t(M) * 32), v(size_t(M) * 32), xn(xin.size());
      ref->norm_matmuls(xin.data(), M, InputNorm{nw.data(), 1e-6f, xn.data()},
                        {{&Q, q.data()}, {&K, k.data()}, {&V, v.data()}}, ActPrecision::F32);
      Buf dx = up(*cu, xin), dq = cu->alloc_f32(q.size()), dk = cu->alloc_f32(k.size()), dv = cu->alloc_f32(v.size()),
            dxn = cu->alloc_f32(xin.size());
      cu->norm_matmuls(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, {{&dQ, dq}, {&dK, dk}, {&dV, dv}}, ActPrecision::F32);
      EXPECT_LE(rel_err(down(*cu, dq, q.size()), q), 2e-5) << "q M=" << M << " variant " << variant;
      EXPECT_LE(rel_err(down(*cu, dk, k.size()), k), 2e-5) << "k M=" << M << " variant " << variant;
      EXPECT_LE(rel_err(down(*cu, dv, v.size()), v), 2e-5) << "v M=" << M << " variant " << variant;
      for (const Buf& p : {dx, dq, dk, dv, dxn}) cu->free(p);
    }
    cu->free(dnw);
  }
}

// attn_prep: q/k norms and ropes, v's norm and the cache writes of two sequences (one full cache,
// one ring), with and without v_norm, and for a KV-shared layer (q only).
TEST_F(CudaBackendTest, AttnPrepMatchesReference) {
  const int H = 4, Hk = 2, D = 128, rows = 3;
  const RopeTable t = make_rope_table(RopeSpec{RopeKind::Proportional, 1e6f, 0.25f, 1.f}, D);
  const auto q0 = randn(size_t(rows) * H * D, 70, 2.f), k0 = randn(size_t(rows) * Hk * D, 71, 2.f),
             v0 = randn(size_t(rows) * Hk * D, 72, 2.f), qw = randn(size_t(D), 73), kw = randn(size_t(D), 74);
  const int cap0 = 16, cap1 = 6;  // sequence 1: window 4, a ring
  for (bool v_norm : {false, true}) {
    for (bool with_k : {true, false}) {
      // Host (reference) run.
      std::vector<float> q = q0, k = k0, v = v0, kc0(size_t(cap0) * Hk * D, 0.f), vc0 = kc0,
                         kc1(size_t(cap1) * Hk * D, 0.f), vc1 = kc1;
      std::vector<int32_t> p0(cap0, -1), p1(cap1, -1), dp0(cap0, -1), dp1(cap1, -1);
      std::vector<AttnSeq> seqs(2);
      seqs[0].row0 = 0, seqs[0].n = 2, seqs[0].pos0 = 5;
      seqs[0].kv = test::f32_kv(kc0.data(), vc0.data(), p0.data(), cap0, Hk, D, 0);
      seqs[1].row0 = 2, seqs[1].n = 1, seqs[1].pos0 = 9;
      seqs[1].kv = test::f32_kv(kc1.data(), vc1.data(), p1.data(), cap1, Hk, D, 4);
      ref->attn_prep(q.data(), H, with_k ? k.data() : nullptr, v.data(), Hk, D, qw.data(), kw.data(), v_norm, 1e-6f,
                     seqs, t, ActPrecision::F32);
      // Device run.
      Buf dq = up(*cu, q0), dk = up(*cu, k0), dv = up(*cu, v0), dqw = up(*cu, qw), dkw = up(*cu, kw);
      Buf dkc0 = up(*cu, std::vector<float>(kc0.size(), 0.f)), dvc0 = up(*cu, std::vector<float>(kc0.size(), 0.f)),
            dkc1 = up(*cu, std::vector<float>(kc1.size(), 0.f)), dvc1 = up(*cu, std::vector<float>(kc1.size(), 0.f));
      std::vector<AttnSeq> dseqs = seqs;
      dseqs[0].kv = test::f32_kv(dkc0, dvc0, dp0.data(), cap0, Hk, D, 0);
      dseqs[1].kv = test::f32_kv(dkc1, dvc1, dp1.data(), cap1, Hk, D, 4);
      cu->attn_prep(dq, H, with_k ? dk : Buf(), dv, Hk, D, dqw.f32(), dkw.f32(), v_norm, 1e-6f, dseqs, t, ActPrecision::F32);
      const std::string what = std::string("v_norm ") + (v_norm ? "on" : "off") + (with_k ? "" : ", q only");
      EXPECT_LE(rel_err(down(*cu, dq, q.size()), q), 2e-6) << what;
      EXPECT_LE(rel_err(down(*cu, dk, k.size()), k), 2e-6) << what;
      EXPECT_LE(rel_err(down(*cu, dv, v.size()), v), 2e-6) << what;
      EXPECT_LE(rel_err(down(*cu, dkc0, kc0.size()), kc0), 2e-6) << what;
      EXPECT_LE(rel_err(down(*cu, dvc0, vc0.size()), vc0), 2e-6) << what;
      EXPECT_LE(rel_err(down(*cu, dkc1, kc1.size()), kc1), 2e-6) << what;
      EXPECT_LE(rel_err(down(*cu, dvc1, vc1.size()), vc1), 2e-6) << what;
      EXPECT_EQ(dp0, p0) << what;
      EXPECT_EQ(dp1, p1) << what;
      for (const Buf& p : {dq, dk, dv, dqw, dkw, dkc0, dvc0, dkc1, dvc1}) cu->free(p);
    }
  }
}

// MoE: routing (the reference's rule: top-k by score, ties to the higher expert index, softmax
// over the chosen in f32) and the experts against the reference backend, with rows that share
// experts and experts that get no row: at decode sizes (rows <= 8: the device router and routed
// GEMVs) and at prefill sizes (the host-grouped path), and the router at 26B-A4B's E = 128, k = 8.
void check_moe(Backend& cu, Backend& ref, int rows, int E, int k, int d, int I) {
  SCOPED_TRACE("rows " + std::to_string(rows) + " E " + std::to_string(E) + " k " + std::to_string(k));
  auto scores = randn(size_t(rows) * E, 70 + rows);
  scores[3] = scores[5];  // a tie: the higher expert index wins (mlx argpartition)
  const auto pes = randn(size_t(E), 71);
  std::vector<int32_t> ri(size_t(rows) * k), ci(ri.size());
  std::vector<float> rw(ri.size());
  ref.router_topk(scores.data(), rows, E, k, pes.data(), ActPrecision::F32, ri.data(), rw.data());
  Buf ds = up(cu, scores), dp = up(cu, pes), dw = cu.alloc_f32(rw.size());
  Buf di = cu.alloc_i32(ri.size());
  cu.router_topk(ds, rows, E, k, dp.f32(), ActPrecision::F32, di, dw);
  cu.to_host(di, ci.size(), ci.data());
  EXPECT_EQ(ci, ri);
  EXPECT_LE(rel_err(down(cu, dw, rw.size()), rw), 1e-6);  // expf against std::exp
  std::vector<std::vector<float>> store;
  ExpertStack g, u, dn, cg, cu_up, cdn;
  for (auto [stack, rows_, cols_, dev, seed] :
       {std::tuple{&g, I, d, &cg, 100u}, std::tuple{&u, I, d, &cu_up, 101u}, std::tuple{&dn, d, I, &cdn, 102u}}) {
    store.push_back(randn(size_t(E) * rows_ * cols_, seed, 0.2f));  // [E, rows, cols]
    *stack = ExpertStack::of_matrix(f32_view(store.back().data(), int64_t(E) * rows_, cols_), E);
    *dev = cu.place_experts(*stack);
  }
  const auto x = randn(size_t(rows) * d, 72);
  std::vector<float> want(size_t(rows) * d);
  ref.moe_experts(x.data(), rows, d, ri.data(), rw.data(), k, g, u, dn, ActPrecision::F32, want.data());
  Buf dx = up(cu, x), dout = cu.alloc_f32(want.size());
  cu.moe_experts(dx, rows, d, di, dw, k, cg, cu_up, cdn, ActPrecision::F32, dout);
  EXPECT_LE(rel_err(down(cu, dout, want.size()), want), 1e-5);
  for (const Buf& p : {ds, dp, dw, dx, dout}) cu.free(p);
  cu.free(di);
}
TEST_F(CudaBackendTest, MoeRoutingAndExpertsMatchReference) {
  check_moe(*cu, *ref, 5, 8, 2, 64, 32);    // decode path
  check_moe(*cu, *ref, 1, 8, 2, 64, 48);    // one row; I not a multiple of 32 (per-column dot)
  check_moe(*cu, *ref, 20, 8, 2, 64, 32);   // prefill path
  check_moe(*cu, *ref, 3, 128, 8, 64, 32);  // 26B-A4B's router shape
}

// argmax: the first index of the largest non-NaN value, on rows with ties and NaNs.
TEST_F(CudaBackendTest, ArgmaxFirstLargestSkippingNaN) {
  const int rows = 3, n = 262144;
  auto x = randn(size_t(rows) * n, 60);
  x[size_t(0) * n + 70000] = 9.f;  // row 0: a tie, the earlier index wins
  x[size_t(0) * n + 200000] = 9.f;
  x[size_t(1) * n + 5] = NAN;      // row 1: NaNs are skipped
  x[size_t(1) * n + 6] = 8.f;
  for (int i = 0; i < n; ++i) x[size_t(2) * n + i] = NAN;  // row 2: nothing but NaN -> 0
  x[size_t(2) * n + 7] = -INFINITY;
  std::vector<int32_t> want(rows), got(rows);
  Buf ro = ref->alloc_i32(rows);
  ref->argmax(x.data(), rows, n, ro);
  std::copy(ro.i32(), ro.i32() + rows, want.begin());
  EXPECT_EQ(want, (std::vector<int32_t>{70000, 6, 7}));
  Buf dx = up(*cu, x);
  Buf co = cu->alloc_i32(rows);
  cu->argmax(dx, rows, n, co);
  cu->to_host(co, rows, got.data());
  EXPECT_EQ(got, want);
  cu->free(dx);
  cu->free(co);
  ref->free(ro);
}

// top_k: the same entries (ids; values follow) and log-sum-exp as the host default, on rows with
// a tie across the k-th value (inside one chunk and across two) and NaNs, for k from 1 to 1024 at
// a Gemma vocabulary (many chunks, then the merge) and on short rows (chunks of unequal length; a
// chunk shorter than k).
void check_top_k(Backend& cu, Backend& ref, int n, int k) {
  const int rows = 3;
  auto x = randn(size_t(rows) * n, 61, 3.f);
  for (int i = 0; i < 300 && 1000 + 7 * i < n; ++i) x[size_t(1) * n + 1000 + 7 * i] = 11.f;  // row 1: a tie at the top
  for (int i = 0; i < 1000 && 3 * i < n; ++i) x[size_t(2) * n + 3 * i] = NAN;              // row 2: NaNs
  std::vector<float> rv(size_t(rows) * k), rl(rows);
  std::vector<int32_t> ri(size_t(rows) * k);
  ref.top_k(x.data(), rows, n, k, rv.data(), ri.data(), rl.data());
  Buf dx = up(cu, x);
  Buf dv = cu.alloc_f32(rv.size());
  Buf di = cu.alloc_i32(ri.size());
  Buf dl = cu.alloc_f32(rows);
  cu.top_k(dx, rows, n, k, dv, di, dl);
  std::vector<int32_t> gi(ri.size());
  cu.to_host(di, gi.size(), gi.data());
  const auto gv = down(cu, dv, rv.size()), gl = down(cu, dl, rows);
  for (int r = 0; r < rows; ++r) {
    std::vector<int32_t> a(ri.begin() + r * k, ri.begin() + (r + 1) * k), b(gi.begin() + r * k, gi.begin() + (r + 1) * k);
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_EQ(b, a) << "n " << n << " k " << k << " row " << r;
    EXPECT_NEAR(gl[size_t(r)], rl[size_t(r)], 1e-4f * std::max(1.f, std::fabs(rl[size_t(r)]))) << "n " << n << " row " << r;
    for (int j = 0; j < k; ++j) EXPECT_EQ(gv[size_t(r * k + j)], x[size_t(r) * n + size_t(gi[size_t(r * k + j)])]);
  }
  for (const Buf& p : {dx, dv, di, dl}) cu.free(p);
}
TEST_F(CudaBackendTest, TopKMatchesReference) {
  for (int n : {262144, 5000, 2100})
    for (int k : {1, 64, 256, 1024})
      if (k <= n) check_top_k(*cu, *ref, n, k);
}

// mask_logits: the same logits as the host default (-inf where a masked row's bit is clear, rows
// without a mask untouched) at a Gemma vocabulary, then argmax over the masked rows picks an
// allowed token.
TEST_F(CudaBackendTest, MaskLogitsMatchesReference) {
  const int rows = 4, n = 262144, W = token_mask_words(n);
  auto x = randn(size_t(rows) * n, 67, 3.f);
  std::vector<int32_t> mask_rows = {3, 0, 2};  // row 1 takes no mask
  const int count = int(mask_rows.size());
  std::vector<int32_t> words(size_t(count) * W);
  uint32_t st = 99;
  for (int32_t& w : words) w = int32_t(st = st * 1664525u + 1013904223u);
  for (int w = 0; w < W; ++w) words[size_t(2 * W + w)] = w == 100 ? 1 << 7 : 0;  // row 2: one allowed token
  auto want = x;
  ref->mask_logits(want.data(), n, words.data(), mask_rows.data(), count);
  Buf dx = up(*cu, x);
  Buf dw = cu->alloc_i32(words.size());
  cu->from_host(words.data(), words.size(), dw);
  Buf dr = cu->alloc_i32(mask_rows.size());
  cu->from_host(mask_rows.data(), mask_rows.size(), dr);
  cu->mask_logits(dx, n, dw, dr, count);
  EXPECT_EQ(down(*cu, dx, x.size()), want);
  Buf co = cu->alloc_i32(rows);
  cu->argmax(dx, rows, n, co);
  std::vector<int32_t> am(rows);
  cu->to_host(co, rows, am.data());
  EXPECT_EQ(am[2], 100 * 32 + 7);
  for (int m : {0, 1}) {
    const int r = mask_rows[size_t(m)];
    EXPECT_TRUE((uint32_t(words[size_t(m * W + am[size_t(r)] / 32)]) >> (am[size_t(r)] % 32)) & 1u) << "row " << r;
  }
  for (const Buf& p : {dx, dw, dr, co}) cu->free(p);
}

void attention_case(Backend& cu, Backend& ref, int pos0, int n, int window, int D = 256, int Hk = 1) {
  EXPECT_LE(rel_err(test::attention_scenario(cu, pos0, n, window, {}, D, Hk),
                    test::attention_scenario(ref, pos0, n, window, {}, D, Hk)),
            1e-5)
      << "pos0 " << pos0 << " n " << n << " window " << window << " D " << D << " Hk " << Hk;
}

TEST_F(CudaBackendTest, AttentionMatchesReference) {
  attention_case(*cu, *ref, 0, 1, 0);
  attention_case(*cu, *ref, 0, 19, 0);
  attention_case(*cu, *ref, 300, 1, 0);
  attention_case(*cu, *ref, 40, 7, 16);  // ring buffer
  attention_case(*cu, *ref, 500, 1, 128);   // ring buffer, positions split over blocks
  attention_case(*cu, *ref, 1000, 2, 0);    // 16 splits of the visible positions
}

// Decode rows at other head widths (16, 4, 3 or 2 values a lane: 512, 128, 72, 33, the last two
// leaving lanes short) and grouped KV heads, over one split (21 positions), a few (301: 5 splits
// of 64) and many (1001: 16), each merged by the last block to finish.
TEST_F(CudaBackendTest, DecodeAttentionAtOtherHeadWidths) {
  for (int D : {512, 128, 72, 33})
    for (int pos0 : {20, 300, 1000}) attention_case(*cu, *ref, pos0, 1, 0, D, 2);
}

// Bidirectional image blocks (AttnSeq::blocks): rows see their whole block, also past a sliding
// window shorter than the block; rows outside blocks stay causal.
TEST_F(CudaBackendTest, AttentionWithImageBlocksMatchesReference) {
  ASSERT_TRUE(cu->supports_image_blocks());
  const std::vector<std::pair<int, int>> blocks{{12, 40}, {45, 47}};
  for (int window : {0, 16}) {
    const auto want = test::attention_scenario(*ref, 10, 40, window, blocks);
    EXPECT_LE(rel_err(test::attention_scenario(*cu, 10, 40, window, blocks), want), 1e-5) << "window " << window;
    EXPECT_GT(rel_err(test::attention_scenario(*ref, 10, 40, window), want), 1e-2) << "the blocks change nothing?";
  }
}

// A decode loop as Model::forward runs it: each step uploads one token's q/k/v rows, ropes q and
// k at the step's position, writes K/V into a ring cache, attends and reads the output back.
// Returns the outputs of every step, each [4, 256].
std::vector<std::vector<float>> decode_steps(Backend& b, int steps) {
  const int H = 4, Hk = 1, D = 256, window = 8, cap = 12;
  RopeSpec spec;
  spec.theta = 10000.f;
  const RopeTable rt = make_rope_table(spec, D);
  Buf kc = b.alloc_f32(size_t(cap) * Hk * D);
  Buf vc = b.alloc_f32(size_t(cap) * Hk * D);
  std::vector<int32_t> pos(size_t(cap), -1);
  Buf q = b.alloc_f32(size_t(H) * D);
  Buf k = b.alloc_f32(size_t(Hk) * D);
  Buf v = b.alloc_f32(size_t(Hk) * D);
  Buf out = b.alloc_f32(size_t(H) * D);
  std::vector<std::vector<float>> outs;
  for (int p = 0; p < steps; ++p) {
    b.begin_step();
    const auto hq = randn(size_t(H) * D, uint32_t(100 + p)), hk = randn(size_t(Hk) * D, uint32_t(200 + p)),
               hv = randn(size_t(Hk) * D, uint32_t(300 + p));
    b.from_host(hq.data(), hq.size(), q);
    b.from_host(hk.data(), hk.size(), k);
    b.from_host(hv.data(), hv.size(), v);
    b.rope(q, 1, H, D, p, rt, ActPrecision::F32);
    b.rope(k, 1, Hk, D, p, rt, ActPrecision::F32);
    AttnSeq s;
    s.row0 = 0;
    s.n = 1;
    s.pos0 = p;
    s.kv = test::f32_kv(kc, vc, pos.data(), cap, Hk, D, window);
    b.kv_write(s, k, v);
    b.attention(q, H, {s}, 0.0625f, ActPrecision::F32, out);
    b.end_step();
    outs.push_back(down(b, out, size_t(H) * D));
  }
  for (const Buf& p : {kc, vc, q, k, v, out}) b.free(p);
  return outs;
}

TEST_F(CudaBackendTest, RecordedStepsReplayAtEveryPosition) {
  const int steps = 20;  // past the ring's capacity: slots wrap
  CudaStepCounts before, after;
  ASSERT_TRUE(cuda_step_counts(*cu, &before));
  const auto got = decode_steps(*cu, steps);
  ASSERT_TRUE(cuda_step_counts(*cu, &after));
  const auto want = decode_steps(*ref, steps);
  for (int p = 0; p < steps; ++p) EXPECT_LE(rel_err(got[size_t(p)], want[size_t(p)]), 1e-5) << "step " << p;
  // Steps take the recorder's two areas in turn (cuda_step.h), each with a graph of its own: the
  // first step of each area runs directly, the second is captured, every later one replays.
  EXPECT_EQ(after.direct - before.direct, 2);
  EXPECT_EQ(after.captured - before.captured, 2);
  EXPECT_EQ(after.replayed - before.replayed, steps - 4);
}

// Quantized KV caches (model/kv_cache.h) on the device against the same cache on the reference
// backend: identical rows give identical codes, scales and biases (the same quantizer
// arithmetic), and attention over them agrees, directly and inside recorded (replayed) steps.
using test::feed_cache;
std::vector<uint8_t> bytes_of(Backend& be, const uint8_t* p, size_t n) {
  std::vector<uint8_t> h(n);
  be.read_bytes(Buf(const_cast<uint8_t*>(p), DType::U8, int64_t(n), be.on_device() ? 0 : -1), n, h.data());
  return h;
}

TEST_F(CudaBackendTest, QuantizedKvCacheMatchesReference) {
  for (int bits : {3, 4, 8}) {
    for (int D : {128, 256}) {
      SCOPED_TRACE("bits " + std::to_string(bits) + " head_dim " + std::to_string(D));
      const int Hk = 2, H = 4, total = 40;
      const ModelConfig cfg = test::sliding_and_full(Hk, D, 6);
      KvCacheOptions opt;
      opt.quant = KvQuant{bits, 64, bits == 4};  // bf16 scales once
      opt.quantized_start = 9;
      const auto k = randn(size_t(total) * Hk * D, uint32_t(80 + bits), 2.f);
      const auto v = randn(size_t(total) * Hk * D, uint32_t(81 + bits), 2.f);
      const auto q = randn(size_t(H) * D, uint32_t(82 + bits));
      KvCache rc(cfg, *ref, opt), cc(cfg, *cu, opt);
      feed_cache(*ref, rc, k.data(), v.data(), 0, total, 7, false);
      Buf dk = up(*cu, k), dv = up(*cu, v), dq = up(*cu, q);
      feed_cache(*cu, cc, dk, dv, 0, 7, 7, false);           // f32, converted at 14 >= 9 ...
      feed_cache(*cu, cc, dk, dv, 7, 14, 7, false);          // ... on the device (kv_write)
      feed_cache(*cu, cc, dk, dv, 14, total, 1, true);       // decode steps, recorded and replayed
      ASSERT_TRUE(rc.quantized() && cc.quantized());
      const KvBuffer &rf = rc.layer(1), &cf = cc.layer(1);
      ASSERT_EQ(rf.capacity, cf.capacity);
      const size_t used = size_t(total);
      EXPECT_EQ(bytes_of(*cu, cf.kq, used * cf.row_code_bytes()),
                std::vector<uint8_t>(rf.kq, rf.kq + used * rf.row_code_bytes()));
      EXPECT_EQ(bytes_of(*cu, cf.vq, used * cf.row_code_bytes()),
                std::vector<uint8_t>(rf.vq, rf.vq + used * rf.row_code_bytes()));
      EXPECT_EQ(down(*cu, cf.ks, used * cf.row_groups()), std::vector<float>(rf.ks, rf.ks + used * rf.row_groups()));
      EXPECT_EQ(down(*cu, cf.vb, used * cf.row_groups()), std::vector<float>(rf.vb, rf.vb + used * rf.row_groups()));
      // Attention of one query at the last position over each layer (ring f32, full quantized).
      for (int l = 0; l < 2; ++l) {
        AttnSeq s;
        s.row0 = 0;
        s.n = 1;
        s.pos0 = total - 1;
        s.kv = rc.layer(l);
        std::vector<float> want(size_t(H) * D);
        ref->attention(q.data(), H, {s}, 0.0625f, ActPrecision::F32, want.data());
        s.kv = cc.layer(l);
        Buf dout = cu->alloc_f32(want.size());
        cu->attention(dq, H, {s}, 0.0625f, ActPrecision::F32, dout);
        EXPECT_LE(rel_err(down(*cu, dout, want.size()), want), 1e-5) << "layer " << l;
        cu->free(dout);
      }
      for (const Buf& p : {dk, dv, dq}) cu->free(p);
    }
  }
}

// attn_prep writing into a quantized cache: its K/V are computed on the device (norm, rope), so a
// value within rounding of a quantizer boundary may take the other code; attention over the two
// caches agrees to what one such code moves.
TEST_F(CudaBackendTest, AttnPrepIntoQuantizedCache) {
  const int H = 4, Hk = 2, D = 256, rows = 5;
  const RopeTable t = make_rope_table(RopeSpec{RopeKind::Proportional, 1e6f, 0.25f, 1.f}, D);
  const ModelConfig cfg = test::sliding_and_full(Hk, D, 6);
  KvCacheOptions opt;
  opt.quant = KvQuant{4, 64, false};
  opt.quantized_start = 0;
  const auto q0 = randn(size_t(rows) * H * D, 90, 2.f), k0 = randn(size_t(rows) * Hk * D, 91, 2.f),
             v0 = randn(size_t(rows) * Hk * D, 92, 2.f), qw = randn(size_t(D), 93), kw = randn(size_t(D), 94);
  KvCache rc(cfg, *ref, opt), cc(cfg, *cu, opt);
  // Two rows first (converted after that call), then three more through attn_prep.
  feed_cache(*ref, rc, k0.data(), v0.data(), 0, 2, 2, false);
  Buf dk0 = up(*cu, k0), dv0 = up(*cu, v0);
  feed_cache(*cu, cc, dk0, dv0, 0, 2, 2, false);
  ASSERT_TRUE(rc.quantized() && cc.quantized());
  rc.reserve(3);
  cc.reserve(3);
  std::vector<float> q(q0.begin() + 2 * H * D, q0.end()), k(k0.begin() + 2 * Hk * D, k0.end()),
      v(v0.begin() + 2 * Hk * D, v0.end());
  Buf dq = up(*cu, q), dk = up(*cu, k), dv = up(*cu, v), dqw = up(*cu, qw), dkw = up(*cu, kw);
  AttnSeq s;
  s.row0 = 0;
  s.n = 3;
  s.pos0 = 2;
  s.kv = rc.layer(1);
  ref->attn_prep(q.data(), H, k.data(), v.data(), Hk, D, qw.data(), kw.data(), true, 1e-6f, {s}, t, ActPrecision::F32);
  std::vector<float> want(q.size());
  ref->attention(q.data(), H, {s}, 0.0625f, ActPrecision::F32, want.data());
  s.kv = cc.layer(1);
  cu->attn_prep(dq, H, dk, dv, Hk, D, dqw.f32(), dkw.f32(), true, 1e-6f, {s}, t, ActPrecision::F32);
  Buf dout = cu->alloc_f32(want.size());
  cu->attention(dq, H, {s}, 0.0625f, ActPrecision::F32, dout);
  EXPECT_LE(rel_err(down(*cu, dq, q.size()), q), 2e-6);
  EXPECT_LE(rel_err(down(*cu, dout, want.size()), want), 1e-3);
  // Nearly every code is the same.
  const KvBuffer &rf = rc.layer(1), &cf = cc.layer(1);
  const size_t nb = 5 * rf.row_code_bytes();
  const auto got = bytes_of(*cu, cf.kq, nb);
  size_t differ = 0;
  for (size_t i = 0; i < nb; ++i) differ += got[i] != rf.kq[i];
  EXPECT_LE(differ, nb / 100) << differ << " of " << nb << " code bytes differ";
  for (const Buf& p : {dk0, dv0, dq, dk, dv, dqw, dkw, dout}) cu->free(p);
}

}  // namespace
}  // namespace g4

namespace g4 {
namespace {

// The fused ops with LoRA adapters on some of their modules (LoraApply: the rows of two runs, one
// adapter each, and rows with none): the CUDA backend against the reference backend, for one
// row (the int8 GEMV path) and several.
TEST(CudaAdapters, FusedOpsWithAdaptersMatchReference) {
  auto cu = cuda_or_skip();
  if (!cu) GTEST_SKIP() << "no CUDA";
  auto ref = make_reference_backend();
  std::mt19937 rng(71);
  const int64_t C = 512, O = 96, r = 4;
  const WFormat f = WFormat::GgufQ4_K;
  auto qb = test::random_blocks(f, O, C, rng), kb = test::random_blocks(f, O, C, rng);
  const WeightView Q{f, O, C, qb.data(), gguf_row_bytes(f, C)}, K{f, O, C, kb.data(), gguf_row_bytes(f, C)};
  const WeightView dQ = cu->place_weight(Q), dK = cu->place_weight(K);
  // Two adapters' deltas on a [O, C] module: a [r, C], b [O, r].
  std::vector<std::vector<float>> mats;
  std::vector<LoraDelta> host_d, dev_d;
  for (int i = 0; i < 2; ++i) {
    mats.push_back(randn(size_t(r * C), uint32_t(72 + i), 0.1f));
    mats.push_back(randn(size_t(O * r), uint32_t(74 + i), 0.1f));
    LoraDelta d;
    d.a = f32_view(mats[mats.size() - 2].data(), r, C);
    d.b = f32_view(mats.back().data(), O, r);
    d.scale = 1.5f + float(i);
    host_d.push_back(d);
    LoraDelta dd = d;
    dd.a = cu->place_weight(d.a);
    dd.b = cu->place_weight(d.b);
    dev_d.push_back(dd);
  }
  const auto nw = randn(size_t(C), 76), pw = randn(size_t(O), 77);
  Buf dnw = up(*cu, nw), dpw = up(*cu, pw);
  for (int M : {1, 5}) {
    // Rows 0 .. M-1: the first run takes row 0 (and row 1), the second the last row.
    std::vector<LoraRun> runs_h{{0, M > 1 ? 2 : 1, &host_d[0]}}, runs_d{{0, M > 1 ? 2 : 1, &dev_d[0]}};
    if (M > 1) runs_h.push_back({M - 1, 1, &host_d[1]}), runs_d.push_back({M - 1, 1, &dev_d[1]});
    std::vector<float> ht(size_t(M) * r), hz(size_t(M) * O);
    LoraApply lh{runs_h, ht.data(), hz.data(), Buf(), 0};
    LoraApply ld{runs_d, cu->alloc_f32(ht.size()), cu->alloc_f32(hz.size()), Buf(), 0};
    const auto xin = randn(size_t(M) * C, uint32_t(78 + M), 2.f);
    Buf dx = up(*cu, xin), dxn = cu->alloc_f32(xin.size());
    std::vector<float> xn(xin.size());
    {  // norm_matmuls: q adapted, k not
      std::vector<float> q(size_t(M) * O), k(q.size());
      ref->norm_matmuls(xin.data(), M, InputNorm{nw.data(), 1e-6f, xn.data()}, {{&Q, q.data(), &lh}, {&K, k.data()}},
                        ActPrecision::F32);
      Buf dq = cu->alloc_f32(q.size()), dk = cu->alloc_f32(k.size());
      cu->norm_matmuls(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, {{&dQ, dq, &ld}, {&dK, dk}}, ActPrecision::F32);
      EXPECT_LE(rel_err(down(*cu, dq, q.size()), q), 2e-5) << "norm_matmuls q M=" << M;
      EXPECT_LE(rel_err(down(*cu, dk, k.size()), k), 2e-5) << "norm_matmuls k M=" << M;
      cu->free(dq);
      cu->free(dk);
    }
    {  // gate_up_gelu: up adapted, gate not
      std::vector<float> g(size_t(M) * O), u(g.size());
      ref->gate_up_gelu(xin.data(), M, InputNorm{nw.data(), 1e-6f, xn.data()}, Q, K, false, ActPrecision::F32,
                        g.data(), u.data(), nullptr, &lh);
      Buf dg = cu->alloc_f32(g.size()), du = cu->alloc_f32(u.size());
      cu->gate_up_gelu(dx, M, InputNorm{dnw.f32(), 1e-6f, dxn}, dQ, dK, false, ActPrecision::F32, dg, du, nullptr,
                       &ld);
      EXPECT_LE(rel_err(down(*cu, dg, g.size()), g), 2e-5) << "gate_up_gelu M=" << M;
      cu->free(dg);
      cu->free(du);
    }
    {  // matmul_norm_add: resid += rms_norm(x·Qᵀ + delta)·pw, on a [O, C] projection of x
      const auto res = randn(size_t(M) * O, uint32_t(80 + M), 3.f);
      std::vector<float> want = res, ys(size_t(M) * O);
      ref->matmul_norm_add(xin.data(), M, Q, ys.data(), want.data(), pw.data(), 1e-6f, ActPrecision::F32, &lh);
      Buf dr = up(*cu, res), dys = cu->alloc_f32(ys.size());
      cu->matmul_norm_add(dx, M, dQ, dys, dr, dpw.f32(), 1e-6f, ActPrecision::F32, &ld);
      cu->sync();
      EXPECT_LE(rel_err(down(*cu, dr, want.size()), want), 2e-5) << "matmul_norm_add M=" << M;
      cu->free(dr);
      cu->free(dys);
    }
    for (const Buf& p : {dx, dxn, ld.t, ld.z}) cu->free(p);
  }
  cu->free(dnw);
  cu->free(dpw);
}

}  // namespace
}  // namespace g4
