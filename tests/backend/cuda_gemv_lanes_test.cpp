// The int8 decode GEMVs' lanes-per-row rules (cuda::gemv_row_lanes, cuda::gemv_fit_lanes) at
// Gemma 4's decode shapes. Host arithmetic: runs without a GPU, in CUDA builds (G4_HAVE_CUDA is
// set on this file alone, CMakeLists.txt).
#include <gtest/gtest.h>

#ifdef G4_HAVE_CUDA
#include "backend/cuda/cuda_gemv_lanes.h"

namespace g4::cuda {
namespace {

constexpr int64_t kMinWarps = 16 * 132;

TEST(CudaGemvLanes, BusyLanesAndEnoughWarps) {
  EXPECT_EQ(gemv_row_lanes(84, 8192, 64, kMinWarps), 32);    // 31B q: 84 of 96 lane-units busy
  EXPECT_EQ(gemv_row_lanes(160, 2560, 64, kMinWarps), 32);   // E4B down: 160 units
  EXPECT_EQ(gemv_row_lanes(40, 10240, 64, kMinWarps), 16);   // E4B gate / up: 8 by the 85 % rule, K-quant floor 16
  EXPECT_EQ(gemv_row_lanes(40, 10240, 32, kMinWarps), 8);    // the same rows of 32-value units
  EXPECT_EQ(gemv_row_lanes(4, 16904, 32, kMinWarps), 4);     // short rows: a warp takes 8
  EXPECT_EQ(gemv_row_lanes(4, 300, 32, kMinWarps), 32);      // few rows: lanes for enough warps
}

TEST(CudaGemvLanes, OneRoundOfResidentWarps) {
  // E4B's fused gate / up (10240 rows, 64 registers: 32 warps an SM, 4224 on 132 SMs): 16 lanes
  // make 5120 warps, 8 make 2560.
  EXPECT_EQ(gemv_fit_lanes(16, 40, 10240, 4224, 8), 8);
  EXPECT_EQ(gemv_fit_lanes(16, 40, 10240, 4224, 16), 16);  // not under min_lanes
  // 31B's o (5376 rows at 40 warps an SM, 5280): 32 lanes are 96 warps past one round.
  EXPECT_EQ(gemv_fit_lanes(32, 84, 5376, 5280, 8), 16);
  // 31B's q|k|v (16384 rows): 16 lanes still take 8192 warps, 8 take 4096.
  EXPECT_EQ(gemv_fit_lanes(32, 84, 16384, 5280, 8), 8);
  EXPECT_EQ(gemv_fit_lanes(32, 84, 16384, 5280, 16), 32);  // no count fits: unchanged
  EXPECT_EQ(gemv_fit_lanes(32, 160, 2560, 4224, 8), 32);    // fits already
  // Lanes that would leave a row's last round under 85 % busy are skipped: 20 units at 16 lanes
  // are 62 % busy, at 8 lanes 83 %; 4 lanes fit.
  EXPECT_EQ(gemv_fit_lanes(32, 20, 40000, 5280, 4), 4);
}

}  // namespace
}  // namespace g4::cuda
#endif
