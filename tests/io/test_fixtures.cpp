// Checkpoints written by mlx-lm itself (tools/make_fixtures.py -> tests/fixtures/generated/):
// every fixture opens, and every weight of every layer resolves with the shapes the config implies.
// The per-layer geometry and per-module quantization are compared with mlx-lm's loaded model in
// tests/python/test_io_info.py. Skipped when the fixtures have not been generated.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "io/model_dir.h"
#include "io_test_util.h"

using namespace g4;
namespace fs = std::filesystem;

namespace {

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> out;
  const char* env = std::getenv("G4_FIXTURES");
  fs::path root = env ? fs::path(env) : fs::path(G4_SOURCE_DIR) / "tests/fixtures/generated";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.is_directory() && fs::exists(e.path() / "config.json")) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST(Fixtures, EveryFixtureResolvesEveryWeight) {
  auto dirs = fixture_dirs();
  if (dirs.empty()) GTEST_SKIP() << "no fixtures in tests/fixtures/generated (run `make fixtures`)";
  for (const auto& dir : dirs) {
    SCOPED_TRACE(dir.string());
    auto r = open_model(dir.string());
    ASSERT_TRUE(r.is_ok()) << r.message();
    const ModelConfig& c = r->config;
    Status st = verify_weights(c, *r->weights);
    EXPECT_TRUE(st.is_ok()) << st.message();
    // fixture.json facts written by the generator.
    std::ifstream in(dir / "fixture.json");
    if (!in) continue;
    auto fj = nlohmann::json::parse(in, nullptr, false);
    if (fj.is_discarded()) continue;
    if (fj.contains("nested_config")) {
      EXPECT_EQ(r->multimodal_config, fj["nested_config"].get<bool>());
    }
    const std::string q = fj.value("quant", "");
    auto emb = r->weights->matrix("embed_tokens", c.vocab, c.hidden);
    ASSERT_TRUE(emb.is_ok()) << emb.message();
    // Embedding storage per the generator's QUANTS / MIXED_OVERRIDES (6-bit g64 in `mixed`).
    const int want = q == "q4g64" ? 4064 : q == "q8g32" ? 8032 : q == "mixed" ? 6064 : 0;
    if (q == "bf16") {
      EXPECT_EQ(emb->fmt, WFormat::BF16);
    } else if (want) {
      EXPECT_EQ(emb->fmt, WFormat::MlxAffine);
      EXPECT_EQ(emb->bits * 1000 + emb->group_size, want);
    }
  }
}
