// Test helpers for GGUF block formats: random blocks with sane f16 scales, random activations,
// and ggml's activation rounding restated (the reference the integer kernels are checked against).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/gguf_quant.h"
#include "quant/weight.h"

namespace g4::test {

// Byte offsets of the f16 scale fields of one block.
inline std::vector<int> f16_fields(WFormat f) {
  switch (f) {
    case WFormat::GgufQ4_K:
    case WFormat::GgufQ5_K: return {0, 2};
    case WFormat::GgufQ6_K: return {208};
    default: return {0};
  }
}

// Random block bytes with finite f16 scales (|d| in [1e-3, 0.1], random sign).
inline std::vector<uint8_t> random_blocks(WFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  const int bb = gguf_block_bytes(f);
  const int64_t nb = rows * cols / gguf_block_size(f);
  std::vector<uint8_t> data(size_t(nb * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : data) b = uint8_t(byte(rng));
  std::uniform_real_distribution<float> mag(std::log(1e-3f), std::log(0.1f));
  for (int64_t i = 0; i < nb; ++i)
    for (int off : f16_fields(f)) {
      float v = std::exp(mag(rng)) * (byte(rng) & 1 ? 1.f : -1.f);
      uint16_t h = f32_to_f16(v);
      std::memcpy(&data[size_t(i * bb + off)], &h, 2);
    }
  return data;
}

// A random GGUF weight (random_blocks) and its view; the view points into `bytes` (keep the
// struct where it is while the view is used).
struct GgufWeight {
  std::vector<uint8_t> bytes;
  WeightView view;
};
inline GgufWeight random_gguf_weight(WFormat f, int64_t rows, int64_t cols, std::mt19937& rng) {
  GgufWeight w{random_blocks(f, rows, cols, rng), {}};
  w.view = WeightView{f, rows, cols, w.bytes.data(), gguf_row_bytes(f, cols)};
  return w;
}

inline std::vector<float> random_x(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

// The activation rounding gguf_matmul_fast documents (gguf_act.h), which is ggml's: per block of
// 256 (K-quants, quantize_row_q8_K_ref) or 32 values (quantize_row_q8_0),
// q = round-half-even(x * 127 / amax), d = 1 / (127 / amax) for 256-blocks and amax / 127
// rounded to f16 for 32-blocks; returns q * d.
inline std::vector<float> fake_quant_x(const std::vector<float>& x, int block) {
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += size_t(block)) {
    float amax = 0;
    for (int i = 0; i < block; ++i) amax = std::max(amax, std::fabs(x[b + i]));
    const float id = amax > 0 ? 127.f / amax : 0.f;
    const float d = amax == 0 ? 0.f : block == 256 ? 1.f / id : round_f16(amax / 127.f);
    for (int i = 0; i < block; ++i) out[b + i] = float(int(std::nearbyint(x[b + i] * id))) * d;
  }
  return out;
}

}  // namespace g4::test
