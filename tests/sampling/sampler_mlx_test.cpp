// Sampler chain vs mlx-lm recordings (tests/fixtures/sampler/sampler_cases.json, written by
// tools/record_sampler_cases.py from mlx_lm.sample_utils).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "fixture_util.h"
#include "sampling/sampler.h"

using g4::SamplingParams;
using nlohmann::json;

namespace {

const json& cases() {
  static json j = g4test::load_json("tests/fixtures/sampler/sampler_cases.json");
  return j;
}

std::string mask_of(const std::vector<float>& x) {
  std::string m(x.size(), '0');
  for (size_t i = 0; i < x.size(); ++i) m[i] = std::isfinite(x[i]) ? '1' : '0';
  return m;
}

// Masks must agree, except (when ties are allowed) at tokens whose value equals the smallest kept
// value of either mask: mlx argpartition does not specify which of equal values it keeps.
void expect_masks(const std::string& ours, const std::string& ref, const std::vector<float>& v,
                  bool allow_ties, const std::string& what) {
  ASSERT_EQ(ours.size(), ref.size()) << what;
  float lo = std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < v.size(); ++i) {
    if (ours[i] == '1' || ref[i] == '1') lo = std::min(lo, v[i]);
  }
  int n_ours = 0, n_ref = 0, bad = 0, tie_diffs = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    n_ours += ours[i] == '1';
    n_ref += ref[i] == '1';
    if (ours[i] == ref[i]) continue;
    if (allow_ties && v[i] == lo) {
      ++tie_diffs;
      continue;
    }
    ++bad;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " tokens differ";
  if (allow_ties) {
    EXPECT_EQ(n_ours, n_ref) << what;
  }
}

}  // namespace

TEST(SamplerMlx, FixtureLoads) {
  ASSERT_FALSE(cases().is_discarded()) << "run tools/record_sampler_cases.py";
  EXPECT_GE(cases()["processors"].size(), 10u);
  EXPECT_GE(cases()["filters"].size(), 25u);
  EXPECT_GE(cases()["chains"].size(), 10u);
}

TEST(SamplerMlx, LogitsProcessorsMatch) {
  for (auto& c : cases()["processors"]) {
    int V = c["V"];
    auto x = g4test::b64_floats(c["logits"]);
    auto want = g4test::b64_floats(c["expected"]);
    ASSERT_EQ(int(x.size()), V);
    SamplingParams p;
    for (auto& b : c["logit_bias"]) p.logit_bias.emplace_back(int(b[0]), float(b[1]));
    p.repetition_penalty = c["repetition_penalty"];
    p.repetition_context_size = c["repetition_context_size"];
    p.presence_penalty = c["presence_penalty"];
    p.presence_context_size = c["presence_context_size"];
    p.frequency_penalty = c["frequency_penalty"];
    p.frequency_context_size = c["frequency_context_size"];
    std::vector<int> hist = c["history"];
    g4::apply_logits_processors(p, x.data(), V, hist);
    int changed = 0;
    auto x0 = g4test::b64_floats(c["logits"]);
    for (int i = 0; i < V; ++i) {
      EXPECT_NEAR(x[i], want[i], 1e-5f * std::max(1.f, std::fabs(want[i]))) << "token " << i;
      changed += x0[i] != want[i];
    }
    if (!hist.empty() || !p.logit_bias.empty()) {
      EXPECT_GT(changed, 0);
    }
  }
}

TEST(SamplerMlx, LogSoftmaxMatches) {
  for (auto& c : cases()["filters"]) {
    auto x = g4test::b64_floats(c["logits"]);
    auto want = g4test::b64_floats(c["logprobs"]);
    g4::log_softmax_inplace(x.data(), int(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      if (std::isinf(want[i])) {
        EXPECT_EQ(x[i], want[i]);
      } else {
        EXPECT_NEAR(x[i], want[i], 2e-5f * std::max(1.f, std::fabs(want[i])));
      }
    }
  }
}

TEST(SamplerMlx, ReferenceFiltersMatch) {
  int n = 0;
  for (auto& c : cases()["filters"]) {
    int V = c["V"];
    auto lp = g4test::b64_floats(c["logprobs"]);  // exactly mlx's inputs
    auto v = lp;
    std::string f = c["filter"];
    bool ties = false;
    if (f == "top_p") {
      g4::ref_apply_top_p(lp.data(), V, c["top_p"]);
    } else if (f == "min_p" || f == "min_p_keep") {
      g4::ref_apply_min_p(lp.data(), V, c["min_p"], c["min_tokens_to_keep"]);
      ties = int(c["min_tokens_to_keep"]) > 1;
    } else if (f == "top_k") {
      g4::ref_apply_top_k(lp.data(), V, c["top_k"]);
      ties = true;
    } else {
      std::vector<int> sp = c["xtc_special_tokens"];
      g4::ref_apply_xtc(lp.data(), V, 1.f, c["xtc_threshold"], sp, 0.5f);
    }
    expect_masks(mask_of(lp), c["kept"], v, ties, f + " case " + std::to_string(n));
    ++n;
  }
}

// The fast Sampler path (candidate lists, partial sorts) must keep exactly what mlx-lm's chain
// keeps (top_p -> min_p -> top_k), starting from raw logits.
TEST(SamplerMlx, FastChainMatches) {
  int n = 0;
  for (auto& c : cases()["chains"]) {
    int V = c["V"];
    auto x = g4test::b64_floats(c["logits"]);
    SamplingParams p;
    p.temperature = 1.f;
    p.top_p = c["top_p"];
    p.min_p = c["min_p"];
    p.min_tokens_to_keep = c["min_tokens_to_keep"];
    p.top_k = c["top_k"];
    p.seed = 7;
    p.has_seed = true;
    g4::Sampler s(p, V);
    int tok = s.sample(x.data(), {});
    std::string ours(V, '0');
    if (s.last_all_survived()) {
      for (int i = 0; i < V; ++i) ours[i] = std::isfinite(x[i]) ? '1' : '0';
    } else {
      for (auto& [lp, id] : s.last_candidates()) {
        if (std::isfinite(lp)) ours[id] = '1';
      }
    }
    std::string ref = c["kept"];
    expect_masks(ours, ref, x, true, "chain case " + std::to_string(n));
    EXPECT_EQ(ref[tok], '1') << "sampled a removed token, case " << n;
    ++n;
  }
}

TEST(SamplerMlx, GreedyMatchesArgmax) {
  for (auto& c : cases()["greedy"]) {
    int V = c["V"];
    auto x = g4test::b64_floats(c["logits"]);
    auto y = x;
    SamplingParams p;  // temperature 0
    g4::Sampler s(p, V);
    EXPECT_EQ(s.sample(x.data(), {}), int(c["argmax"]));
    SamplingParams k1;
    k1.temperature = 0.8f;
    k1.top_k = 1;
    k1.has_seed = true;
    g4::Sampler s1(k1, V);
    EXPECT_EQ(s1.sample(y.data(), {}), int(c["argmax"]));
  }
}

// Each recorded single filter, run through the fast Sampler with only that filter enabled.
TEST(SamplerMlx, FastSingleFiltersMatch) {
  int n = 0;
  for (auto& c : cases()["filters"]) {
    int V = c["V"];
    auto x = g4test::b64_floats(c["logits"]);
    auto v = g4test::b64_floats(c["logprobs"]);
    SamplingParams p;
    p.temperature = 1.f;
    p.has_seed = true;
    p.seed = uint64_t(n);
    std::string f = c["filter"];
    bool ties = false;
    if (f == "top_p") {
      p.top_p = c["top_p"];
    } else if (f == "min_p" || f == "min_p_keep") {
      p.min_p = c["min_p"];
      p.min_tokens_to_keep = c["min_tokens_to_keep"];
      ties = p.min_tokens_to_keep > 1;
    } else if (f == "top_k") {
      p.top_k = c["top_k"];
      ties = true;
    } else {
      p.xtc_probability = 1.f;  // coin in [0, 1) is always <= 1: always applied, as recorded
      p.xtc_threshold = c["xtc_threshold"];
      p.xtc_special_tokens = c["xtc_special_tokens"].get<std::vector<int>>();
    }
    g4::Sampler s(p, V);
    int tok = s.sample(x.data(), {});
    std::string ours(V, '0');
    if (s.last_all_survived()) {
      for (int i = 0; i < V; ++i) ours[i] = std::isfinite(x[i]) ? '1' : '0';
    } else {
      for (auto& [lp, id] : s.last_candidates()) {
        if (std::isfinite(lp)) ours[id] = '1';
      }
    }
    std::string ref = c["kept"];
    expect_masks(ours, ref, v, ties, "fast " + f + " case " + std::to_string(n));
    EXPECT_EQ(ref[tok], '1') << f << " case " << n;
    ++n;
  }
}
