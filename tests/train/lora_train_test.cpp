// LoRA training's differentiable model (train/lora_train_model.h) on the generated fixtures
// (tools/make_fixtures.py): its logits equal the inference Model's with the same adapter, its
// gradients equal finite differences of its loss (every module kind; KV-shared layers whose donors
// are trained; per-layer inputs; K=V layers; a masked prompt; dropout), a run's
// gradients do not depend on what the process ran before (a resumed run's bits), and the batch order's
// numpy permutation equals numpy's. (Against mlx-lm's own training: tests/python/test_lora_train.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "model/lora.h"
#include "train/dataset.h"
#include "train_test_util.h"
#include "train/lora_train_model.h"
#include "train/optimizer.h"

namespace g4::train {
namespace {
namespace fs = std::filesystem;

std::string fixture(const char* name) { return (fs::path(G4_SOURCE_DIR) / "tests/fixtures/generated" / name).string(); }

std::unique_ptr<Model> load_or_skip(const char* name) {
  const std::string dir = fixture(name);
  if (!fs::exists(fs::path(dir) / "config.json")) return nullptr;
  auto m = load_model(dir, "cpu");
  EXPECT_TRUE(m) << m.message();
  return m ? std::move(m.value()) : nullptr;
}

using train_test::randomize_b;
using train_test::tokens;

double loss(LoraTrainModel& tm, const std::vector<const Example*>& b, uint64_t seed, bool train_masks) {
  // grad_weight 1e-30: the training path (dropout masks drawn) with negligible gradients.
  return tm.run(b, 1 << 20, train_masks ? 1e-30f : 0.f, seed).sum;
}

// d loss / d(direction u on one tensor) analytically (from the gradients) and by central differences.
void check_gradients(const char* name, LoraConfig lc, int offset, int n_tokens) {
  auto m = load_or_skip(name);
  if (!m) GTEST_SKIP() << name << ": fixture missing (make fixtures)";
  const ModelConfig& cfg = m->config();
  auto pr = LoraParams::create(cfg, lc, lora_layer_prefix(cfg), 11);
  ASSERT_TRUE(pr) << pr.message();
  LoraParams& p = pr.value();
  randomize_b(p, 12);
  LoraTrainModel tm(*m, p);
  Example a{tokens(cfg.vocab, n_tokens, 5), offset}, b{tokens(cfg.vocab, n_tokens / 2 + 3, 6), 0};
  const std::vector<const Example*> batch{&a, &b};
  const bool dropout = lc.dropout > 0;
  p.zero_grads();
  tm.run(batch, 1 << 20, 1.f, 99);
  std::mt19937 r(3);
  std::normal_distribution<float> nd;
  int checked = 0;
  double worst = 0;
  for (LoraModule& mod : p.modules()) {
    for (int which = 0; which < 2; ++which) {
      std::vector<float>& w = which ? mod.b : mod.a;
      const std::vector<float>& g = which ? mod.gb : mod.ga;
      std::vector<float> u(w.size());
      for (float& x : u) x = nd(r);
      double analytic = 0, un = 0;
      for (size_t i = 0; i < w.size(); ++i) analytic += double(g[i]) * u[i], un += double(u[i]) * u[i];
      // Five-point central differences (truncation O(eps⁴)), eps large enough that f32 noise in
      // the loss stays far below the differences.
      const float eps = float(5e-3 / std::sqrt(un / double(w.size())));
      const std::vector<float> w0 = w;
      auto at = [&](float t) {
        for (size_t i = 0; i < w.size(); ++i) w[i] = w0[i] + t * u[i];
        return loss(tm, batch, 99, dropout);
      };
      const double numeric = (8.0 * (at(eps) - at(-eps)) - (at(2 * eps) - at(-2 * eps))) / (12.0 * eps);
      w = w0;
      const double err = std::fabs(numeric - analytic) / std::max(std::fabs(analytic), 1e-2);
      worst = std::max(worst, err);
      // 3 %: the f32 noise of the loss (its sums vectorized, -fassociative-math) is the stencil's
      // floor; with 8-wide AVX2 sums it reached 2.4 % (0.8 % with AVX-512's 16-wide ones), moving
      // erratically with eps (2.5e-3 .. 1e-2), where a wrong gradient is off by far more.
      EXPECT_LT(err, 3e-2) << mod.name << (which ? ".lora_b" : ".lora_a") << ": analytic " << analytic
                           << " numeric " << numeric;
      ++checked;
    }
  }
  EXPECT_GT(checked, 10);
  std::printf("[%s] %d tensors, worst relative error of directional derivatives %.2e\n", name, checked, worst);
}

TEST(LoraTrain, GradientsMatchFiniteDifferencesDenseKeqV) {
  check_gradients("dense-q4g64", LoraConfig{4, 2, 2.f, 0.f}, 5, 21);
}

TEST(LoraTrain, GradientsMatchFiniteDifferencesPerLayerInputsAndKvSharing) {
  check_gradients("estyle-q4g64", LoraConfig{-1, 2, 1.5f, 0.f}, 0, 19);
}

TEST(LoraTrain, GradientsMatchFiniteDifferencesWithDropout) {
  check_gradients("dense-bf16", LoraConfig{2, 3, 3.f, 0.25f}, 2, 17);
}

// The same batch gives the same gradient bits after other batches (larger and smaller) and
// evaluations, and in a second trainer over the same model: nothing carries over between runs.
TEST(LoraTrain, GradientsDoNotDependOnEarlierRuns) {
  auto m = load_or_skip("estyle-q4g64");
  if (!m) GTEST_SKIP() << "estyle-q4g64: fixture missing (make fixtures)";
  const ModelConfig& cfg = m->config();
  auto pr = LoraParams::create(cfg, LoraConfig{-1, 2, 2.f, 0.f}, lora_layer_prefix(cfg), 11);
  ASSERT_TRUE(pr) << pr.message();
  LoraParams& p = pr.value();
  randomize_b(p, 4);
  Example a{tokens(cfg.vocab, 21, 1), 3}, b{tokens(cfg.vocab, 13, 2), 0}, c{tokens(cfg.vocab, 40, 3), 0};
  auto grads = [&](LoraTrainModel& tm, const std::vector<const Example*>& batch) {
    p.zero_grads();
    tm.run(batch, 1 << 20, 1.f, 5);
    std::vector<float> g;
    for (const LoraModule& mod : p.modules()) {
      g.insert(g.end(), mod.ga.begin(), mod.ga.end());
      g.insert(g.end(), mod.gb.begin(), mod.gb.end());
    }
    return g;
  };
  LoraTrainModel tm(*m, p);
  const std::vector<float> first = grads(tm, {&a, &b});
  grads(tm, {&c});
  tm.run({&c, &a}, 1 << 20, 0.f, 5);
  EXPECT_TRUE(grads(tm, {&a, &b}) == first);
  LoraTrainModel fresh(*m, p);
  EXPECT_TRUE(grads(fresh, {&a, &b}) == first);
}

TEST(LoraTrain, LogitsEqualTheInferenceModelWithTheSavedAdapter) {
  for (const char* name : {"dense-q4g64", "estyle-q4g64", "moe-q4g64"}) {
    SCOPED_TRACE(name);
    auto m = load_or_skip(name);
    if (!m) GTEST_SKIP() << name << ": fixture missing (make fixtures)";
    const ModelConfig& cfg = m->config();
    LoraConfig lc{-1, 4, 2.f, 0.f};
    auto pr = LoraParams::create(cfg, lc, lora_layer_prefix(cfg), 21);
    ASSERT_TRUE(pr) << pr.message();
    randomize_b(pr.value(), 22);
    const fs::path dir = fs::path(testing::TempDir()) / ("lora_train_" + std::string(name));
    fs::create_directories(dir);
    ASSERT_TRUE(pr->save((dir / "adapters.safetensors").string()));
    {
      std::FILE* f = std::fopen((dir / "adapter_config.json").c_str(), "w");
      std::fprintf(f, "{\"fine_tune_type\": \"lora\", \"num_layers\": -1, "
                      "\"lora_parameters\": {\"rank\": 4, \"scale\": 2.0, \"dropout\": 0.0}}\n");
      std::fclose(f);
    }
    auto ad = load_lora_adapter(dir.string(), cfg, m->backend());
    ASSERT_TRUE(ad) << ad.message();
    const auto ids = tokens(cfg.vocab, 23, 8);
    LoraTrainModel tm(*m, pr.value());
    const std::vector<float> want_plain = tm.logits(ids);
    m->set_adapter(std::move(ad.value()));
    std::vector<float> got(size_t(ids.size()) * cfg.vocab);
    auto cache = m->new_cache();
    m->forward({SeqInput{cache.get(), ids.data(), int(ids.size()), true}}, ActPrecision::F32, got.data());
    float d = 0;
    for (size_t i = 0; i < got.size(); ++i) d = std::max(d, std::fabs(got[i] - want_plain[i]));
    EXPECT_LT(d, 1e-3f);
  }
}

TEST(LoraTrain, NumpyLegacyPermutation) {
  // python: np.random.seed(0); np.random.permutation(10), np.random.permutation(7)
  NumpyLegacyRng r(0);
  EXPECT_EQ(r.permutation(10), (std::vector<int>{2, 8, 4, 9, 1, 6, 7, 3, 0, 5}));
  EXPECT_EQ(r.permutation(7), (std::vector<int>{3, 1, 2, 6, 5, 0, 4}));
  // np.random.seed(12345); np.random.permutation(40)
  NumpyLegacyRng s(12345);
  EXPECT_EQ(s.permutation(40), (std::vector<int>{32, 19, 2,  21, 5,  25, 3,  28, 0,  4,  12, 33, 15, 8,
                                                 35, 30, 20, 24, 7,  6,  26, 17, 10, 13, 11, 31, 18, 16,
                                                 22, 23, 27, 9,  14, 36, 38, 39, 1,  29, 37, 34}));
}

TEST(LoraTrain, AdamFollowsMlxUpdateRule) {
  // One module of one element: MLX Adam without bias correction, two steps by hand.
  LoraParams p;
  auto opt = Optimizer::create("adam", 0.1f);
  ASSERT_TRUE(opt);
  LoraModule m;
  m.a = {1.f};
  m.b = {2.f};
  m.ga = {0.5f};
  m.gb = {-1.f};
  p.modules().push_back(m);
  opt->step(p);
  // m1 = 0.1 g, v1 = 0.001 g², update = lr · m1 / (√v1 + 1e-8) = 0.1 · 0.1 / √0.001 · sign(g)
  const double u1 = 0.1 * 0.1 / std::sqrt(0.001);
  EXPECT_NEAR(p.modules()[0].a[0], 1.0 - u1, 1e-5);
  EXPECT_NEAR(p.modules()[0].b[0], 2.0 + u1, 1e-5);
  auto bad = Optimizer::create("lion", 0.1f);
  EXPECT_FALSE(bad);
}

}  // namespace
}  // namespace g4::train
