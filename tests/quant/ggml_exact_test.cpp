// ggml_exact::matmul (llama.cpp's kernels, quant/ggml_exact.h) against the scalar reference
// gguf_matmul_ref applied to the activations rounded as ggml rounds them: the code decoding,
// scales, mins and integer sums must be right to f32 accumulation error for every format and for
// every M that selects a different llama.cpp kernel (Q6_K: M < 8 vec_dot, M >= 8 tiled; Q4_K:
// 4-row gemm groups plus gemv rows). Bit-exactness against llama.cpp itself is checked end to end
// on the starter model (tests/python/test_llamacpp_parity.py, --backend ggml).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/ggml_exact.h"
#include "quant/gguf_act.h"
#include "quant/gguf_quant.h"
#include "gguf_test_util.h"

namespace g4 {
namespace {
using namespace g4::test;

constexpr WFormat kExactFormats[] = {WFormat::GgufQ4_0, WFormat::GgufQ5_0, WFormat::GgufQ8_0,
                                     WFormat::GgufQ4_K, WFormat::GgufQ6_K};

class GgmlExact : public ::testing::TestWithParam<WFormat> {
 protected:
  void SetUp() override {
    if (!gguf::cpu_has_avx512_vnni()) {
      std::printf("SKIP: this CPU has no AVX-512 VNNI (the ggml-exact kernels need it)\n");
      GTEST_SKIP() << "no AVX-512 VNNI";
    }
  }
};

TEST_P(GgmlExact, MatchesReferenceOnRoundedActivations) {
  const WFormat f = GetParam();
  const int bs = gguf_block_size(f);
  for (int64_t cols : {int64_t(bs), int64_t(3 * bs), int64_t(bs == 32 ? 640 : 1024)}) {
    for (int64_t M : {1, 2, 3, 4, 5, 7, 8, 9, 17}) {
      SCOPED_TRACE(::testing::Message() << "cols=" << cols << " M=" << M);
      const int64_t rows = 40;  // a multiple of 8: Q4_K takes llama.cpp's repacked kernels
      std::mt19937 rng(uint32_t(int(f) * 131 + cols * 7 + M));
      auto data = random_blocks(f, rows, cols, rng);
      auto x = random_x(M * cols, rng);
      if (M > 2) std::fill(x.begin() + cols, x.begin() + 2 * cols, 0.f);  // an all-zero row
      WeightView w{f, rows, cols, data.data(), gguf_row_bytes(f, cols)};
      ASSERT_TRUE(ggml_exact::supports(w));
      const auto xq = fake_quant_x(x, bs);
      std::vector<float> ref(size_t(M * rows)), got(size_t(M * rows), NAN), wrow(static_cast<size_t>(cols));
      gguf_matmul_ref(xq.data(), M, w, ref.data());
      ggml_exact::matmul(x.data(), M, w, got.data());
      for (int64_t r = 0; r < rows; ++r) {
        gguf_dequant_row(w, r, wrow.data());
        for (int64_t m = 0; m < M; ++m) {
          double mag = 0;
          for (int64_t k = 0; k < cols; ++k) mag += std::fabs(double(xq[m * cols + k]) * wrow[k]);
          const float g = got[m * rows + r];
          ASSERT_TRUE(std::isfinite(g)) << "r=" << r << " m=" << m;
          ASSERT_LE(std::fabs(double(g) - ref[m * rows + r]), 2e-6 * mag + 1e-30) << "r=" << r << " m=" << m;
        }
      }
    }
  }
}

// The same input row gives the same result whatever batch it sits in, as long as llama.cpp would
// pick the same kernel for it (Q8_0/Q5_0/Q4_0 at any M; Q6_K for every M >= 8). Q4_K is not
// listed: its kernel depends on the row's place in the batch (4-row groups, then single rows).
TEST(GgmlExactBatch, RowResultDependsOnlyOnKernelChoice) {
  if (!gguf::cpu_has_avx512_vnni()) {
    std::printf("SKIP: this CPU has no AVX-512 VNNI (the ggml-exact kernels need it)\n");
    GTEST_SKIP() << "no AVX-512 VNNI";
  }
  for (WFormat f : {WFormat::GgufQ4_0, WFormat::GgufQ5_0, WFormat::GgufQ8_0, WFormat::GgufQ6_K}) {
    SCOPED_TRACE(wformat_name(f));
    const int64_t rows = 24, cols = 512;
    std::mt19937 rng(7);
    auto data = random_blocks(f, rows, cols, rng);
    WeightView w{f, rows, cols, data.data(), gguf_row_bytes(f, cols)};
    auto x = random_x(9 * cols, rng);
    std::vector<float> y9(size_t(9 * rows)), y8(size_t(8 * rows));
    ggml_exact::matmul(x.data(), 9, w, y9.data());
    ggml_exact::matmul(x.data() + cols, 8, w, y8.data());  // rows 1..8 of the 9-row batch
    for (int64_t i = 0; i < 8 * rows; ++i) ASSERT_EQ(y8[size_t(i)], y9[size_t(rows + i)]) << i;
  }
}

TEST(GgmlExactSupport, CoversTheStarterFormatsOnly) {
  WeightView w{WFormat::GgufQ4_K, 640, 1024, nullptr, 0};
  EXPECT_TRUE(ggml_exact::supports(w));
  w.rows = 644;  // llama.cpp does not repack it: its kernel would be another one
  EXPECT_FALSE(ggml_exact::supports(w));
  w.fmt = WFormat::GgufQ5_K;
  w.rows = 640;
  EXPECT_FALSE(ggml_exact::supports(w));
  w.fmt = WFormat::BF16;
  EXPECT_FALSE(ggml_exact::supports(w));
}

INSTANTIATE_TEST_SUITE_P(Formats, GgmlExact, ::testing::ValuesIn(kExactFormats),
                         [](const auto& info) { return std::string(wformat_name(info.param)); });

}  // namespace
}  // namespace g4
