// The run-time quantizer (quant/affine_quantize.h) against mlx.core.quantize itself
// (tools/gen_quant_vectors.py -> tests/fixtures/quant/mlx_quantize_vectors.bin): codes, scales and
// biases identical bit for bit, from f32 and from bf16 inputs; and dequant_row reads its output.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/affine_quantize.h"
#include "quant/matmul.h"

namespace g4 {
namespace {

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

TEST(AffineQuantize, MatchesMlxQuantizeBitForBit) {
  const std::string path = std::string(G4_SOURCE_DIR) + "/tests/fixtures/quant/mlx_quantize_vectors.bin";
  const std::vector<uint8_t> b = read_file(path);
  ASSERT_GT(b.size(), 16u) << "missing " << path << " (run tools/gen_quant_vectors.py)";
  size_t pos = 0;
  auto take = [&](void* dst, size_t n) {
    ASSERT_LE(pos + n, b.size());
    std::memcpy(dst, b.data() + pos, n);
    pos += n;
  };
  char magic[8];
  take(magic, 8);
  ASSERT_EQ(std::memcmp(magic, "G4QQ0001", 8), 0);
  uint32_t rows = 0, cols = 0, count = 0;
  take(&rows, 4);
  take(&cols, 4);
  const size_t n = size_t(rows) * cols;
  std::vector<float> x(n);
  take(x.data(), n * 4);
  take(&count, 4);
  ASSERT_EQ(count, 36u);  // 6 bits x 3 groups x {f32, bf16}
  for (uint32_t r = 0; r < count; ++r) {
    uint32_t h[3];
    take(h, sizeof h);
    const int bits = int(h[0]), g = int(h[1]);
    const bool bf16 = h[2] != 0;
    SCOPED_TRACE("bits " + std::to_string(bits) + " group " + std::to_string(g) + (bf16 ? " bf16" : " f32"));
    ASSERT_TRUE(affine_quant_supported(bits, g));
    std::vector<uint8_t> want_codes(n * bits / 8);
    std::vector<float> want_s(n / g), want_b(n / g);
    take(want_codes.data(), want_codes.size());
    take(want_s.data(), want_s.size() * 4);
    take(want_b.data(), want_b.size() * 4);
    std::vector<float> in = x;
    if (bf16)
      for (float& v : in) v = round_bf16(v);
    std::vector<uint8_t> codes(want_codes.size(), 0xAB);  // must be overwritten entirely
    std::vector<float> s(want_s.size()), bi(want_b.size());
    affine_quantize(in.data(), n, bits, g, bf16, codes.data(), s.data(), bi.data());
    EXPECT_EQ(codes, want_codes);
    EXPECT_EQ(0, std::memcmp(s.data(), want_s.data(), s.size() * 4));
    EXPECT_EQ(0, std::memcmp(bi.data(), want_b.data(), bi.size() * 4));
    // What we wrote reads back through the MlxAffine view within one quantization step (half a
    // step inside the range; MLX's scale = edge / q0 can leave the far end clamped).
    const WeightView v = mlx_affine_view(codes.data(), rows, cols, bits, g, s.data(), bi.data(), DType::F32);
    std::vector<float> row(cols);
    for (uint32_t rr = 0; rr < rows; ++rr) {
      dequant_row(v, rr, row.data());
      for (uint32_t c = 0; c < cols; ++c) {
        const size_t gi = (size_t(rr) * cols + c) / g;
        const float step = std::abs(s[gi]);
        // bf16: the stored scale and bias are rounded after the codes were chosen.
        const float rounding = bf16 ? (float((1 << bits) - 1) * step + std::abs(bi[gi])) / 256.f : 0.f;
        const float xv = in[size_t(rr) * cols + c];
        ASSERT_LE(std::abs(row[c] - xv), step * 1.0001f + rounding + 1e-6f * std::abs(xv))
            << "row " << rr << " col " << c;
      }
    }
  }
  EXPECT_EQ(pos, b.size());
}

TEST(AffineQuantize, SupportedCombinations) {
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int g : {32, 64, 128}) EXPECT_TRUE(affine_quant_supported(bits, g));
  EXPECT_FALSE(affine_quant_supported(1, 64));
  EXPECT_FALSE(affine_quant_supported(7, 64));
  EXPECT_FALSE(affine_quant_supported(16, 64));
  EXPECT_FALSE(affine_quant_supported(4, 16));
  EXPECT_FALSE(affine_quant_supported(4, 48));
}

}  // namespace
}  // namespace g4
