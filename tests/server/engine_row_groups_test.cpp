// Engine::row_groups: how a step's sequences are split into forwards on a backend whose rows are
// row-exact only up to a bound (Backend::invariant_row_limit).
#include <gtest/gtest.h>

#include <vector>

#include "runtime/engine.h"

namespace g4 {
namespace {
using Groups = std::vector<std::vector<size_t>>;

TEST(EngineRowGroups, NoLimitIsOneForward) {
  EXPECT_EQ(Engine::row_groups({1, 200, 1, 64}, 0), (Groups{{0, 1, 2, 3}}));
}

TEST(EngineRowGroups, ConsecutiveSequencesUpToTheLimit) {
  // 64 decode rows fill one forward; the 65th starts the next.
  EXPECT_EQ(Engine::row_groups(std::vector<int>(65, 1), 64).size(), 2u);
  // A prompt chunk joins decode rows while the total fits, else starts a forward of its own.
  EXPECT_EQ(Engine::row_groups({1, 1, 60, 1, 64, 1}, 64), (Groups{{0, 1, 2, 3}, {4}, {5}}));
  // A chunk longer than the limit (an image block) runs alone.
  EXPECT_EQ(Engine::row_groups({1, 300, 1}, 64), (Groups{{0}, {1}, {2}}));
  // Every sequence lands in exactly one forward, in order.
  const Groups g = Engine::row_groups({5, 7, 9, 11, 13, 17, 19, 23}, 32);
  std::vector<size_t> seen;
  for (const auto& f : g) {
    int rows = 0;
    for (size_t i : f) {
      seen.push_back(i);
      rows += std::vector<int>{5, 7, 9, 11, 13, 17, 19, 23}[i];
    }
    EXPECT_LE(rows, 32);
  }
  EXPECT_EQ(seen, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace g4
