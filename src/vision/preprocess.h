// Gemma 4 image preprocessing (HF Gemma4ImageProcessor, spec §8.1): aspect-preserving bicubic
// resize to the largest size whose sides are multiples of patch·pool (48) and whose patch count
// fits max_soft_tokens·pool², rescale to [0, 1] (no mean/std), 16×16 patches flattened
// [row, col, channel], positions (x = column, y = row). The padding HF adds up to the budget is
// left out: padded patches are masked out of attention and pooling, so they change nothing.
#pragma once
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "vision/image.h"

namespace g4 {

struct PatchGrid {
  int patch = 16;                 // patch side (pixels)
  int rows = 0, cols = 0;         // patches down / across
  std::vector<float> pixels;      // [rows*cols, patch*patch*3], values in [0, 1]
  std::vector<int32_t> pos_x;     // [rows*cols] column of each patch
  std::vector<int32_t> pos_y;     // [rows*cols] row of each patch
  int patches() const { return rows * cols; }
};

// HF get_aspect_ratio_preserving_size: (height, width) after the resize. Errors for images that
// round to 0×0 (message names the image size).
Result<std::pair<int, int>> gemma4_target_size(int height, int width, int patch, int max_patches, int pool);

// The whole preprocessing for one image; max_soft_tokens is one of 70, 140, 280, 560, 1120.
// The size rule uses patch and pool; the patches are cut at `cut` pixels (0: patch). The 12B's
// encoder-free embedder takes patch·pool = 48-pixel patches, rescaled as mlx-vlm's processor does
// it (f32 multiply: f32_rescale) rather than HF's (in double, then rounded).
Result<PatchGrid> gemma4_patches(const RgbImage& img, int patch, int pool, int max_soft_tokens, int cut = 0,
                                 bool f32_rescale = false);

}  // namespace g4
