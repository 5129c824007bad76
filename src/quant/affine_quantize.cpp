#include "quant/affine_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/dtype.h"

namespace g4 {

bool affine_quant_supported(int bits, int group_size) {
  const bool b = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  const bool g = group_size == 32 || group_size == 64 || group_size == 128;
  return b && g;
}

// No contraction: every step rounds as MLX's scalar C++ does.
__attribute__((optimize("fp-contract=off"))) void affine_quantize(
    const float* x, size_t n, int bits, int group_size, bool bf16_params, uint8_t* codes,
    float* scales, float* biases) {
  const float n_bins = float((1 << bits) - 1);
  const float eps = 1e-7f;
  std::memset(codes, 0, n * size_t(bits) / 8);
  const size_t groups = n / size_t(group_size);
  for (size_t gi = 0; gi < groups; ++gi) {
    const float* w = x + gi * size_t(group_size);
    float w_min = std::numeric_limits<float>::infinity();
    float w_max = -w_min;
    for (int j = 0; j < group_size; ++j) {
      w_max = std::max(w_max, w[j]);
      w_min = std::min(w_min, w[j]);
    }
    const bool mask = std::abs(w_min) > std::abs(w_max);
    float scale = std::max((w_max - w_min) / n_bins, eps);
    scale = mask ? scale : -scale;
    const float edge = mask ? w_min : w_max;
    const float q0 = std::rint(edge / scale);
    float bias = 0;
    if (q0 != 0) {
      scale = edge / q0;
      bias = edge;
    }
    for (int j = 0; j < group_size; ++j) {
      float q = std::rint((w[j] - bias) / scale);
      q = std::min(std::max(q, 0.0f), n_bins);
      const uint32_t code = uint32_t(q);
      const size_t bit = (gi * size_t(group_size) + size_t(j)) * size_t(bits);
      // A code spans at most two bytes (bits <= 8).
      codes[bit / 8] |= uint8_t(code << (bit % 8));
      if (bit % 8 + size_t(bits) > 8) codes[bit / 8 + 1] |= uint8_t(code >> (8 - bit % 8));
    }
    scales[gi] = bf16_params ? round_bf16(scale) : scale;
    biases[gi] = bf16_params ? round_bf16(bias) : bias;
  }
}

}  // namespace g4
