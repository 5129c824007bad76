// How many lanes of a warp share one weight row in the int8 decode GEMVs (cuda_gemv_q8.cu): host
// arithmetic alone, so that tests run it without a GPU. A row's bits depend on its lanes (they
// fix which units each lane sums and the shuffle tree), so the lanes come from the weights' shape
// and the device, never from the number of activation rows of a launch.
#pragma once
#include <cstdint>

namespace g4::cuda {

// The fewest warps a GEMV launch keeps in flight to hide memory latency with (16 an SM of an
// H100 / H200): gemv_row_lanes' min_warps in the backend.
constexpr int64_t kGemvMinWarps = 16 * 132;

// Lanes per row (a power of two, 4..32) for `rows` rows of `units` units of `vals` values: the most
// lanes that keep at least 85 % of them busy in the row's last round of units (a short row gives a
// warp several rows), but never so few that the launch has under min_warps warps to hide memory
// latency with. With kquant_floor, K-quant units (64 values, the longest dot per unit) take at
// least 16 lanes on rows of 32 units or more: at the E4B gate / up shape (40 units) the 85 % rule
// gives 8, and 16 measured faster on an H100 (stop 45, bench_cuda_gemv --lanes): Q4_K 11.8 -> 10.2
// us, Q6_K 17.6 -> 15.7, the fused gate + up launch Q4_K 13.5 -> 13.1, Q6_K 28.8 -> 22.7. The fused
// Q4_K gate + up launch goes without the floor (gemv_lanes): inside a decode step E4B's ran faster
// at 8 lanes than at 16 (stops 63 and 64), against stop 45's launch timed alone.
int gemv_row_lanes(int64_t units, int64_t rows, int vals, int64_t min_warps, bool kquant_floor = true);

}  // namespace g4::cuda
