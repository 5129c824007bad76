// Decode steps padded to row buckets (Model::set_decode_padding, as `serve` runs them on cuda): the
// real rows' outputs and caches are those of the same step unpadded, with and without a KV pool,
// on the reference and cpu backends, and on cuda where a device is present. Fixture: dense-q4g64
// (G4_FIXTURE_DIR overrides tests/fixtures/generated).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "model/kv_pool.h"
#include "model/model.h"
#include "model_test_util.h"

namespace g4 {
namespace {


TEST(DecodeBuckets, RowsRoundUpBeyondEight) {
  EXPECT_EQ(Model::decode_bucket(1), 1);
  EXPECT_EQ(Model::decode_bucket(8), 8);
  EXPECT_EQ(Model::decode_bucket(9), 16);
  EXPECT_EQ(Model::decode_bucket(17), 24);
  EXPECT_EQ(Model::decode_bucket(64), 64);
  EXPECT_EQ(Model::decode_bucket(65), 96);
  EXPECT_EQ(Model::decode_bucket(256), 256);
  EXPECT_EQ(Model::decode_bucket(257), 320);
}

// Eleven sequences of different prompt lengths, then three decode steps of all of them (padded to
// 16 rows) and one of nine (padded to 16 too), argmax and top k and logits, against twins decoded
// without padding.
void padded_steps_match(const std::string& backend, bool pool) {
  std::string skip;
  const auto model = test::fixture_model("dense-q4g64", backend, &skip);
  if (!model && !skip.empty()) GTEST_SKIP() << skip;
  if (!model) return;
  Model& m = *model;
  const ActPrecision P = backend == "cuda" ? ActPrecision::BF16 : ActPrecision::F32;
  const int V = m.config().vocab, S = 11;
  if (pool) m.set_kv_pool(std::make_shared<KvPool>(m.config(), m.backend(), 4, std::array<int64_t, 2>{256, 256}, 64));
  std::vector<std::unique_ptr<KvCache>> padded, plain;
  std::vector<std::vector<int32_t>> prompts(S);
  for (int s = 0; s < S; ++s) {
    for (int t = 0; t < 3 + s; ++t) prompts[size_t(s)].push_back(2 + (s * 131 + t * 37) % (V - 3));
    for (auto* set : {&padded, &plain}) {
      set->push_back(m.new_cache());
      m.forward({SeqInput{set->back().get(), prompts[size_t(s)].data(), int(prompts[size_t(s)].size()), false}}, P,
                nullptr);
    }
  }
  ASSERT_TRUE(m.set_decode_padding(true));
  ASSERT_TRUE(m.decode_padding());
  float scale = 0, worst = 0;
  for (int step = 0; step < 4; ++step) {
    const int n = step < 3 ? S : 9;
    std::vector<int32_t> tok(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) tok[size_t(s)] = 2 + (step * 53 + s * 7) % (V - 3);
    std::vector<SeqInput> a, b;
    for (int s = 0; s < n; ++s) {
      a.push_back(SeqInput{padded[size_t(s)].get(), &tok[size_t(s)], 1, false});
      b.push_back(SeqInput{plain[size_t(s)].get(), &tok[size_t(s)], 1, false});
    }
    std::vector<float> la(size_t(n) * V), lb(size_t(n) * V);
    std::vector<int32_t> ga(static_cast<size_t>(n)), gb(static_cast<size_t>(n));
    ASSERT_TRUE(m.set_decode_padding(true));
    size_t rows = 0;  // the forward's rows, from its first tap (the taps' path on the last step)
    if (step == 3)
      m.set_tap([&](const char* name, int, const float*, size_t count) {
        if (!rows && std::string(name) == "embed") rows = count / size_t(m.config().hidden);
      });
    m.forward(a, P, la.data(), ga.data());
    if (step == 3) {
      m.set_tap(nullptr);
      EXPECT_EQ(rows, 16u) << "9 decode rows run as a bucket of 16";
    }
    m.set_decode_padding(false);
    m.forward(b, P, lb.data(), gb.data());
    for (size_t i = 0; i < la.size(); ++i) {
      scale = std::max(scale, std::fabs(lb[i]));
      worst = std::max(worst, std::fabs(la[i] - lb[i]));
    }
    if (backend != "cuda") {
      EXPECT_EQ(ga, gb) << "step " << step;
    }
    for (int s = 0; s < n; ++s) EXPECT_EQ(padded[size_t(s)]->size(), plain[size_t(s)]->size()) << s;
  }
  // Host backends compute a row the same in any batch; cuda's kernels may change with the row count
  // (bf16 activations), within its batched-decode tolerance.
  const float bound = backend == "cuda" ? 2e-2f * std::max(1.f, scale) : 0.f;
  EXPECT_LE(worst, bound) << backend << " max|logit| " << scale;
  std::printf("[decode buckets] %s%s: max |padded - plain| %.3g (max |logit| %.3g)\n", backend.c_str(),
              pool ? " pool" : "", double(worst), double(scale));
  m.set_decode_padding(false);
  if (pool) m.set_kv_pool(nullptr);
}

class DecodePadding : public ::testing::TestWithParam<const char*> {};

TEST_P(DecodePadding, RealRowsAsUnpadded) { padded_steps_match(GetParam(), false); }
TEST_P(DecodePadding, RealRowsAsUnpaddedInAPool) { padded_steps_match(GetParam(), true); }

INSTANTIATE_TEST_SUITE_P(Backends, DecodePadding, ::testing::Values("reference", "cpu", "cuda"));

}  // namespace
}  // namespace g4
