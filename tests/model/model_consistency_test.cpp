// Model-level consistency on every generated fixture (tests/fixtures/generated/*, made by
// tools/make_fixtures.py with mlx-lm): the fast CPU backend against the reference backend,
// whole-prompt prefill against token-by-token decode and chunked prefill, and one sequence alone
// against the same sequence inside a batch. (Parity against mlx-lm itself is tests/python/test_parity.py.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "model/model.h"

namespace g4 {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> fixture_dirs() {
  std::vector<std::string> out;
  fs::path root = fs::path(G4_SOURCE_DIR) / "tests/fixtures/generated";
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (fs::exists(e.path() / "config.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> test_prompt(int vocab, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  uint32_t s = 7;
  for (int i = 0; i < n; ++i) {
    s = s * 1103515245u + 12345u;
    p[size_t(i)] = int32_t(3 + (s >> 8) % uint32_t(vocab - 3));
  }
  p[0] = 2;
  return p;
}

// Logits [n, V] for `ids` processed in chunks of `chunk` tokens.
std::vector<float> run(Model& m, const std::vector<int32_t>& ids, int chunk, ActPrecision P) {
  const int V = m.config().vocab, L = int(ids.size());
  std::vector<float> out(size_t(L) * V);
  auto cache = m.new_cache();
  for (int s = 0; s < L; s += chunk) {
    const int n = std::min(chunk, L - s);
    m.forward({SeqInput{cache.get(), ids.data() + s, n, true}}, P, out.data() + size_t(s) * V);
  }
  return out;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(ModelConsistency, FixturesExist) {
  if (std::getenv("G4_ALLOW_MISSING_FIXTURES")) GTEST_SKIP() << "fixtures not required";
  EXPECT_FALSE(fixture_dirs().empty()) << "run `make fixtures` first (tools/make_fixtures.py)";
}

TEST(ModelConsistency, FastBackendMatchesReference) {
  for (const std::string& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    auto ref = load_model(dir, "reference");
    ASSERT_TRUE(ref) << ref.message();
    auto fast = load_model(dir, "cpu");
    ASSERT_TRUE(fast) << fast.message();
    auto ids = test_prompt(ref.value()->config().vocab, 19);
    for (ActPrecision P : {ActPrecision::F32, ActPrecision::BF16}) {
      auto a = run(*ref.value(), ids, 19, P);
      auto b = run(*fast.value(), ids, 19, P);
      // f32: only summation order differs. bf16: a 1-ulp flip of an intermediate may propagate.
      EXPECT_LT(max_abs_diff(a, b), P == ActPrecision::F32 ? 1e-3f : 0.25f);
    }
  }
}

// The reference backend computes every row the same way whatever the batch shape, so chunking
// must not change a single bit; the fast backend picks kernels by row count (M = 1 GEMV vs tiled
// and AMX paths), so there only the summation order differs.
// Taps observe the forward without changing it: the same logits with and without them (a prompt
// at once and token by token), and every layer's named intermediates are seen, those inside the
// fused ops (computed beside the forward) included.
TEST(ModelConsistency, TapsLeaveTheForwardAlone) {
  for (const char* backend : {"reference", "cpu"}) {
    for (const std::string& dir : fixture_dirs()) {
      SCOPED_TRACE(dir + " on " + backend);
      auto mr = load_model(dir, backend);
      ASSERT_TRUE(mr) << mr.message();
      Model& m = *mr.value();
      const auto ids = test_prompt(m.config().vocab, 9);
      for (int chunk : {9, 1}) {
        SCOPED_TRACE(chunk);
        const auto plain = run(m, ids, chunk, ActPrecision::F32);
        std::vector<std::vector<std::string>> seen(size_t(m.config().n_layers));
        m.set_tap([&](const char* name, int layer, const float*, size_t) {
          if (layer >= 0 && layer < int(seen.size())) seen[size_t(layer)].push_back(name);
        });
        const auto tapped = run(m, ids, chunk, ActPrecision::F32);
        m.set_tap(nullptr);
        EXPECT_EQ(max_abs_diff(plain, tapped), 0.f);
        for (size_t l = 0; l < seen.size(); ++l)
          for (const char* want : {"q_normed", "q_roped", "attn", "attn_residual", "mlp_in", "mlp_gate", "mlp_up",
                                   "mlp_act", "mlp_out", "layer_out"})
            EXPECT_NE(std::find(seen[l].begin(), seen[l].end(), want), seen[l].end()) << "layer " << l << ": " << want;
      }
    }
  }
}

TEST(ModelConsistency, PrefillEqualsDecodeAndChunks) {
  for (const char* backend : {"reference", "cpu"}) {
    for (const std::string& dir : fixture_dirs()) {
      SCOPED_TRACE(dir + " on " + backend);
      auto m = load_model(dir, backend);
      ASSERT_TRUE(m) << m.message();
      // Longer than every fixture's sliding window, so ring caches wrap.
      auto ids = test_prompt(m.value()->config().vocab, 37);
      for (ActPrecision P : {ActPrecision::F32, ActPrecision::BF16}) {
        if (P == ActPrecision::BF16 && std::string(backend) == "cpu") continue;  // same kernels as reference
        auto whole = run(*m.value(), ids, 37, P);
        for (int chunk : {1, 5, 8, 16}) {
          SCOPED_TRACE(chunk);
          const float d = max_abs_diff(whole, run(*m.value(), ids, chunk, P));
          if (std::string(backend) == "reference") {
            EXPECT_EQ(d, 0.f);
          } else {
            EXPECT_LT(d, 1e-3f);
          }
        }
      }
    }
  }
}

TEST(ModelConsistency, BatchEqualsAlone) {
  for (const char* backend : {"reference", "cpu"})
  for (const std::string& dir : fixture_dirs()) {
    SCOPED_TRACE(dir + " on " + backend);
    const bool exact = std::string(backend) == "reference";
    auto mr = load_model(dir, backend);
    ASSERT_TRUE(mr) << mr.message();
    Model& m = *mr.value();
    const int V = m.config().vocab;
    auto a = test_prompt(V, 23), b = test_prompt(V, 11);
    b[3] = 17;
    // Alone: a then b, each prefilled then decoded 4 steps greedily.
    auto solo = [&](const std::vector<int32_t>& p) {
      std::vector<float> out, row(static_cast<size_t>(V));
      auto c = m.new_cache();
      m.forward({SeqInput{c.get(), p.data(), int(p.size()), false}}, ActPrecision::F32, row.data());
      out.insert(out.end(), row.begin(), row.end());
      for (int step = 0; step < 4; ++step) {
        int32_t t = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
        m.forward({SeqInput{c.get(), &t, 1, false}}, ActPrecision::F32, row.data());
        out.insert(out.end(), row.begin(), row.end());
      }
      return out;
    };
    auto sa = solo(a), sb = solo(b);
    // Together: b joins while a is already decoding (mixed prefill + decode batch).
    auto ca = m.new_cache(), cb = m.new_cache();
    std::vector<float> two(2 * size_t(V));
    std::vector<float> ga, gb;
    m.forward({SeqInput{ca.get(), a.data(), int(a.size()), false}}, ActPrecision::F32, two.data());
    ga.insert(ga.end(), two.begin(), two.begin() + V);
    int32_t ta = int32_t(std::max_element(two.begin(), two.begin() + V) - two.begin());
    m.forward({SeqInput{ca.get(), &ta, 1, false}, SeqInput{cb.get(), b.data(), int(b.size()), false}},
              ActPrecision::F32, two.data());
    ga.insert(ga.end(), two.begin(), two.begin() + V);
    gb.insert(gb.end(), two.begin() + V, two.end());
    for (int step = 0; step < 3; ++step) {
      ta = int32_t(std::max_element(two.begin(), two.begin() + V) - two.begin());
      int32_t tb = int32_t(std::max_element(two.begin() + V, two.end()) - (two.begin() + V));
      m.forward({SeqInput{ca.get(), &ta, 1, false}, SeqInput{cb.get(), &tb, 1, false}},
                ActPrecision::F32, two.data());
      ga.insert(ga.end(), two.begin(), two.begin() + V);
      gb.insert(gb.end(), two.begin() + V, two.end());
    }
    sa.resize(ga.size());
    sb.resize(gb.size());
    // Reference: bit-identical. Fast backend: kernels chosen by row count; within f32 rounding.
    EXPECT_LE(max_abs_diff(sa, ga), exact ? 0.f : 1e-3f);
    EXPECT_LE(max_abs_diff(sb, gb), exact ? 0.f : 1e-3f);
  }
}

// forward's argmax output (Backend::argmax, which device backends run in place) names each
// returned row's largest logit, alone or beside the logits, for a batch of two sequences.
TEST(ModelConsistency, ArgmaxMatchesLogits) {
  for (const std::string& dir : fixture_dirs()) {
    SCOPED_TRACE(dir);
    auto mr = load_model(dir, "cpu");
    ASSERT_TRUE(mr) << mr.message();
    Model& m = *mr.value();
    const int V = m.config().vocab;
    auto a = test_prompt(V, 9), b = test_prompt(V, 5);
    auto ca = m.new_cache(), cb = m.new_cache();
    std::vector<float> logits(2 * size_t(V));
    int32_t ids[2] = {-1, -1};
    m.forward({SeqInput{ca.get(), a.data(), int(a.size()), false}, SeqInput{cb.get(), b.data(), int(b.size()), false}},
              ActPrecision::F32, logits.data(), ids);
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(ids[r], int32_t(std::max_element(logits.begin() + r * V, logits.begin() + (r + 1) * V) -
                                (logits.begin() + r * V)));
    // Without the logits: the next step's ids only.
    int32_t next[2] = {ids[0], ids[1]}, got[2] = {-1, -1};
    auto ca2 = m.new_cache(), cb2 = m.new_cache();
    m.forward({SeqInput{ca2.get(), a.data(), int(a.size()), false}, SeqInput{cb2.get(), b.data(), int(b.size()), false}},
              ActPrecision::F32, logits.data());
    m.forward({SeqInput{ca.get(), &next[0], 1, false}, SeqInput{cb.get(), &next[1], 1, false}}, ActPrecision::F32,
              nullptr, got);
    m.forward({SeqInput{ca2.get(), &next[0], 1, false}, SeqInput{cb2.get(), &next[1], 1, false}}, ActPrecision::F32,
              logits.data());
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(got[r], int32_t(std::max_element(logits.begin() + r * V, logits.begin() + (r + 1) * V) -
                                (logits.begin() + r * V)));
  }
}

}  // namespace
}  // namespace g4
