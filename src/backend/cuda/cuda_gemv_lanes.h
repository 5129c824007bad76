// How many lanes of a warp share one weight row in the int8 decode GEMVs (cuda_gemv_q8.cu): host
// arithmetic alone, so that tests run it without a GPU. A row's bits depend on its lanes (they
// fix which units each lane sums and the shuffle tree), so the lanes come from the weights' shape
// and the device, never from the number of activation rows of a launch.
#pragma once
#include <cstdint>

namespace g4::cuda {

// Lanes per row (a power of two, 4..32) for `rows` rows of `units` units of `vals` values: the most
// lanes that keep at least 85 % of them busy in the row's last round of units (a short row gives a
// warp several rows), but never so few that the launch has under min_warps warps to hide memory
// latency with. K-quant units (64 values, the longest dot per unit) take at least 16 lanes on rows
// of 32 units or more (stop 45, docs/cuda-log).
int gemv_row_lanes(int64_t units, int64_t rows, int vals, int64_t min_warps);

}  // namespace g4::cuda
