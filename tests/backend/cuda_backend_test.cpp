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
#include "backend_test_util.h"

namespace g4 {
namespace {
using test::randn;
using test::rel_err;
float* up(Backend& be, const std::vector<float>& h) { return test::upload(be, h); }
std::vector<float> down(Backend& be, const float* d, size_t n) { return test::download(be, d, n); }

std::unique_ptr<Backend> cuda_or_skip() {
  std::string why;
  auto be = make_cuda_backend(&why);
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
  for (int M : {1, 3, 9, 20}) {
    const auto x = randn(size_t(M) * size_t(host_w.cols), uint32_t(M + host_w.rows));
    std::vector<float> want(size_t(M) * size_t(host_w.rows));
    ref.matmul(x.data(), M, host_w, ActPrecision::F32, want.data());
    float* dx = up(cu, x);
    float* dy = cu.alloc(want.size());
    cu.matmul(dx, M, dw, ActPrecision::F32, dy);
    EXPECT_LE(rel_err(down(cu, dy, want.size()), want), 2e-5) << what << " M=" << M;
    cu.free(dx);
    cu.free(dy);
  }
}

TEST_F(CudaBackendTest, MatmulEveryWeightFormat) {
  std::mt19937 rng(1);
  for (WFormat f : {WFormat::GgufQ4_0, WFormat::GgufQ5_0, WFormat::GgufQ8_0, WFormat::GgufQ4_K,
                    WFormat::GgufQ5_K, WFormat::GgufQ6_K}) {
    const int64_t rows = 37, cols = 512;
    auto data = test::random_blocks(f, rows, cols, rng);
    check_matmul(*cu, *ref, WeightView{f, rows, cols, data.data(), gguf_row_bytes(f, cols)},
                 std::string(wformat_name(f)).c_str());
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
  int32_t* dids = cu->alloc_i32(ids.size());
  cu->from_host(reinterpret_cast<const float*>(ids.data()), ids.size(), reinterpret_cast<float*>(dids));
  std::vector<float> want(ids.size() * d);
  ref->embed(E, ids.data(), int(ids.size()), 16.f, ActPrecision::F32, want.data());
  float* de = cu->alloc(want.size());
  cu->embed(dE, dids, int(ids.size()), 16.f, ActPrecision::F32, de);
  EXPECT_EQ(down(*cu, de, want.size()), want);

  const int rows = 6, dim = 640;
  const auto x = randn(size_t(rows * dim), 3, 2.f), w = randn(size_t(dim), 4), b = randn(size_t(rows * dim), 5);
  float *dx = up(*cu, x), *dw = up(*cu, w), *db = up(*cu, b), *dy = cu->alloc(x.size());
  std::vector<float> r(x.size());
  ref->rms_norm(x.data(), rows, dim, w.data(), 1e-6f, ActPrecision::F32, r.data());
  cu->rms_norm(dx, rows, dim, dw, 1e-6f, ActPrecision::F32, dy);
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
  int32_t* didx = cu->alloc_i32(idx.size());
  cu->from_host(reinterpret_cast<const float*>(idx.data()), idx.size(), reinterpret_cast<float*>(didx));
  cu->gather_rows(dx, didx, 3, dim, dy);
  std::vector<float> g(3 * dim);
  ref->gather_rows(x.data(), idx.data(), 3, dim, g.data());
  EXPECT_EQ(down(*cu, dy, g.size()), g);
  cu->copy_cols(dx, rows, dim, 100, 64, dy);
  std::vector<float> cc(size_t(rows) * 64);
  ref->copy_cols(x.data(), rows, dim, 100, 64, cc.data());
  EXPECT_EQ(down(*cu, dy, cc.size()), cc);
}

void attention_case(Backend& cu, Backend& ref, int pos0, int n, int window) {
  EXPECT_LE(rel_err(test::attention_scenario(cu, pos0, n, window), test::attention_scenario(ref, pos0, n, window)), 1e-5)
      << "pos0 " << pos0 << " n " << n << " window " << window;
}

TEST_F(CudaBackendTest, AttentionMatchesReference) {
  attention_case(*cu, *ref, 0, 1, 0);
  attention_case(*cu, *ref, 0, 19, 0);
  attention_case(*cu, *ref, 300, 1, 0);
  attention_case(*cu, *ref, 40, 7, 16);  // ring buffer
}

}  // namespace
}  // namespace g4
