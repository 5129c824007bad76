// set_batch_invariant(true): every row of matmul_fast's result must be bit-identical whatever
// the number of rows M in the call (the property continuous batching and prefix caching need).
// GGUF formats are covered in gguf_matmul_test-style data by tests/python/test_server.py
// (batched vs alone on the starter model); here MLX affine and BF16 weights.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "quant/matmul.h"
#include "quant/matmul_internal.h"
#include "quant_test_util.h"

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

}  // namespace
}  // namespace g4
