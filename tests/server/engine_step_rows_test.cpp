// Engine::step_rows: which rows one engine step feeds under EngineOptions::step_tokens (decode
// tokens first, then prompt chunks oldest first, within the budget).
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "runtime/engine.h"

namespace g4 {
namespace {
using Rows = std::vector<int>;

TEST(EngineStepRows, NoBudgetFeedsEveryChunk) {
  EXPECT_EQ(Engine::step_rows({0, 1000, 0, 30}, {1, 2, 3, 4}, 256, 0), (Rows{1, 256, 1, 30}));
}

TEST(EngineStepRows, DecodeFirstThenOldestPromptsWithinTheBudget) {
  // Two decoding streams take 2 rows; the oldest prompt (order 5) its 256; the next (order 7) the
  // 42 left of a 300-row budget, cut short; the newest waits.
  EXPECT_EQ(Engine::step_rows({900, 0, 900, 900, 0}, {7, 1, 5, 9, 2}, 256, 300), (Rows{42, 1, 256, 0, 1}));
  // A short prompt leaves room for the next one.
  EXPECT_EQ(Engine::step_rows({10, 500}, {1, 2}, 256, 100), (Rows{10, 90}));
}

TEST(EngineStepRows, TheOldestPromptProgressesWhenDecodeRowsFillTheBudget) {
  // 64 decoding streams and a budget of 32: every stream decodes, the oldest prompt still gets a
  // chunk, the other waits.
  std::vector<int> left(64, 0);
  std::vector<uint64_t> order(64);
  std::iota(order.begin(), order.end(), 10);
  left.push_back(500);
  order.push_back(3);
  left.push_back(500);
  order.push_back(4);
  const Rows r = Engine::step_rows(left, order, 64, 32);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(r[size_t(i)], 1);
  EXPECT_EQ(r[64], 64);
  EXPECT_EQ(r[65], 0);
}

TEST(EngineStepRows, EveryStepStaysWithinTheBudgetUntilThePromptsAreFed) {
  // Feeding the chosen rows step after step finishes every prompt, and no step but one holding
  // only the oldest prompt exceeds the budget.
  std::vector<int> left{700, 0, 130, 0, 2000, 5};
  const std::vector<uint64_t> order{4, 1, 2, 3, 6, 5};
  for (int step = 0; step < 100; ++step) {
    const Rows r = Engine::step_rows(left, order, 256, 300);
    EXPECT_LE(std::accumulate(r.begin(), r.end(), 0), 300);
    bool any = false;
    for (size_t i = 0; i < left.size(); ++i)
      if (left[i] > 0) {
        left[i] -= r[i];
        any = true;
      }
    if (!any) break;
  }
  EXPECT_EQ(left, (std::vector<int>{0, 0, 0, 0, 0, 0}));
}

}  // namespace
}  // namespace g4
