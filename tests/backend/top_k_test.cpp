// Backend::top_k (what device sampling reads instead of the logits): the host default against a
// plain sort, and the CUDA kernel against the host (tests/backend/cuda_backend_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "core/token_mask.h"
#include "backend_test_util.h"

namespace g4 {
namespace {

TEST(TopK, DefaultIsTheKLargestLowestIdsFirstAndTheRowLse) {
  auto be = make_reference_backend();
  const int rows = 2, n = 3000, k = 50;
  auto x = test::randn(size_t(rows) * n, 5);
  for (int i = 0; i < 40; ++i) x[size_t(100 + i)] = 2.5f;  // a tie straddling the k-th value
  x[7] = NAN;
  std::vector<float> vals(size_t(rows) * k), lse(rows);
  std::vector<int32_t> ids(size_t(rows) * k);
  be->top_k(x.data(), rows, n, k, vals.data(), ids.data(), lse.data());
  for (int r = 0; r < rows; ++r) {
    const float* row = x.data() + size_t(r) * n;
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    auto key = [&](int32_t i) { return std::isnan(row[i]) ? -INFINITY : row[i]; };
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return key(a) > key(b); });
    std::vector<int32_t> want(order.begin(), order.begin() + k), got(ids.begin() + r * k, ids.begin() + (r + 1) * k);
    std::sort(want.begin(), want.end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, want) << "row " << r;
    double m = -INFINITY, s = 0;
    for (int i = 0; i < n; ++i) m = std::max(m, double(key(i)));
    for (int i = 0; i < n; ++i) s += std::exp(double(key(i)) - m);
    EXPECT_NEAR(lse[size_t(r)], m + std::log(s), 1e-5);
    for (int j = 0; j < k; ++j) EXPECT_EQ(vals[size_t(r * k + j)], row[ids[size_t(r * k + j)]]);
  }
}

// Backend::mask_logits (a grammar's mask where the logits are): -inf exactly where a masked row's
// bit is clear, other logits and rows without a mask untouched, masks given out of row order, a
// vocabulary that ends inside a word.
TEST(MaskLogits, DefaultClearsTheDisallowedTokensOnly) {
  auto be = make_reference_backend();
  const int rows = 4, n = 1000, W = token_mask_words(n);
  auto x = test::randn(size_t(rows) * n, 9);
  const auto orig = x;
  std::vector<int32_t> mask_rows = {2, 0};  // rows 1 and 3 take no mask
  std::vector<int32_t> words(mask_rows.size() * W);
  uint32_t st = 12345;
  for (int32_t& w : words) w = int32_t(st = st * 1664525u + 1013904223u);
  words[0] = 0;           // row 2: the first 32 tokens all refused
  words[size_t(W)] = -1;  // row 0: the first 32 all allowed
  be->mask_logits(x.data(), n, words.data(), mask_rows.data(), int(mask_rows.size()));
  for (int r = 0; r < rows; ++r) {
    const int m = r == 2 ? 0 : r == 0 ? 1 : -1;
    for (int v = 0; v < n; ++v) {
      const bool ok = m < 0 || ((uint32_t(words[size_t(m * W + v / 32)]) >> (v % 32)) & 1u);
      const float got = x[size_t(r) * n + size_t(v)];
      if (ok) EXPECT_EQ(got, orig[size_t(r) * n + size_t(v)]) << r << " " << v;
      else EXPECT_TRUE(std::isinf(got) && got < 0) << r << " " << v;
    }
  }
}

}  // namespace
}  // namespace g4
