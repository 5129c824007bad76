// The decode attention's split rule (cuda::attention_splits): a row's visible positions over
// blocks of at least 64 (or the asked number), at most kAttnMaxSplits, and no more blocks than
// the GPU holds at once. Host arithmetic: runs without a GPU, in CUDA builds (G4_HAVE_CUDA is set
// on this file alone, CMakeLists.txt).
#include <gtest/gtest.h>

#ifdef G4_HAVE_CUDA
#include "backend/cuda/cuda_attention_splits.h"

namespace g4::cuda {
namespace {

TEST(CudaAttentionSplits, PositionsOverBlocks) {
  EXPECT_EQ(attention_splits(1, 8, 512), 8);     // E4B's sliding window: 64 positions a split
  EXPECT_EQ(attention_splits(1, 8, 500), 8);     // rounded up
  EXPECT_EQ(attention_splits(1, 8, 20), 1);
  EXPECT_EQ(attention_splits(1, 32, 1024, 128), 8);  // the positions a split asked for
  EXPECT_EQ(attention_splits(1, 4, 100000), kAttnMaxSplits);
  EXPECT_EQ(attention_splits(8, 16, 4096), 1);   // 128 rows x heads: enough blocks unsplit
}

TEST(CudaAttentionSplits, OneRoundOfResidentBlocks) {
  // 31B's sliding layers: 32 heads x 16 splits, cut to 8 where 264 blocks fit at once (2 an SM).
  EXPECT_EQ(attention_splits(1, 32, 1024, 0, 0), 16);
  EXPECT_EQ(attention_splits(1, 32, 1024, 0, 264), 8);
  EXPECT_EQ(attention_splits(1, 32, 1024, 0, 132), 4);  // its global layers: one block an SM
  EXPECT_EQ(attention_splits(1, 16, 1024, 0, 264), 16);  // 26B-A4B's sliding layers fit already
  EXPECT_EQ(attention_splits(1, 8, 512, 0, 264), 8);     // E4B's
  EXPECT_EQ(attention_splits(1, 100, 1024, 0, 132), 1);  // never under one split
  EXPECT_EQ(attention_splits(2, 32, 1024, 128, 264), 4);  // rows count too
}

}  // namespace
}  // namespace g4::cuda
#endif
