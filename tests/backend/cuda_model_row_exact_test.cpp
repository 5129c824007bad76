// Batch-invariant numerics through the whole model on CUDA (BackendOptions::row_exact): a
// sequence's logits must not change in any bit with how its prompt is cut into chunks, with a
// prefix restored from another cache (the prefix cache's copy_from + truncate), or with the
// sequences beside it in a forward. The op tests (cuda_row_exact_test.cpp) check each kernel;
// this checks that the model's op sequence keeps the property end to end (per-layer inputs, KV
// sharing, MoE, the LM head).
//
// Models: G4_CUDA_ROW_EXACT_MODELS (paths separated by ':', e.g. the synthetic E4B and 26B-A4B
// GGUFs of tools/make_synthetic_gemma4_gguf.py), else the mlx-lm fixtures of `make fixtures`
// (G4_FIXTURE_DIR overrides tests/fixtures/generated, as for the model tests).
// Skips with a printed reason without a CUDA device or without a model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "../model/model_test_util.h"

namespace g4 {
namespace {
namespace fs = std::filesystem;

std::vector<std::string> models() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("G4_CUDA_ROW_EXACT_MODELS")) {
    std::stringstream ss(env);
    for (std::string p; std::getline(ss, p, ':');)
      if (!p.empty()) out.push_back(p);
    return out;
  }
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(test::fixture_root(), ec))
    if (fs::exists(e.path() / "config.json")) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> prompt_ids(int vocab, int n, uint32_t seed) {
  std::vector<int32_t> p(size_t(n), 2);
  for (int i = 1; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    p[size_t(i)] = int32_t(3 + (seed >> 8) % uint32_t(std::min(vocab, 32000) - 3));
  }
  return p;
}

// First index where two logit rows differ in any bit, or -1.
int first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return int(i);
  return -1;
}

class CudaModelRowExact : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    BackendOptions probe;
    if (!make_cuda_backend(&why, probe)) {
      std::printf("SKIP: cuda backend unavailable: %s\n", why.c_str());
      GTEST_SKIP() << "no CUDA";
    }
    paths = models();
    if (paths.empty()) {
      std::printf("SKIP: no model (set G4_CUDA_ROW_EXACT_MODELS or run `make fixtures`)\n");
      GTEST_SKIP() << "no model";
    }
  }
  static std::unique_ptr<Model> load(const std::string& path) {
    BackendOptions opt;
    opt.activations = DType::BF16;
    opt.int8_dots = true;
    opt.row_exact = true;
    auto m = load_model(path, "cuda", opt);
    EXPECT_TRUE(m) << path << ": " << m.message();
    return m ? std::move(m.value()) : nullptr;
  }
  std::vector<std::string> paths;
};

// Feeds ids[from, to) into c in chunks of `chunk`, returning the last token's logits.
std::vector<float> feed(Model& m, KvCache& c, const std::vector<int32_t>& ids, int from, int to, int chunk) {
  std::vector<float> row(size_t(m.config().vocab));
  for (int s = from; s < to; s += chunk) {
    const int n = std::min(chunk, to - s);
    m.forward({SeqInput{&c, ids.data() + s, n, false}}, ActPrecision::F32, row.data());
  }
  return row;
}

int argmax(const std::vector<float>& r) { return int(std::max_element(r.begin(), r.end()) - r.begin()); }

TEST_F(CudaModelRowExact, ChunkingRestoreAndNeighboursLeaveLogitsUnchanged) {
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    auto mp = load(path);
    ASSERT_TRUE(mp);
    Model& m = *mp;
    const int V = m.config().vocab, L = 150, steps = 6;
    const auto ids = prompt_ids(V, L, 11), other = prompt_ids(V, 90, 5);
    // The engine's way alone: 64-row chunks from position 0, then greedy decode steps.
    auto run_decode = [&](KvCache& c, std::vector<float> row, std::vector<std::vector<float>>* out) {
      for (int s = 0; s < steps; ++s) {
        out->push_back(row);
        int32_t t = argmax(row);
        m.forward({SeqInput{&c, &t, 1, false}}, ActPrecision::F32, row.data());
      }
    };
    std::vector<std::vector<float>> alone;
    {
      auto c = m.new_cache();
      run_decode(*c, feed(m, *c, ids, 0, L, 64), &alone);
    }
    struct Case {
      const char* name;
      std::vector<float> last;
    };
    std::vector<Case> cases;
    for (int chunk : {37, 1, 50}) {
      auto c = m.new_cache();
      cases.push_back({chunk == 37 ? "chunks of 37" : chunk == 1 ? "token by token" : "chunks of 50",
                       feed(m, *c, ids, 0, L, chunk)});
    }
    {  // A prefix restored from a longer cache (PrefixCache::lookup), the rest in 64-row chunks. The
       // donor's 70 positions all stay in its sliding rings (window + 63 slots), so 53 can be restored.
      auto donor = m.new_cache();
      feed(m, *donor, ids, 0, 70, 64);
      auto c = m.new_cache();
      c->copy_from(*donor);
      ASSERT_TRUE(c->truncate(53));
      cases.push_back({"prefix of 53 restored", feed(m, *c, ids, 53, L, 64)});
    }
    {  // Beside another sequence's chunk in the same forwards (total rows <= 64).
      auto c = m.new_cache(), o = m.new_cache();
      std::vector<float> two(2 * size_t(V));
      for (int s = 0, so = 0; s < L; s += 40, so += 24) {
        const int n = std::min(40, L - s), no = std::min(24, int(other.size()) - so);
        std::vector<SeqInput> b{SeqInput{c.get(), ids.data() + s, n, false}};
        if (no > 0) b.insert(b.begin(), SeqInput{o.get(), other.data() + so, no, false});
        m.forward(b, ActPrecision::F32, two.data());
        if (s + 40 >= L) cases.push_back({"beside another prompt", std::vector<float>(two.begin() + (no > 0 ? V : 0), two.begin() + (no > 0 ? 2 * V : V))});
      }
    }
    for (const Case& k : cases) {
      const int d = first_difference(alone[0], k.last);
      EXPECT_EQ(d, -1) << k.name << ": logit " << d << " is " << k.last[size_t(d < 0 ? 0 : d)] << " against "
                       << alone[0][size_t(d < 0 ? 0 : d)] << " alone";
    }
    // Decode steps beside three other decoding sequences at other positions.
    {
      auto c = m.new_cache();
      std::vector<float> row = feed(m, *c, ids, 0, L, 64);
      std::vector<std::unique_ptr<KvCache>> others;
      std::vector<int32_t> tok(3, 7);
      for (int j = 0; j < 3; ++j) {
        others.push_back(m.new_cache());
        feed(m, *others.back(), other, 0, 20 + 30 * j, 64);
      }
      std::vector<float> four(4 * size_t(V));
      for (int s = 0; s < steps; ++s) {
        const int d = first_difference(alone[size_t(s)], row);
        EXPECT_EQ(d, -1) << "decode step " << s << " beside 3 others: logit " << d;
        int32_t t = argmax(row);
        std::vector<SeqInput> b;
        for (int j = 0; j < 3; ++j) b.push_back(SeqInput{others[size_t(j)].get(), &tok[size_t(j)], 1, false});
        b.insert(b.begin() + 1, SeqInput{c.get(), &t, 1, false});
        m.forward(b, ActPrecision::F32, four.data());
        row.assign(four.begin() + V, four.begin() + 2 * V);
      }
    }
  }
}

}  // namespace
}  // namespace g4
