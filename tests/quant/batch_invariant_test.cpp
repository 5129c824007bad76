// set_batch_invariant(true): every row of matmul_fast's result must be bit-identical whatever
// the number of rows M in the call (the property continuous batching and prefix caching need).
// Here MLX affine and BF16 weights (AMX from M = 1) and all six GGUF formats (AMX above its
// switch-over, matmul_amx_order below it or without AMX); tests/python/test_server.py checks the
// same end to end (batched vs alone on the starter model).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "quant/matmul.h"
#include "quant/matmul_internal.h"
#include "quant/gguf_act.h"
#include "quant/gguf_amx.h"
#include "quant/gguf_quant.h"
#include "quant_test_util.h"
#include "gguf_test_util.h"

namespace g4 {
namespace {
using namespace g4::test;

void expect_rows_independent_of_m(const WeightView& W) {
  for (int M : {2, 5, 9, 17, 40}) {
    std::vector<float> x = random_x(int64_t(M) * W.cols, uint32_t(M));
    std::vector<float> y(static_cast<size_t>(M * W.rows)), y1(static_cast<size_t>(W.rows));
    matmul_fast(x.data(), M, W, y.data());
    for (int r = 0; r < M; ++r) {
      matmul_fast(x.data() + size_t(r) * W.cols, 1, W, y1.data());
      ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + size_t(r) * W.rows, size_t(W.rows) * 4))
          << "M=" << M << " row " << r;
    }
  }
}

TEST(BatchInvariant, RowsIndependentOfM) {
  // The row-exact kernels for every M are the AMX ones (Sapphire Rapids and later, as here and in CI).
  if (!detail::amx_available()) GTEST_SKIP() << "no AMX on this CPU: batch-invariant mode has no row-exact kernel";
  set_batch_invariant(true);
  OwnedWeight q4 = random_mlx(96, 256, 4, 64, DType::BF16, 3);
  expect_rows_independent_of_m(q4.view);
  OwnedWeight q8 = random_mlx(40, 128, 8, 32, DType::F16, 4);
  expect_rows_independent_of_m(q8.view);
  OwnedWeight bf = random_float(48, 192, WFormat::BF16, 5);
  expect_rows_independent_of_m(bf.view);
  set_batch_invariant(false);
}

constexpr WFormat kGguf[] = {WFormat::GgufQ4_0, WFormat::GgufQ5_0, WFormat::GgufQ8_0,
                             WFormat::GgufQ4_K, WFormat::GgufQ5_K, WFormat::GgufQ6_K};

void expect_gguf_rows_independent_of_m() {
  for (WFormat f : kGguf) {
    SCOPED_TRACE(wformat_name(f));
    std::mt19937 rng(uint32_t(int(f)) + 11);
    const int64_t rows = 37, cols = 512;  // a partial 16-row group at the end
    auto data = random_blocks(f, rows, cols, rng);
    WeightView w{f, rows, cols, data.data(), gguf_row_bytes(f, cols)};
    for (int M : {2, 5, 9, 17, 33}) {
      std::vector<float> x = random_x(int64_t(M) * cols, rng);
      std::vector<float> y(static_cast<size_t>(M * rows)), y1(static_cast<size_t>(rows));
      matmul_fast(x.data(), M, w, y.data());
      for (int r = 0; r < M; ++r) {
        matmul_fast(x.data() + size_t(r) * cols, 1, w, y1.data());
        ASSERT_EQ(0, std::memcmp(y1.data(), y.data() + size_t(r) * rows, size_t(rows) * 4))
            << "M=" << M << " row " << r;
      }
    }
  }
}

TEST(BatchInvariant, GgufRowsIndependentOfM) {
  if (!gguf::cpu_has_avx512_vnni()) GTEST_SKIP() << "no AVX-512 VNNI: the GGUF kernels are the portable row-exact ones";
  set_batch_invariant(true);
  expect_gguf_rows_independent_of_m();  // AMX from its switch-over where the CPU has it
  gguf::set_amx_enabled(false);
  expect_gguf_rows_independent_of_m();  // a CPU without AMX
  gguf::set_amx_enabled(true);
  set_batch_invariant(false);
}

// matmul_amx_order reproduces matmul_amx bit for bit (what makes the mixed schedule invariant).
TEST(BatchInvariant, AmxOrderKernelEqualsAmx) {
  if (!gguf::cpu_has_amx()) GTEST_SKIP() << "no AMX on this CPU";
  for (WFormat f : kGguf) {
    SCOPED_TRACE(wformat_name(f));
    std::mt19937 rng(uint32_t(int(f)) + 5);
    const int64_t rows = 40, cols = 768;
    auto data = random_blocks(f, rows, cols, rng);
    WeightView w{f, rows, cols, data.data(), gguf_row_bytes(f, cols)};
    for (int M : {1, 3, 16, 21}) {
      std::vector<float> x = random_x(int64_t(M) * cols, rng);
      gguf::ActAmx a;
      gguf::quantize_act_amx(x.data(), M, cols, gguf_block_size(f), &a);
      std::vector<float> ya(static_cast<size_t>(M * rows)), yb(ya.size());
      gguf::matmul_amx(f, w, a, M, ya.data());
      gguf::matmul_amx_order(f, w, a, M, yb.data());
      ASSERT_EQ(0, std::memcmp(ya.data(), yb.data(), ya.size() * 4)) << "M=" << M;
    }
  }
}

}  // namespace
}  // namespace g4
