// How many blocks a decode attention launch (cuda_kernels.h attention()) splits each row's cache
// positions over: host arithmetic alone, so that tests run it without a GPU.
#pragma once

namespace g4::cuda {

constexpr int kAttnMaxSplits = 32;
// The number of position ranges attention() should use for n rows of H heads when at most
// max_visible positions are visible (a static bound, so a recorded step stays valid), at most
// kAttnMaxSplits. A row's bits depend on the split count and its own visible positions only, so
// a row-exact launch (BackendOptions::row_exact) uses kAttnMaxSplits for every row.
// positions: the fewest cache positions a split takes (0: cuda_attention.cu's kAttnSplitPositions).
// resident (> 0): the launch's blocks the GPU holds at once (attention_resident_blocks); the count
// is cut so that n * H * splits fits them, one round of blocks.
int attention_splits(int n, int H, int max_visible, int positions = 0, int resident = 0);

}  // namespace g4::cuda
