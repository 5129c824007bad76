// Bidirectional image blocks in attention (backend.h AttnSeq::blocks, visible_keys): the cpu
// backend's kernels against the reference backend's, which tests/python/test_vision.py checks
// against mlx-vlm's blockwise overlay.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "backend_test_util.h"

namespace g4 {
namespace {

TEST(ImageBlocks, VisibleKeysWidenTheCausalRangeToTheBlock) {
  std::vector<int32_t> blk{0, 0, 13, 20, 13, 20};  // rows at positions 12, 13, 14; 13 and 14 in [13, 20)
  AttnSeq s;
  s.n = 3;
  s.pos0 = 12;
  s.kv.window = 0;
  s.blocks = blk.data();
  EXPECT_EQ(visible_keys(s, 0).lo, 0);
  EXPECT_EQ(visible_keys(s, 0).hi, 12);  // outside the block: causal
  EXPECT_EQ(visible_keys(s, 1).lo, 0);
  EXPECT_EQ(visible_keys(s, 1).hi, 19);  // the whole block
  s.kv.window = 4;
  EXPECT_EQ(visible_keys(s, 2).lo, 11);  // the window: 14 - 4 + 1
  EXPECT_EQ(visible_keys(s, 2).hi, 19);
  blk[4] = 5;  // a block longer than the window reaches back to its start
  EXPECT_EQ(visible_keys(s, 2).lo, 5);
}

TEST(ImageBlocks, CpuMatchesReference) {
  auto ref = make_reference_backend();
  auto cpu = make_cpu_backend();
  ASSERT_TRUE(ref->supports_image_blocks());
  ASSERT_TRUE(cpu->supports_image_blocks());
  const std::vector<std::pair<int, int>> blocks{{12, 40}, {45, 47}};
  for (int window : {0, 16}) {
    const auto want = test::attention_scenario(*ref, 10, 40, window, blocks);
    EXPECT_LE(test::max_abs_diff(test::attention_scenario(*cpu, 10, 40, window, blocks), want), 1e-5)
        << "window " << window;
    EXPECT_GT(test::max_abs_diff(test::attention_scenario(*ref, 10, 40, window), want), 1e-2)
        << "the blocks change nothing?";
  }
}

}  // namespace
}  // namespace g4
