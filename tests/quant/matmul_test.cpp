// Fast matmul paths (AVX-512, portable) and SIMD dequantization against the scalar references,
// for every MLX bits x group x scale dtype and the float formats, on odd sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "quant/matmul.h"
#include "quant/matmul_internal.h"
#include "quant_test_util.h"

namespace g4 {
namespace {

using test::OwnedWeight;

using MatmulFn = void (*)(const float*, int64_t, const WeightView&, float*);

// |y - y_ref| <= tol * Σ_c |x_c w_c| for every output (only summation order differs).
void expect_close_to_ref(MatmulFn fn, const WeightView& w, int64_t M, uint32_t seed, double tol,
                         const std::string& what) {
  auto x = test::random_x(M * w.cols, seed);
  std::vector<float> y(size_t(M * w.rows), NAN), yr(size_t(M * w.rows));
  fn(x.data(), M, w, y.data());
  matmul_ref(x.data(), M, w, yr.data());
  std::vector<float> wr(size_t(w.cols));
  int bad = 0;
  for (int64_t r = 0; r < w.rows; ++r) {
    dequant_row(w, r, wr.data());
    for (int64_t m = 0; m < M; ++m) {
      double mag = 0;
      for (int64_t c = 0; c < w.cols; ++c) mag += std::fabs(double(x[m * w.cols + c]) * wr[c]);
      const double d = std::fabs(double(y[m * w.rows + r]) - yr[m * w.rows + r]);
      if (!(d <= tol * mag + 1e-30) && bad++ < 5)
        ADD_FAILURE() << what << " M=" << M << " m=" << m << " r=" << r << " got " << y[m * w.rows + r]
                      << " want " << yr[m * w.rows + r] << " (scale " << mag << ")";
    }
  }
}

const DType kScaleTypes[] = {DType::BF16, DType::F16, DType::F32};
const int kBits[] = {2, 3, 4, 5, 6, 8};
const int kGroups[] = {32, 64, 128};
const int64_t kMs[] = {1, 2, 3, 7, 17, 64};

TEST(MlxAffine, SimdDequantMatchesReferenceBitForBit) {
  if (!detail::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512";
  for (int bits : kBits)
    for (int g : kGroups)
      for (DType sdt : kScaleTypes) {
        OwnedWeight o = test::random_mlx(5, 3 * g, bits, g, sdt, 100 + bits * 7 + g);
        std::vector<float> a(size_t(o.view.cols)), b(size_t(o.view.cols));
        for (int64_t r = 0; r < o.view.rows; ++r) {
          dequant_row(o.view, r, a.data());
          detail::dequant_row_avx512(o.view, r, b.data());
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * 4))
              << "bits " << bits << " group " << g << " row " << r;
        }
      }
}

TEST(MlxAffine, FastPathsMatchReference) {
  for (int bits : kBits)
    for (int g : kGroups)
      for (DType sdt : kScaleTypes) {
        // 37 rows: not a multiple of any tile; 3 groups per row (odd column count in groups).
        OwnedWeight o = test::random_mlx(37, 3 * g, bits, g, sdt, uint32_t(bits * 1000 + g));
        const std::string what = "bits=" + std::to_string(bits) + " g=" + std::to_string(g) + " " +
                                 std::string(dtype_name(sdt));
        for (int64_t M : kMs) {
          expect_close_to_ref(matmul_fast, o.view, M, uint32_t(M), 2e-6, what + " fast");
          expect_close_to_ref(detail::matmul_portable, o.view, M, uint32_t(M), 2e-6, what + " portable");
          if (detail::cpu_has_avx512())
            expect_close_to_ref(detail::matmul_avx512, o.view, M, uint32_t(M), 2e-6, what + " avx512");
          if (detail::cpu_has_avx2())
            expect_close_to_ref(detail::matmul_avx2, o.view, M, uint32_t(M), 2e-6, what + " avx2");
          if (detail::amx_supports(o.view, M) && detail::amx_available())
            expect_close_to_ref(detail::matmul_amx, o.view, M, uint32_t(M), 2e-6, what + " amx");
        }
      }
}

TEST(MlxAffine, LongRowsAcrossKBlocks) {
  // cols > the 1024-column K block of the tiled kernel, and a 4-bit row of many groups.
  for (int bits : {4, 8, 3}) {
    OwnedWeight o = test::random_mlx(9, 2560, bits, 64, DType::BF16, 7u + bits);
    for (int64_t M : {1, 3, 7}) expect_close_to_ref(matmul_fast, o.view, M, 9u, 2e-6, "long " + std::to_string(bits));
  }
}

TEST(FloatFormats, FastPathsMatchReference) {
  for (WFormat f : {WFormat::F32, WFormat::F16, WFormat::BF16})
    for (int64_t cols : {1, 15, 16, 17, 33, 100, 1030}) {
      for (int64_t pad : {0, 3}) {
        OwnedWeight o = test::random_float(13, cols, f, uint32_t(cols), pad);
        const std::string what = std::string(wformat_name(f)) + " cols=" + std::to_string(cols) +
                                 " pad=" + std::to_string(pad);
        for (int64_t M : kMs) {
          expect_close_to_ref(matmul_fast, o.view, M, uint32_t(M + cols), 2e-6, what + " fast");
          expect_close_to_ref(detail::matmul_portable, o.view, M, uint32_t(M), 2e-6, what + " portable");
          if (detail::cpu_has_avx512())
            expect_close_to_ref(detail::matmul_avx512, o.view, M, uint32_t(M), 2e-6, what + " avx512");
          if (detail::cpu_has_avx2())
            expect_close_to_ref(detail::matmul_avx2, o.view, M, uint32_t(M), 2e-6, what + " avx2");
          if (detail::amx_supports(o.view, M) && detail::amx_available())
            expect_close_to_ref(detail::matmul_amx, o.view, M, uint32_t(M), 2e-6, what + " amx");
        }
      }
    }
}

TEST(Amx, AvailableOnThisMachineWhenCpuHasIt) {
  // Reports (not requires) the path, so a CI machine without AMX still passes.
  std::printf("AMX-BF16 prefill path: %s\n", detail::amx_available() ? "on" : "off");
  if (!detail::amx_available()) GTEST_SKIP() << "no AMX";
  // Values that need all three bf16 parts of x, and long rows across many groups.
  OwnedWeight o = test::random_mlx(70, 512, 4, 64, DType::BF16, 3);
  for (int64_t M : {8, 16, 33, 64}) expect_close_to_ref(detail::matmul_amx, o.view, M, 77u, 2e-6, "amx 4-bit");
  // More x rows than one AMX pass (256), with a partial last pass.
  OwnedWeight big = test::random_mlx(33, 64, 8, 32, DType::F16, 5);
  expect_close_to_ref(detail::matmul_amx, big.view, 300, 79u, 2e-6, "amx multi-pass");
  OwnedWeight f = test::random_float(45, 96, WFormat::BF16, 4);
  for (int64_t M : {16, 40}) expect_close_to_ref(detail::matmul_amx, f.view, M, 78u, 2e-6, "amx bf16");
}

TEST(FloatFormats, DequantRowIsExactConversion) {
  const uint16_t bf[4] = {0x3f80, 0xc000, 0x0001, 0x7f7f};  // 1, -2, smallest subnormal, max
  const uint16_t hf[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};  // 1, -2, 2^-24, 65504
  WeightView v;
  v.rows = 1;
  v.cols = 4;
  v.row_bytes = 8;
  float out[4];
  v.fmt = WFormat::BF16;
  v.data = bf;
  dequant_row(v, 0, out);
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -2.f);
  EXPECT_EQ(out[2], std::ldexp(1.f, -133));
  EXPECT_EQ(out[3], 0x1.fep127f);
  v.fmt = WFormat::F16;
  v.data = hf;
  dequant_row(v, 0, out);
  EXPECT_EQ(out[0], 1.f);
  EXPECT_EQ(out[1], -2.f);
  EXPECT_EQ(out[2], std::ldexp(1.f, -24));
  EXPECT_EQ(out[3], 65504.f);
}

TEST(Validate, RejectsBadViews) {
  OwnedWeight o = test::random_mlx(2, 64, 4, 64, DType::BF16, 1);
  EXPECT_TRUE(validate_weight(o.view, "w").is_ok());
  WeightView v = o.view;
  v.bits = 7;
  EXPECT_NE(validate_weight(v, "layers.0.q_proj").message().find("layers.0.q_proj"), std::string::npos);
  v = o.view;
  v.group_size = 48;
  EXPECT_FALSE(validate_weight(v, "w").is_ok());
  v = o.view;
  v.row_bytes = 16;
  EXPECT_FALSE(validate_weight(v, "w").is_ok());
  v = o.view;
  v.scales = nullptr;
  EXPECT_FALSE(validate_weight(v, "w").is_ok());
  v = o.view;
  v.data = nullptr;
  EXPECT_FALSE(validate_weight(v, "w").is_ok());
}

}  // namespace
}  // namespace g4
