// Test helpers: random MLX-affine / float weight matrices built with an independent packer that
// follows the spec's bit-stream definition literally (spec §3.4: element i occupies stream bits
// [i*b, (i+1)*b); stream bit s lives in uint32 word s/32 at bit s%32).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "quant/weight.h"

namespace g4::test {

// Packs q[0..n) (each < 2^b) into uint32 words, one bit at a time.
inline std::vector<uint32_t> pack_bits_spec(const std::vector<uint32_t>& q, int b) {
  std::vector<uint32_t> words((q.size() * b + 31) / 32, 0u);
  for (size_t i = 0; i < q.size(); ++i)
    for (int j = 0; j < b; ++j) {
      const size_t s = i * size_t(b) + size_t(j);
      if ((q[i] >> j) & 1u) words[s / 32] |= 1u << (s % 32);
    }
  return words;
}

inline void store_float(std::vector<uint8_t>& buf, DType t, size_t i, float v) {
  if (t == DType::F32) {
    std::memcpy(buf.data() + 4 * i, &v, 4);
  } else {
    uint16_t h = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
    std::memcpy(buf.data() + 2 * i, &h, 2);
  }
}

// Owns the storage behind a WeightView.
struct OwnedWeight {
  std::vector<uint32_t> data;  // packed words (MLX) or raw float bytes
  std::vector<uint8_t> scales, biases;
  WeightView view;
};

// Random MLX-affine matrix: q uniform, scales of both signs, biases of both signs.
inline OwnedWeight random_mlx(int64_t rows, int64_t cols, int bits, int group, DType sdt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> qd(0, (1u << bits) - 1u);
  std::uniform_real_distribution<float> sd(-0.05f, 0.05f), bd(-1.f, 1.f);
  OwnedWeight o;
  const int64_t words_per_row = cols * bits / 32;
  o.data.resize(size_t(rows * words_per_row));
  std::vector<uint32_t> q(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : q) v = qd(rng);
    auto packed = pack_bits_spec(q, bits);
    std::copy(packed.begin(), packed.end(), o.data.begin() + r * words_per_row);
  }
  const int64_t ng = rows * (cols / group);
  const size_t es = dtype_size(sdt);
  o.scales.resize(size_t(ng) * es);
  o.biases.resize(size_t(ng) * es);
  for (int64_t i = 0; i < ng; ++i) {
    store_float(o.scales, sdt, size_t(i), sd(rng));
    store_float(o.biases, sdt, size_t(i), bd(rng));
  }
  o.view = mlx_affine_view(o.data.data(), rows, cols, bits, group, o.scales.data(), o.biases.data(), sdt);
  return o;
}

// Random float-format matrix (F32/F16/BF16), rows padded to `row_bytes` when given.
inline OwnedWeight random_float(int64_t rows, int64_t cols, WFormat f, uint32_t seed, int64_t pad = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  OwnedWeight o;
  const DType t = f == WFormat::F32 ? DType::F32 : f == WFormat::F16 ? DType::F16 : DType::BF16;
  const int64_t es = int64_t(dtype_size(t));
  const int64_t row_bytes = (cols + pad) * es;
  std::vector<uint8_t> bytes(size_t(rows * row_bytes + 4), 0);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<uint8_t> tmp(static_cast<size_t>(row_bytes));
    for (int64_t c = 0; c < cols; ++c) store_float(tmp, t, size_t(c), nd(rng));
    std::memcpy(bytes.data() + r * row_bytes, tmp.data(), size_t(row_bytes));
  }
  o.data.resize(bytes.size() / 4 + 1);
  std::memcpy(o.data.data(), bytes.data(), bytes.size());
  o.view.fmt = f;
  o.view.rows = rows;
  o.view.cols = cols;
  o.view.data = o.data.data();
  o.view.row_bytes = row_bytes;
  return o;
}

inline std::vector<float> random_x(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  return x;
}

}  // namespace g4::test
