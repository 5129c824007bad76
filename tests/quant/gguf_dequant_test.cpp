// GGUF block dequantization and the scalar reference matmul against vectors produced by the
// `gguf` Python package (tools/gen_gguf_quant_vectors.py -> tests/fixtures/gguf_quant/).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "quant/gguf_quant.h"

namespace g4 {
namespace {

const std::string kDir = std::string(G4_SOURCE_DIR) + "/tests/fixtures/gguf_quant/";

template <class T>
std::vector<T> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

WFormat fmt_of(const std::string& name) {
  if (name == "q4_0") return WFormat::GgufQ4_0;
  if (name == "q5_0") return WFormat::GgufQ5_0;
  if (name == "q8_0") return WFormat::GgufQ8_0;
  if (name == "q4_k") return WFormat::GgufQ4_K;
  if (name == "q5_k") return WFormat::GgufQ5_K;
  return WFormat::GgufQ6_K;
}

struct Case {
  std::string name;
  int64_t rows, cols, M;
};

std::vector<Case> manifest() {
  std::ifstream f(kDir + "manifest.txt");
  std::vector<Case> cases;
  Case c;
  while (f >> c.name >> c.rows >> c.cols >> c.M) cases.push_back(c);
  return cases;
}

TEST(GgufDequant, AllSixFormatsInManifest) { EXPECT_EQ(manifest().size(), 6u); }

TEST(GgufDequant, BitExactAgainstGgufPackage) {
  for (const Case& c : manifest()) {
    SCOPED_TRACE(c.name);
    const WFormat f = fmt_of(c.name);
    auto blocks = read_file<uint8_t>(kDir + c.name + ".blocks");
    auto want = read_file<float>(kDir + c.name + ".deq");
    const int64_t rb = gguf_row_bytes(f, c.cols);
    ASSERT_EQ(int64_t(blocks.size()), rb * c.rows);
    ASSERT_EQ(int64_t(want.size()), c.rows * c.cols);
    WeightView w{f, c.rows, c.cols, blocks.data(), rb};
    std::vector<float> got(size_t(c.cols));
    for (int64_t r = 0; r < c.rows; ++r) {
      gguf_dequant_row(w, r, got.data());
      for (int64_t k = 0; k < c.cols; ++k) {
        uint32_t a, b;
        std::memcpy(&a, &got[k], 4);
        std::memcpy(&b, &want[r * c.cols + k], 4);
        ASSERT_EQ(a, b) << "row " << r << " col " << k << ": " << got[k] << " vs " << want[r * c.cols + k];
      }
    }
  }
}

TEST(GgufDequant, ReferenceMatmulMatchesNumpy) {
  for (const Case& c : manifest()) {
    SCOPED_TRACE(c.name);
    const WFormat f = fmt_of(c.name);
    auto blocks = read_file<uint8_t>(kDir + c.name + ".blocks");
    auto x = read_file<float>(kDir + c.name + ".x");
    auto want = read_file<float>(kDir + c.name + ".y");
    WeightView w{f, c.rows, c.cols, blocks.data(), gguf_row_bytes(f, c.cols)};
    std::vector<float> y(size_t(c.M * c.rows));
    gguf_matmul_ref(x.data(), c.M, w, y.data());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-5 * (1 + std::fabs(want[i])));
  }
}

TEST(GgufDequant, FormatTable) {
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ4_0, 64), 36);
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ5_0, 32), 22);
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ8_0, 96), 102);
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ4_K, 512), 288);
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ5_K, 256), 176);
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ6_K, 256), 210);
  EXPECT_EQ(gguf_row_bytes(WFormat::GgufQ6_K, 100), 0);  // not a multiple of the block
  EXPECT_EQ(gguf_row_bytes(WFormat::F32, 256), 0);
  EXPECT_FALSE(is_gguf_format(WFormat::BF16));
  EXPECT_TRUE(is_gguf_format(WFormat::GgufQ5_K));
}

TEST(GgufDequant, ValidateRejectsBadViews) {
  std::vector<uint8_t> buf(1024);
  WeightView ok{WFormat::GgufQ4_K, 2, 512, buf.data(), 288};
  EXPECT_TRUE(gguf_validate(ok, "t").is_ok());
  WeightView cols = ok;
  cols.cols = 640;  // not a multiple of 256
  EXPECT_FALSE(gguf_validate(cols, "blk.0.ffn_down.weight").is_ok());
  EXPECT_NE(gguf_validate(cols, "blk.0.ffn_down.weight").message().find("blk.0.ffn_down.weight"), std::string::npos);
  WeightView rb = ok;
  rb.row_bytes = 287;
  EXPECT_FALSE(gguf_validate(rb, "t").is_ok());
  WeightView nodata = ok;
  nodata.data = nullptr;
  EXPECT_FALSE(gguf_validate(nodata, "t").is_ok());
  WeightView f32 = ok;
  f32.fmt = WFormat::F32;
  EXPECT_FALSE(gguf_validate(f32, "t").is_ok());
}

}  // namespace
}  // namespace g4
