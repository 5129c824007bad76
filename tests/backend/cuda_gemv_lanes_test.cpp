// The int8 decode GEMVs' lanes-per-row rule (cuda::gemv_row_lanes) at
// Gemma 4's decode shapes. Host arithmetic: runs without a GPU, in CUDA builds (G4_HAVE_CUDA is
// set on this file alone, CMakeLists.txt).
#include <gtest/gtest.h>

#ifdef G4_HAVE_CUDA
#include "backend/cuda/cuda_gemv_lanes.h"

namespace g4::cuda {
namespace {

TEST(CudaGemvLanes, BusyLanesAndEnoughWarps) {
  EXPECT_EQ(gemv_row_lanes(84, 8192, 64, kGemvMinWarps), 32);    // 31B q: 84 of 96 lane-units busy
  EXPECT_EQ(gemv_row_lanes(160, 2560, 64, kGemvMinWarps), 32);   // E4B down: 160 units
  EXPECT_EQ(gemv_row_lanes(40, 10240, 64, kGemvMinWarps), 16);   // E4B gate / up: 8 by the 85 % rule, K-quant floor 16
  EXPECT_EQ(gemv_row_lanes(40, 10240, 32, kGemvMinWarps), 8);    // the same rows of 32-value units
  EXPECT_EQ(gemv_row_lanes(40, 10240, 64, kGemvMinWarps, false), 8);  // E4B's fused Q4_K gate / up: no floor
  EXPECT_EQ(gemv_row_lanes(84, 21504, 64, kGemvMinWarps, false), 32); // 31B's: the 85 % rule's 32 as before
  EXPECT_EQ(gemv_row_lanes(4, 16904, 32, kGemvMinWarps), 4);     // short rows: a warp takes 8
  EXPECT_EQ(gemv_row_lanes(4, 300, 32, kGemvMinWarps), 32);      // few rows: lanes for enough warps
}

}  // namespace
}  // namespace g4::cuda
#endif
