#include "vision/preprocess.h"

#include <cmath>

namespace g4 {

Result<std::pair<int, int>> gemma4_target_size(int height, int width, int patch, int max_patches, int pool) {
  const double total = double(height) * width;
  const double target_px = double(max_patches) * patch * patch;
  const double factor = std::sqrt(target_px / total);
  const double ideal_h = factor * height, ideal_w = factor * width;
  const int side = pool * patch;
  int th = int(std::floor(ideal_h / side)) * side;
  int tw = int(std::floor(ideal_w / side)) * side;
  if (th == 0 && tw == 0) return err("image %dx%d cannot be resized to a multiple of %d pixels", width, height, side);
  const int max_side = (max_patches / (pool * pool)) * side;
  if (th == 0) {
    th = side;
    tw = std::min(int(std::floor(double(width) / height)) * side, max_side);
  } else if (tw == 0) {
    tw = side;
    th = std::min(int(std::floor(double(height) / width)) * side, max_side);
  }
  if (double(th) * tw > target_px)
    return err("image %dx%d: resizing to %dx%d exceeds %d patches", width, height, tw, th, max_patches);
  return std::pair<int, int>{th, tw};
}

Result<PatchGrid> gemma4_patches(const RgbImage& img, int patch, int pool, int max_soft_tokens, int cut,
                                 bool f32_rescale) {
  if (max_soft_tokens != 70 && max_soft_tokens != 140 && max_soft_tokens != 280 && max_soft_tokens != 560 &&
      max_soft_tokens != 1120)
    return err("max soft tokens per image must be one of 70, 140, 280, 560, 1120 (got %d)", max_soft_tokens);
  G4_ASSIGN_OR_RETURN(auto hw, gemma4_target_size(img.height, img.width, patch, max_soft_tokens * pool * pool, pool));
  const RgbImage r = resize_bicubic(img, hw.second, hw.first);
  PatchGrid g;
  patch = cut > 0 ? cut : patch;
  g.patch = patch;
  g.rows = r.height / patch;
  g.cols = r.width / patch;
  const size_t per = size_t(patch) * patch * 3;
  g.pixels.resize(size_t(g.patches()) * per);
  for (int pr = 0; pr < g.rows; ++pr) {
    for (int pc = 0; pc < g.cols; ++pc) {
      float* out = g.pixels.data() + (size_t(pr) * g.cols + pc) * per;
      for (int y = 0; y < patch; ++y)
        for (int x = 0; x < patch; ++x)
          for (int c = 0; c < 3; ++c) {
            const uint8_t v = r.rgb[(size_t(pr * patch + y) * r.width + size_t(pc * patch + x)) * 3 + c];
            *out++ = f32_rescale ? float(v) * float(1.0 / 255.0) : float(double(v) * (1.0 / 255.0));
          }
      g.pos_x.push_back(pc);
      g.pos_y.push_back(pr);
    }
  }
  return g;
}

}  // namespace g4
