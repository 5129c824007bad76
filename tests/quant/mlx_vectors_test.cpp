// Our MLX-affine unpacking and dequantization against vectors made by mlx.core.quantize /
// mlx.core.dequantize (tools/gen_quant_vectors.py -> tests/fixtures/quant/mlx_affine_vectors.bin).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "quant/matmul.h"
#include "quant/matmul_internal.h"

namespace g4 {
namespace {

struct Reader {
  std::vector<uint8_t> bytes;
  size_t pos = 0;
  bool take(void* dst, size_t n) {
    if (pos + n > bytes.size()) return false;
    std::memcpy(dst, bytes.data() + pos, n);
    pos += n;
    return true;
  }
  const uint8_t* skip(size_t n) {
    if (pos + n > bytes.size()) return nullptr;
    const uint8_t* p = bytes.data() + pos;
    pos += n;
    return p;
  }
};

TEST(MlxVectors, DequantMatchesMlxBitForBit) {
  const std::string path = std::string(G4_SOURCE_DIR) + "/tests/fixtures/quant/mlx_affine_vectors.bin";
  std::ifstream f(path, std::ios::binary);
  ASSERT_TRUE(f) << "missing " << path << " (run tools/gen_quant_vectors.py)";
  Reader rd{std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {})};
  char magic[8];
  uint32_t count = 0;
  ASSERT_TRUE(rd.take(magic, 8) && std::memcmp(magic, "G4QV0001", 8) == 0);
  ASSERT_TRUE(rd.take(&count, 4));
  ASSERT_EQ(count, 54u);  // 6 bits x 3 groups x 3 dtypes
  int negative_scales = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t h[5];
    ASSERT_TRUE(rd.take(h, sizeof h));
    const int bits = int(h[0]), g = int(h[1]);
    const int64_t rows = h[2], cols = h[3];
    const DType dt = h[4] == 0 ? DType::F32 : h[4] == 1 ? DType::F16 : DType::BF16;
    const size_t es = dtype_size(dt), ns = size_t(rows * cols / g);
    // Copies keep the packed words 4-byte aligned.
    std::vector<uint32_t> words(size_t(rows * cols * bits / 32));
    std::vector<uint8_t> scales(ns * es), biases(ns * es);
    std::vector<float> want(size_t(rows * cols));
    ASSERT_TRUE(rd.take(words.data(), words.size() * 4));
    ASSERT_TRUE(rd.take(scales.data(), scales.size()));
    ASSERT_TRUE(rd.take(biases.data(), biases.size()));
    ASSERT_TRUE(rd.take(want.data(), want.size() * 4));
    const uint8_t* native = dt == DType::F32 ? nullptr : rd.skip(size_t(rows * cols) * es);
    if (dt != DType::F32) {
      ASSERT_NE(native, nullptr);
    }

    WeightView v = mlx_affine_view(words.data(), rows, cols, bits, g, scales.data(), biases.data(), dt);
    ASSERT_TRUE(validate_weight(v, "fixture").is_ok());
    for (size_t k = 0; k < ns; ++k) negative_scales += load_float(scales.data(), dt, k) < 0;

    const std::string what = "bits " + std::to_string(bits) + " group " + std::to_string(g) + " " +
                             std::string(dtype_name(dt));
    std::vector<float> out(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequant_row(v, r, out.data());
      ASSERT_EQ(0, std::memcmp(out.data(), want.data() + r * cols, size_t(cols) * 4)) << what << " row " << r;
      if (detail::cpu_has_avx512()) {
        detail::dequant_row_avx512(v, r, out.data());
        ASSERT_EQ(0, std::memcmp(out.data(), want.data() + r * cols, size_t(cols) * 4))
            << what << " avx512 row " << r;
      }
      if (native) {
        dequant_row_native(v, r, out.data());
        for (int64_t c = 0; c < cols; ++c)
          ASSERT_EQ(out[c], load_float(native, dt, size_t(r * cols + c))) << what << " native r " << r << " c " << c;
      }
    }
  }
  EXPECT_EQ(rd.pos, rd.bytes.size());
  EXPECT_GT(negative_scales, 0);  // MLX picks negative scales for max-dominated groups
}

}  // namespace
}  // namespace g4
