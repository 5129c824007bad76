// gguf_matmul_f32 (float-exact) and gguf_matmul_fast (int8 activations) against gguf_matmul_ref
// on random blocks, odd row counts, odd block counts and M in {1, 2, 3, 5, 17}.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/gguf_act.h"
#include "quant/gguf_amx.h"
#include "quant/gguf_quant.h"
#include "gguf_test_util.h"

namespace g4 {
namespace {
using namespace g4::test;

constexpr WFormat kFormats[] = {WFormat::GgufQ4_0, WFormat::GgufQ5_0, WFormat::GgufQ8_0,
                                WFormat::GgufQ4_K, WFormat::GgufQ5_K, WFormat::GgufQ6_K};

struct Shape {
  int64_t rows, cols;
};

std::vector<Shape> shapes(WFormat f) {
  if (gguf_block_size(f) == 256) return {{37, 768}, {1, 256}, {67, 512}};
  return {{37, 96}, {1, 32}, {67, 640}, {5, 160}};
}

struct ErrSum {
  double err2 = 0, ref2 = 0;
};

void run_case(WFormat f, Shape s, int64_t M, bool fast, ErrSum* total = nullptr) {
  std::mt19937 rng(uint32_t(int(f) * 1000 + s.rows * 7 + s.cols + M));
  auto data = random_blocks(f, s.rows, s.cols, rng);
  auto x = random_x(M * s.cols, rng);
  if (M > 2) std::fill(x.begin() + s.cols, x.begin() + 2 * s.cols, 0.f);  // an all-zero row
  WeightView w{f, s.rows, s.cols, data.data(), gguf_row_bytes(f, s.cols)};
  std::vector<float> ref(size_t(M * s.rows)), got(size_t(M * s.rows), NAN);
  gguf_matmul_ref(x.data(), M, w, ref.data());
  // Fast path: the integer kernels must equal the reference applied to the rounded activations
  // up to f32 accumulation error (this checks the kernels, independent of the rounding noise).
  std::vector<float> refq(size_t(M * s.rows));
  const auto xq = fake_quant_x(x, gguf_block_size(f));
  if (fast) gguf_matmul_ref(xq.data(), M, w, refq.data());
  if (fast) gguf_matmul_fast(x.data(), M, w, got.data());
  else gguf_matmul_f32(x.data(), M, w, got.data());

  // Scale for the error bound: sum_k |x_k w_k| per output.
  std::vector<float> wrow(size_t(s.cols));
  double err2 = 0, ref2 = 0;
  for (int64_t r = 0; r < s.rows; ++r) {
    gguf_dequant_row(w, r, wrow.data());
    for (int64_t m = 0; m < M; ++m) {
      double mag = 0, magq = 0;
      for (int64_t k = 0; k < s.cols; ++k) {
        mag += std::fabs(double(x[m * s.cols + k]) * wrow[k]);
        magq += std::fabs(double(xq[m * s.cols + k]) * wrow[k]);
      }
      const double e = double(got[m * s.rows + r]) - ref[m * s.rows + r];
      ASSERT_TRUE(std::isfinite(got[m * s.rows + r]));
      // Without AVX-512 VNNI the fast path is the f32 one (gguf_matmul_fast falls back to it).
      if (!fast || !gguf::cpu_has_avx512_vnni()) ASSERT_LE(std::fabs(e), 1e-6 * mag + 1e-30) << "r=" << r << " m=" << m;
      else {
        ASSERT_LE(std::fabs(e), 2e-2 * mag + 1e-30) << "r=" << r << " m=" << m;
        const double eq = double(got[m * s.rows + r]) - refq[m * s.rows + r];
        ASSERT_LE(std::fabs(eq), 2e-6 * magq + 1e-30) << "vs rounded activations, r=" << r << " m=" << m;
      }
      err2 += e * e;
      ref2 += double(ref[m * s.rows + r]) * ref[m * s.rows + r];
    }
  }
  if (total) total->err2 += err2, total->ref2 += ref2;
}

class GgufMatmul : public ::testing::TestWithParam<WFormat> {};

TEST_P(GgufMatmul, Float32PathMatchesReferenceTightly) {
  for (Shape s : shapes(GetParam()))
    for (int64_t M : {1, 2, 3, 5, 17}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " cols=" << s.cols << " M=" << M);
      run_case(GetParam(), s, M, false);
    }
}

// Normalized error sqrt(sum e^2 / sum y^2) over all shapes and M of a format: the activation
// rounding (~0.3-0.8% for Gaussian activations) stays below 1e-2.
TEST_P(GgufMatmul, FastPathWithinActivationQuantError) {
  ErrSum total;
  // Larger M takes the AMX path where the CPU has it (gguf::amx_min_rows); run those sizes
  // through the VNNI kernels too, and tiny M through AMX.
  gguf::set_amx_enabled(false);
  for (Shape s : shapes(GetParam()))
    for (int64_t M : {5, 8, 17}) {
      SCOPED_TRACE(::testing::Message() << "no AMX rows=" << s.rows << " cols=" << s.cols << " M=" << M);
      run_case(GetParam(), s, M, true, &total);
    }
  gguf::set_amx_enabled(true);
  gguf::set_amx_min_rows(1);
  for (Shape s : shapes(GetParam()))
    for (int64_t M : {1, 3}) {
      SCOPED_TRACE(::testing::Message() << "AMX rows=" << s.rows << " cols=" << s.cols << " M=" << M);
      run_case(GetParam(), s, M, true, &total);
    }
  gguf::set_amx_min_rows(0);
  for (Shape s : shapes(GetParam()))
    for (int64_t M : {1, 2, 3, 5, 17}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " cols=" << s.cols << " M=" << M);
      run_case(GetParam(), s, M, true, &total);
    }
  for (Shape s : shapes(GetParam()))
    for (int64_t M : {8, 16, 33}) {
      SCOPED_TRACE(::testing::Message() << "rows=" << s.rows << " cols=" << s.cols << " M=" << M);
      run_case(GetParam(), s, M, true, &total);
    }
  const double nerr = std::sqrt(total.err2 / std::max(total.ref2, 1e-30));
  EXPECT_LT(nerr, 1e-2) << "normalized error";
  std::printf("normalized error vs f32 reference: %.2e\n", nerr);
}

INSTANTIATE_TEST_SUITE_P(AllFormats, GgufMatmul, ::testing::ValuesIn(kFormats),
                         [](const auto& info) { return std::string(wformat_name(info.param)); });

}  // namespace
}  // namespace g4
