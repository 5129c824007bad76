// MLX bit packing against an independent, literal packer of the spec's bit stream (spec §3.4),
// plus hand-written words for the word-crossing widths.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "quant/matmul.h"
#include "quant/matmul_internal.h"
#include "quant_test_util.h"

namespace g4 {
namespace {

// scale = 1, bias = 0 (f32), so dequant_row returns q itself.
WeightView identity_view(const std::vector<uint32_t>& words, int64_t rows, int64_t cols, int bits,
                         int group, std::vector<float>& ones, std::vector<float>& zeros) {
  ones.assign(size_t(rows * cols / group), 1.f);
  zeros.assign(ones.size(), 0.f);
  WeightView v = mlx_affine_view(words.data(), rows, cols, bits, group, ones.data(), zeros.data(), DType::F32);
  return v;
}

TEST(MlxPacking, DequantRecoversValuesPackedBySpec) {
  std::mt19937 rng(5);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int64_t rows = 3, cols = 128;
    std::vector<uint32_t> q(size_t(rows * cols));
    for (auto& v : q) v = rng() & ((1u << bits) - 1u);
    std::vector<uint32_t> words;
    for (int64_t r = 0; r < rows; ++r) {
      std::vector<uint32_t> row(q.begin() + r * cols, q.begin() + (r + 1) * cols);
      auto w = test::pack_bits_spec(row, bits);
      words.insert(words.end(), w.begin(), w.end());
    }
    std::vector<float> ones, zeros, out(static_cast<size_t>(cols)), out2(static_cast<size_t>(cols));
    WeightView v = identity_view(words, rows, cols, bits, 32, ones, zeros);
    for (int64_t r = 0; r < rows; ++r) {
      dequant_row(v, r, out.data());
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(out[c], float(q[r * cols + c])) << "bits " << bits << " r " << r << " c " << c;
      if (detail::cpu_has_avx512()) {
        detail::dequant_row_avx512(v, r, out2.data());
        for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(out2[c], out[c]) << "avx512 bits " << bits << " c " << c;
      }
    }
  }
}

TEST(MlxPacking, ThreeBitValuesCrossWordBoundary) {
  // 3-bit values 0..7 repeated: element 10 occupies stream bits 30..32, i.e. bits 30-31 of word 0
  // and bit 0 of word 1 (LSB first). Build the words by hand from that rule.
  std::vector<uint32_t> q(32);
  for (int i = 0; i < 32; ++i) q[size_t(i)] = uint32_t(i % 8);
  uint64_t stream[2] = {0, 0};
  for (int i = 0; i < 32; ++i) {
    const int s = 3 * i;
    for (int j = 0; j < 3; ++j)
      if ((q[size_t(i)] >> j) & 1) stream[(s + j) / 64] |= uint64_t(1) << ((s + j) % 64);
  }
  std::vector<uint32_t> words = {uint32_t(stream[0]), uint32_t(stream[0] >> 32), uint32_t(stream[1])};
  EXPECT_EQ(words, test::pack_bits_spec(q, 3));
  std::vector<float> ones, zeros, out(32);
  WeightView v = identity_view(words, 1, 32, 3, 32, ones, zeros);
  dequant_row(v, 0, out.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[size_t(i)], float(i % 8)) << i;
  // Element 10 = 2 = 0b010: bit 31 of word 0 set, bit 30 clear, bit 0 of word 1 clear.
  EXPECT_EQ((words[0] >> 30) & 3u, 2u);
}

TEST(MlxPacking, FourBitNibbleOrder) {
  // Word 0x76543210 holds elements 0..7 = 0,1,...,7 (element i at bits [4i, 4i+4)).
  std::vector<uint32_t> words(4, 0x76543210u);
  std::vector<float> ones, zeros, out(32);
  WeightView v = identity_view(words, 1, 32, 4, 32, ones, zeros);
  dequant_row(v, 0, out.data());
  for (int i = 0; i < 32; ++i) EXPECT_EQ(out[size_t(i)], float(i % 8));
}

TEST(MlxPacking, NegativeScaleAndRounding) {
  // w = scale*q + bias with the product rounded to f32 before the add (no FMA), as MLX does.
  std::vector<uint32_t> q(32, 0);
  q[1] = 255;
  q[2] = 3;
  auto words = test::pack_bits_spec(q, 8);
  const float s = -0.0123f, b = 1.7f;
  WeightView v = mlx_affine_view(words.data(), 1, 32, 8, 32, &s, &b, DType::F32);
  std::vector<float> out(32);
  dequant_row(v, 0, out.data());
  volatile float p1 = s * 255.f, p2 = s * 3.f;
  EXPECT_EQ(out[0], b);
  EXPECT_EQ(out[1], p1 + b);
  EXPECT_EQ(out[2], p2 + b);
}

}  // namespace
}  // namespace g4
