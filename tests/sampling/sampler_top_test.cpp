// Sampler::sample_top (the device top-k path) against Sampler::sample on the whole row: with the
// same seed and parameters, the same tokens, draw after draw.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "sampling/sampler.h"

using g4::Sampler;
using g4::SamplingParams;

namespace {

// The k largest of x (lowest id among equal values) and the float lse sample() computes.
void top_of(const std::vector<float>& x, int k, std::vector<float>& vals, std::vector<int32_t>& ids, float& lse) {
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
    return x[a] != x[b] ? x[a] > x[b] : a < b;
  });
  std::mt19937 shuffle(7);  // the device returns them unordered
  std::shuffle(order.begin(), order.begin() + k, shuffle);
  vals.clear();
  ids.clear();
  for (int j = 0; j < k; ++j) {
    ids.push_back(order[size_t(j)]);
    vals.push_back(x[size_t(order[size_t(j)])]);
  }
  std::vector<float> c = x;
  lse = g4::log_softmax_inplace(c.data(), int(c.size()));
}

TEST(SamplerTop, SameTokensAsTheWholeRow) {
  const int V = 20000;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 3.f);
  struct Case { float temp; int top_k; float top_p, min_p; };
  for (const Case c : {Case{1.f, 64, 0.95f, 0.f}, Case{0.7f, 40, 1.f, 0.f}, Case{1.3f, 256, 0.9f, 0.05f},
                       Case{1.f, 1, 1.f, 0.f}, Case{0.5f, 8, 0.5f, 0.1f}}) {
    SamplingParams p;
    p.temperature = c.temp;
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.seed = 42;
    p.has_seed = true;
    ASSERT_TRUE(Sampler::top_k_sampleable(p, V));
    Sampler whole(p, V), top(p, V);
    int same = 0, n = 300;
    for (int t = 0; t < n; ++t) {
      std::vector<float> x(V);
      for (float& v : x) v = nd(rng);
      x[size_t(t % 97)] = x[size_t(t % 89)];  // a tie now and then
      std::vector<float> vals;
      std::vector<int32_t> ids;
      float lse = 0;
      const int K = std::min(256, std::max(c.top_k, 64));  // the batch's widest top_k
      top_of(x, K, vals, ids, lse);
      std::vector<float> row = x;
      const int a = whole.sample(row.data(), {});
      const int b = top.sample_top(vals.data(), ids.data(), K, lse);
      same += a == b;
    }
    // top_p's total mass: sample() sums the row in double (~1 - 1e-7), sample_top takes 1; a cut
    // that falls within that rounding may move. None does here.
    EXPECT_EQ(same, n) << "temp " << c.temp << " top_k " << c.top_k;
  }
}

TEST(SamplerTop, OnlyTopKBoundedParamsQualify) {
  SamplingParams p;
  p.temperature = 1.f;
  EXPECT_FALSE(Sampler::top_k_sampleable(p, 1000));  // no top_k: the whole row matters
  p.top_k = 50;
  EXPECT_TRUE(Sampler::top_k_sampleable(p, 1000));
  p.top_k = Sampler::kMaxTopK + 1;
  EXPECT_FALSE(Sampler::top_k_sampleable(p, 1000));
  p.top_k = 50;
  p.repetition_penalty = 1.1f;
  EXPECT_FALSE(Sampler::top_k_sampleable(p, 1000));
  p.repetition_penalty = 1.f;
  p.logit_bias = {{3, 1.f}};
  EXPECT_FALSE(Sampler::top_k_sampleable(p, 1000));
  p.logit_bias.clear();
  p.temperature = 0.f;
  EXPECT_FALSE(Sampler::top_k_sampleable(p, 1000));  // greedy: the argmax path
}

}  // namespace
