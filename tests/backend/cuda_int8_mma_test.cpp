// The int8 MMA GEMV of a row-exact launch (BackendOptions::int8_mma_rows, cuda_gemv_mma.h): M
// prepared rows into Q4_K, Q5_K and Q6_K weights on the tensor cores must give every row the bits
// the dp4a GEMV gives it alone. Checked at each lanes-per-row rule the launch picks (32, 16 and 4
// lanes a row: the tree the MMA kernel replays), with row counts that leave a partial 16-row tile,
// prepared-row counts that leave a partial 8-row tile or need several, and every launch form:
// matmul (f32 and bf16 out), norm_matmuls over weights of different row counts, gate_up_gelu in
// both gelu forms. Skips, printing why, when the build has no CUDA or the machine no GPU (CI).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../quant/gguf_test_util.h"
#include "backend/backend.h"
#include "backend_test_util.h"

namespace g4 {
namespace {
using test::bf16_rounded;
using test::randn;

std::unique_ptr<Backend> mma_backend(bool mma, std::string* why) {
  BackendOptions opt = test::cuda_int8_options(true);
  opt.int8_mma_rows = mma;
  return make_cuda_backend(why, opt);
}


// One shape per lanes-per-row rule of the launch (lanes_per_row, cuda_gemv_q8.cu): few rows give
// 32 lanes; 40 units a row over >= 4224 rows give 16; 4 units a row over >= 16896 rows give 4. The
// last shape is large enough (cuda_gemv_mma.h, kMmaLargeValues) for the MMA GEMV to take 4 rows
// of Q4_K / Q5_K; its row counts are fewer, to keep the test short.
struct Shape {
  int64_t rows, cols;
  const char* lanes;
  std::vector<int> row_counts;
};
const Shape kShapes[] = {{300, 512, "32 lanes", {4, 5, 8, 9, 17, 33}},
                         {4232, 2560, "16 lanes", {4, 5, 8, 9, 17, 33}},
                         {16904, 256, "4 lanes", {4, 5, 8, 9, 17, 33}},
                         {4232, 4096, "32 lanes, MMA from 4 rows", {4, 8}}};

// ops: 0 matmul (f32 out), 1 matmul (bf16 out), 2 norm_matmuls (W and a third of its rows), 3-4
// gate_up_gelu (tanh, ggml). The outputs of M rows, concatenated.
std::vector<float> run_op(Backend& be, int op, const std::vector<float>& x, int M, int64_t C, const WeightView& W,
                          const WeightView& W2, const Buf& nw) {
  const int64_t R = W.rows, R2 = W2.rows;
  Buf dx = test::upload_act(be, x), scratch = be.alloc_act(size_t(M * C));
  Buf y = op == 0 ? be.alloc_f32(size_t(M * R)) : be.alloc_act(size_t(M * R));
  Buf y2 = be.alloc_act(size_t(M * (op == 2 ? R2 : R)));
  const InputNorm norm{nw.f32(), 1e-6f, scratch};
  if (op <= 1) be.matmul(dx, M, W, ActPrecision::BF16, y);
  if (op == 2) be.norm_matmuls(dx, M, norm, {{&W, y}, {&W2, y2}}, ActPrecision::BF16);
  if (op >= 3) be.gate_up_gelu(dx, M, norm, W, W, op == 4, ActPrecision::BF16, y, y2);
  std::vector<float> out = test::download(be, y, size_t(M * R));
  if (op == 2) {
    const auto o2 = test::download(be, y2, size_t(M * R2));
    out.insert(out.end(), o2.begin(), o2.end());
  }
  for (const Buf& p : {dx, scratch, y, y2}) be.free(p);
  return out;
}

TEST(CudaInt8Mma, EveryRowHasItsOneRowBits) {
  std::string why;
  std::unique_ptr<Backend> mma = mma_backend(true, &why), dp4a = mma_backend(false, &why);
  if (!mma || !dp4a) {
    std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
    GTEST_SKIP() << "no CUDA";
  }
  const char* ops[] = {"matmul (f32 out)", "matmul", "norm_matmuls", "gate_up_gelu", "gate_up_gelu (ggml)"};
  std::mt19937 rng(510);
  for (const Shape& s : kShapes)
    for (WFormat f : {WFormat::GgufQ4_K, WFormat::GgufQ5_K, WFormat::GgufQ6_K}) {
      const test::GgufWeight W = test::random_gguf_weight(f, s.rows, s.cols, rng),
                             W2 = test::random_gguf_weight(f, s.rows / 3 + 5, s.cols, rng);
      const auto nw = randn(size_t(s.cols), 511);
      const WeightView dW = mma->place_weight(W.view), dW2 = mma->place_weight(W2.view);
      const WeightView pW = dp4a->place_weight(W.view), pW2 = dp4a->place_weight(W2.view);
      Buf dnw = test::upload(*mma, nw), pnw = test::upload(*dp4a, nw);
      for (int M : s.row_counts)
        for (int op = 0; op < 5; ++op) {
          const std::string what = std::string(wformat_name(f)) + " " + std::to_string(s.rows) + "x" +
                                   std::to_string(s.cols) + " (" + s.lanes + ") " + ops[op] + " M=" + std::to_string(M);
          const auto x = bf16_rounded(randn(size_t(M * s.cols), uint32_t(512 + M + op), 1.5f));
          const auto together = run_op(*mma, op, x, M, s.cols, dW, dW2, dnw);
          // The dp4a GEMV over the same M rows (row-exact too): the same bits, launch by launch.
          EXPECT_EQ(together, run_op(*dp4a, op, x, M, s.cols, pW, pW2, pnw)) << what << ": against the dp4a GEMV";
          // And each row alone (M = 1: always the dp4a GEMV).
          const int64_t R = W.view.rows, R2 = W2.view.rows;
          int bad = 0;
          for (int m = 0; m < M; ++m) {
            const std::vector<float> xm(x.begin() + m * s.cols, x.begin() + (m + 1) * s.cols);
            const auto alone = run_op(*mma, op, xm, 1, s.cols, dW, dW2, dnw);
            bool same = std::equal(alone.begin(), alone.begin() + R, together.begin() + m * R);
            if (op == 2)
              same = same && std::equal(alone.begin() + R, alone.end(), together.begin() + M * R + m * R2);
            bad += same ? 0 : 1;
          }
          EXPECT_EQ(bad, 0) << what << ": rows differ from the row alone";
        }
      for (const WeightView& v : {dW, dW2}) mma->release_weight(v);
      for (const WeightView& v : {pW, pW2}) dp4a->release_weight(v);
      mma->free(dnw);
      dp4a->free(pnw);
    }
}

}  // namespace
}  // namespace g4
