// Sampler draws: distribution (chi-square with fixed seeds), determinism, independence, and the
// fast candidate path vs the full-vocabulary reference filters on large vocabularies.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <random>

#include "sampling/sampler.h"

using g4::Sampler;
using g4::SamplingParams;

namespace {

SamplingParams seeded(float temp, uint64_t seed) {
  SamplingParams p;
  p.temperature = temp;
  p.seed = seed;
  p.has_seed = true;
  return p;
}

// Pearson chi-square of observed counts vs expected probabilities (categories with p > 0).
double chi_square(const std::vector<int>& counts, const std::vector<double>& probs, int n) {
  double x2 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has zero probability";
      continue;
    }
    double e = probs[i] * n;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

std::vector<double> softmax(const std::vector<float>& x, double temp) {
  double m = -1e300, s = 0;
  for (float v : x) m = std::max(m, double(v));
  std::vector<double> p(x.size());
  for (size_t i = 0; i < x.size(); ++i) s += p[i] = std::exp((x[i] - m) / temp);
  for (auto& v : p) v /= s;
  return p;
}

std::vector<int> histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::vector<int> c(logits.size());
  for (int t = 0; t < n; ++t) {
    auto x = logits;
    c[s.sample(x.data(), {})]++;
  }
  return c;
}

const std::vector<float> kLogits = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f, -3.0f, 1.5f};

}  // namespace

// Chi-square critical values: dof 7 at p = 1e-4 is 29.9; we allow 35 (fails on a real bias,
// e.g. an off-by-one in the CDF scan or a wrong temperature, which give chi2 in the hundreds).
TEST(SamplerStats, MatchesSoftmaxAtTemperature) {
  const int n = 40000;
  for (float temp : {1.0f, 0.5f, 2.0f}) {
    Sampler s(seeded(temp, 1234), int(kLogits.size()));
    auto c = histogram(s, kLogits, n);
    double x2 = chi_square(c, softmax(kLogits, temp), n);
    EXPECT_LT(x2, 35.0) << "temperature " << temp;
  }
}

TEST(SamplerStats, WrongDistributionIsDetected) {
  // The same test must fail against a wrong expectation (temperature 1 vs 0.5): guards the test.
  const int n = 40000;
  Sampler s(seeded(1.0f, 99), int(kLogits.size()));
  auto c = histogram(s, kLogits, n);
  EXPECT_GT(chi_square(c, softmax(kLogits, 0.5), n), 100.0);
}

TEST(SamplerStats, TopKRenormalizes) {
  const int n = 30000;
  SamplingParams p = seeded(1.0f, 5);
  p.top_k = 3;  // tokens 0 (2.0), 7 (1.5), 1 (1.0)
  Sampler s(p, int(kLogits.size()));
  auto c = histogram(s, kLogits, n);
  std::vector<float> kept = {2.0f, 1.0f, 1.5f};
  auto q = softmax(kept, 1.0);
  std::vector<double> probs(kLogits.size(), 0.0);
  probs[0] = q[0];
  probs[1] = q[1];
  probs[7] = q[2];
  EXPECT_LT(chi_square(c, probs, n), 25.0);  // dof 2, p=1e-5 -> 23.0
}

TEST(SamplerStats, TopPAndMinP) {
  // probs of kLogits (hand-computed): 0:.4046 7:.2454 1:.1488 2:.0903 3:.0548 4:.0332 5:.0201
  // 6:.0027
  const int n = 30000;
  SamplingParams p = seeded(1.0f, 11);
  p.top_p = 0.6f;  // mass above: 0 -> 0, 7 -> .4046 (< .6), 1 -> .650 (>= .6): keep {0, 7}
  Sampler s(p, int(kLogits.size()));
  auto c = histogram(s, kLogits, n);
  for (int i : {1, 2, 3, 4, 5, 6}) EXPECT_EQ(c[i], 0) << i;
  std::vector<double> probs(kLogits.size(), 0.0);
  probs[0] = .4046 / (.4046 + .2454);
  probs[7] = .2454 / (.4046 + .2454);
  EXPECT_LT(chi_square(c, probs, n), 20.0);  // dof 1
  SamplingParams m = seeded(1.0f, 12);
  m.min_p = 0.2f;  // keep prob >= 0.2 * .4046 = .0809 -> tokens 0, 7, 1, 2
  Sampler s2(m, int(kLogits.size()));
  auto c2 = histogram(s2, kLogits, n);
  for (int i : {3, 4, 5, 6}) EXPECT_EQ(c2[i], 0) << i;
  EXPECT_GT(c2[2], 0);
  m.min_tokens_to_keep = 6;  // now the top 6 survive: 0, 7, 1, 2, 3, 4
  Sampler s3(m, int(kLogits.size()));
  auto c3 = histogram(s3, kLogits, n);
  for (int i : {5, 6}) EXPECT_EQ(c3[i], 0) << i;
  EXPECT_GT(c3[4], 0);
}

// The unfiltered path draws over the whole vocabulary: 4 tokens carry 0.2 each and 16380
// others share the remaining 0.2 (bucketed as one category).
TEST(SamplerStats, FullVocabularyDraw) {
  const int V = 16384, n = 3000;
  std::vector<float> logits(V, 0.f);
  const float big = std::log(0.2f / (0.2f / (V - 4)));  // each big token = 0.2 of the mass
  for (int t : {7, 1000, 9000, 16383}) logits[t] = big;
  Sampler s(seeded(1.0f, 77), V);
  std::vector<int> c(5, 0);
  for (int i = 0; i < n; ++i) {
    auto x = logits;
    int t = s.sample(x.data(), {});
    c[t == 7 ? 0 : t == 1000 ? 1 : t == 9000 ? 2 : t == 16383 ? 3 : 4]++;
  }
  EXPECT_LT(chi_square(c, {0.2, 0.2, 0.2, 0.2, 0.2}, n), 23.0);  // dof 4, p = 1e-4 -> 23.5
}

TEST(SamplerStats, TemperatureZeroIsArgmax) {
  Sampler s(seeded(0.f, 1), int(kLogits.size()));
  for (int i = 0; i < 20; ++i) {
    auto x = kLogits;
    EXPECT_EQ(s.sample(x.data(), {}), 0);
  }
}

TEST(SamplerStats, SeedDeterminismAndIndependence) {
  std::vector<float> logits(1000);
  std::mt19937 g(3);
  std::normal_distribution<float> nd(0, 2);
  for (auto& v : logits) v = nd(g);
  auto run = [&](Sampler& s, int n) {
    std::vector<int> out;
    for (int i = 0; i < n; ++i) {
      auto x = logits;
      out.push_back(s.sample(x.data(), {}));
    }
    return out;
  };
  SamplingParams p = seeded(1.0f, 42);
  p.top_p = 0.9f;
  Sampler a(p, 1000), b(p, 1000);
  auto ra = run(a, 200), rb = run(b, 200);
  EXPECT_EQ(ra, rb);
  SamplingParams q = p;
  q.seed = 43;
  Sampler c(q, 1000);
  EXPECT_NE(run(c, 200), ra);
  // Interleaving two sequences does not change either one's stream.
  Sampler x(p, 1000), y(q, 1000);
  std::vector<int> rx, ry;
  for (int i = 0; i < 200; ++i) {
    auto l1 = logits, l2 = logits;
    rx.push_back(x.sample(l1.data(), {}));
    ry.push_back(y.sample(l2.data(), {}));
  }
  EXPECT_EQ(rx, ra);
  Sampler c2(q, 1000);
  EXPECT_EQ(ry, run(c2, 200));
}

TEST(SamplerStats, LogitsBecomeProcessedLogprobs) {
  SamplingParams p = seeded(1.0f, 1);
  p.repetition_penalty = 1.5f;
  p.logit_bias = {{3, 2.0f}};
  std::vector<float> x = kLogits, ref = kLogits;
  std::vector<int> hist = {0, 0, 5};
  Sampler s(p, int(x.size()));
  s.sample(x.data(), hist);
  g4::apply_logits_processors(p, ref.data(), int(ref.size()), hist);
  g4::log_softmax_inplace(ref.data(), int(ref.size()));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_FLOAT_EQ(x[i], ref[i]);
  EXPECT_FLOAT_EQ(x[0] - x[7], 2.0f / 1.5f - 1.5f);  // repetition: 2.0 / 1.5 vs 1.5
}

TEST(SamplerStats, DegenerateInputsDoNotCrash) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(16, -inf);
  SamplingParams p = seeded(1.0f, 1);
  p.top_p = 0.5f;
  p.min_p = 0.1f;
  p.top_k = 4;
  Sampler s(p, 16);
  int t = s.sample(x.data(), std::vector<int>{-5, 99, 3});
  EXPECT_GE(t, 0);
  EXPECT_LT(t, 16);
  std::vector<float> y(16, 0.f);
  y[5] = std::nanf("");
  t = s.sample(y.data(), {});
  EXPECT_GE(t, 0);
  EXPECT_LT(t, 16);
  EXPECT_FALSE(g4::validate(p, 16).is_ok() == false);
  SamplingParams bad;
  bad.top_p = 1.5f;
  EXPECT_FALSE(g4::validate(bad, 16).is_ok());
  bad = {};
  bad.logit_bias = {{16, 1.f}};
  EXPECT_FALSE(g4::validate(bad, 16).is_ok());
  bad = {};
  bad.min_tokens_to_keep = 0;
  EXPECT_FALSE(g4::validate(bad, 16).is_ok());
}

// ---- fast path vs reference filters on a large vocabulary ----
namespace {

std::vector<float> big_logits(int V, uint64_t seed, float peak) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> nd(0, 1.5f);
  std::vector<float> x(V);
  for (auto& v : x) v = nd(g);
  for (int j = 0; j < 30; ++j) x[g() % V] += peak * float(j % 5 + 1) / 5.f;
  return x;
}

// Reference chain on full arrays; returns the kept mask.
std::vector<char> ref_chain(std::vector<float> lp, const SamplingParams& p) {
  int V = int(lp.size());
  if (p.top_p > 0 && p.top_p < 1) g4::ref_apply_top_p(lp.data(), V, p.top_p);
  if (p.min_p != 0) g4::ref_apply_min_p(lp.data(), V, p.min_p, p.min_tokens_to_keep);
  if (p.top_k > 0) g4::ref_apply_top_k(lp.data(), V, p.top_k);
  std::vector<char> m(V);
  for (int i = 0; i < V; ++i) m[i] = std::isfinite(lp[i]);
  return m;
}

}  // namespace

TEST(SamplerFast, MatchesReferenceOnLargeVocab) {
  const int V = 262144;
  struct Cfg {
    float top_p, min_p;
    int keep, top_k;
    float peak;
    bool ties = false;  // logits rounded to 1/16: many equal values at every cut
  };
  std::vector<Cfg> cfgs = {
      {0.7f, 0.f, 1, 0, 1.f, true}, {0.95f, 0.f, 1, 0, 6.f, true}, {0.8f, 0.05f, 2, 0, 0.f, true},
      {0.95f, 0.f, 1, 64, 14.f}, {0.9f, 0.f, 1, 0, 12.f},  {1.f, 0.f, 1, 40, 10.f},
      {1.f, 0.05f, 1, 0, 14.f},  {1.f, 0.1f, 5, 0, 3.f},   {0.5f, 0.02f, 3, 20, 15.f},
      {0.99f, 0.f, 1, 0, 16.f},  {1.f, 0.f, 1, 1, 8.f},    {0.3f, 0.f, 1, 0, 2.f},
  };
  int checked = 0;
  for (size_t ci = 0; ci < cfgs.size(); ++ci) {
    auto& c = cfgs[ci];
    SamplingParams p = seeded(1.0f, ci);
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    p.min_tokens_to_keep = c.keep;
    p.top_k = c.top_k;
    auto x = big_logits(V, 100 + ci, c.peak);
    if (c.ties)
      for (auto& v : x) v = std::round(v * 16.f) / 16.f;
    auto lp = x;
    g4::log_softmax_inplace(lp.data(), V);
    auto want = ref_chain(lp, p);
    Sampler s(p, V);
    int tok = s.sample(x.data(), {});
    std::vector<char> got(V, 0);
    if (s.last_all_survived()) {
      for (int i = 0; i < V; ++i) got[i] = std::isfinite(x[i]);
    } else {
      for (auto& [v, id] : s.last_candidates()) got[id] = 1;
    }
    // Exact agreement, except that top_p's total mass is an fp32 sum over the whole sorted
    // vocabulary in the reference (as in mlx) and an exact sum here: with ~1e5 tail tokens of
    // ~1e-6 each, the cut may move by a few tokens. Those must be adjacent to the cut and carry
    // < 1e-4 of the probability mass.
    int diff = 0, kept = 0;
    double diff_mass = 0;
    float lo_common = std::numeric_limits<float>::infinity(), hi_diff = -lo_common;
    for (int i = 0; i < V; ++i) {
      kept += want[i];
      if (got[i] && want[i]) lo_common = std::min(lo_common, lp[i]);
      if (got[i] != want[i]) {
        ++diff;
        diff_mass += std::exp(double(lp[i]));
        hi_diff = std::max(hi_diff, lp[i]);
      }
    }
    if (p.top_p < 1 && c.top_k == 0) {
      EXPECT_LT(diff_mass, 1e-4) << "config " << ci << " (kept " << kept << ", diff " << diff << ")";
      if (diff) {
        EXPECT_LE(hi_diff, lo_common) << "config " << ci;
        std::printf("config %zu: top_p cut differs by %d of %d tokens (mass %.2e)\n", ci, diff,
                    kept, diff_mass);
      }
    } else {
      EXPECT_EQ(diff, 0) << "config " << ci << " (kept " << kept << ")";
    }
    EXPECT_TRUE(want[tok]) << "config " << ci;
    ++checked;
  }
  EXPECT_EQ(checked, int(cfgs.size()));
}

TEST(SamplerFast, TimingLargeVocab) {
  const int V = 262144;
  auto x0 = big_logits(V, 7, 14.f);
  SamplingParams p = seeded(1.0f, 3);
  p.top_k = 64;
  p.top_p = 0.95f;
  Sampler s(p, V);
  std::vector<int> hist(64, 17);
  const int iters = 50;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    auto x = x0;
    s.sample(x.data(), hist);
  }
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count() / iters;
  SamplingParams g;
  Sampler sg(g, V);
  t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) {
    auto x = x0;
    sg.sample(x.data(), hist);
  }
  double ms_g = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count() / iters;
  std::printf("V=262144 sample(): top_k=64 top_p=0.95: %.3f ms; greedy: %.3f ms (incl. copy)\n",
              ms, ms_g);
  EXPECT_LT(ms, 50.0);  // generous: a full sort path alone takes ~20 ms here
}

TEST(SamplerStats, NeverDrawsMinusInfinity) {
  // Only 3 finite logits in a large vocabulary, unfiltered path (all tokens "alive").
  const int V = 4099;
  std::vector<float> logits(V, -std::numeric_limits<float>::infinity());
  logits[5] = 0.f;
  logits[4000] = -80.f;  // tiny but possible
  logits[4098] = 1.f;
  Sampler s(seeded(3.0f, 8), V);
  for (int i = 0; i < 3000; ++i) {
    auto x = logits;
    int t = s.sample(x.data(), {});
    ASSERT_TRUE(t == 5 || t == 4000 || t == 4098) << t;
  }
}

TEST(SamplerStats, XtcCoinHalfTheTime) {
  // kLogits probs: 0:.4046 7:.2454 1:.1488 ... With threshold 0.1 the tokens above it are
  // {0, 7, 1}; XTC removes all but the least probable of them (1), i.e. tokens 0 and 7.
  // With probability 0.5 the draw is from the full softmax, otherwise from the rest.
  const int n = 40000;
  SamplingParams p = seeded(1.0f, 21);
  p.xtc_probability = 0.5f;
  p.xtc_threshold = 0.1f;
  Sampler s(p, int(kLogits.size()));
  auto c = histogram(s, kLogits, n);
  auto full = softmax(kLogits, 1.0);
  double rest = 1.0 - full[0] - full[7];
  std::vector<double> probs(kLogits.size());
  for (size_t i = 0; i < probs.size(); ++i)
    probs[i] = 0.5 * full[i] + ((i == 0 || i == 7) ? 0.0 : 0.5 * full[i] / rest);
  EXPECT_LT(chi_square(c, probs, n), 35.0);
  // Special tokens are exempt: with token 0 special, only 7 is removed.
  p.xtc_probability = 1.f;
  p.xtc_special_tokens = {0};
  Sampler s2(p, int(kLogits.size()));
  auto c2 = histogram(s2, kLogits, 5000);
  EXPECT_EQ(c2[7], 0);
  EXPECT_GT(c2[0], 0);
}

TEST(SamplerStats, TopLogprobs) {
  std::vector<float> x = {-1.f, -0.5f, -3.f, -0.5f, std::nanf(""), -0.1f};
  auto t = g4::top_logprobs(x.data(), int(x.size()), 3);
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[0].first, 5);
  EXPECT_EQ(t[1].first, 1);  // tie with 3: lowest id first
  EXPECT_EQ(t[2].first, 3);
  EXPECT_FLOAT_EQ(t[2].second, -0.5f);
  EXPECT_EQ(g4::top_logprobs(x.data(), int(x.size()), 99).size(), x.size());
  EXPECT_TRUE(g4::top_logprobs(x.data(), int(x.size()), 0).empty());
}

// What run and serve sample with when a flag or request leaves a parameter out: the model's
// generation_config where it sets one (Gemma 4's: temperature 1, top_k 64, top_p 0.95), else greedy.
TEST(SamplerDefaults, GenerationConfigFillsWhatItSets) {
  g4::ModelConfig cfg;
  SamplingParams none = g4::generation_defaults(cfg);
  EXPECT_EQ(none.temperature, 0.f);
  EXPECT_EQ(none.top_k, 0);
  EXPECT_EQ(none.top_p, 1.f);
  cfg.gen_temperature = 1.f;
  cfg.gen_top_k = 64;
  cfg.gen_top_p = 0.95f;
  SamplingParams g = g4::generation_defaults(cfg);
  EXPECT_EQ(g.temperature, 1.f);
  EXPECT_EQ(g.top_k, 64);
  EXPECT_EQ(g.top_p, 0.95f);
  cfg.gen_top_k = 0;  // unset fields keep the greedy defaults
  EXPECT_EQ(g4::generation_defaults(cfg).top_k, 0);
}
