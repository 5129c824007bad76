// The engine's decode steps queued ahead (runtime/engine_ahead.cpp) give the tokens of plain
// steps: greedy and seeded top-k sampling (sampling/top_draw.h's draw, made by Backend::draw_top),
// sequences that end at different lengths, at stop tokens (a queued step's token taken back out of
// the cache) and by cancellation from the event callback, a KV pool, and prompts that reuse the
// prefix cache's KV of sequences that ended with a step queued. On the reference and cpu backends
// (sampling where the logits are forced by G4_DEVICE_SAMPLING=1, steps queued by
// DecodeAhead::Always) and on cuda where a device is present. Fixture: dense-q4g64.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "../model/model_test_util.h"
#include "runtime/engine.h"

namespace g4 {
namespace {

using DA = EngineOptions::DecodeAhead;

struct Outcome {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::None;
  int cached = 0;  // prompt tokens whose KV came from the prefix cache
  bool operator==(const Outcome& o) const { return tokens == o.tokens && reason == o.reason && cached == o.cached; }
};

// Runs specs (all submitted at once) to their ends; cancel_after[i] > 0 cancels request i from its
// event callback once it has that many tokens.
std::vector<Outcome> run(Engine& e, const std::vector<GenerationSpec>& specs, std::vector<int> cancel_after = {}) {
  cancel_after.resize(specs.size(), 0);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Outcome> out(specs.size());
  size_t done = 0;
  std::map<uint64_t, size_t> which;
  std::unique_lock<std::mutex> lk(mu);
  for (size_t i = 0; i < specs.size(); ++i) {
    auto id = e.submit(specs[i], [&, i](const TokenEvent& ev) {
      std::lock_guard<std::mutex> g(mu);
      if (ev.token >= 0) out[i].tokens.push_back(ev.token);
      if (ev.token >= 0 && cancel_after[i] > 0 && int(out[i].tokens.size()) == cancel_after[i]) e.cancel(which.at(i));
      if (ev.done) {
        out[i].reason = ev.reason;
        out[i].cached = ev.cached_tokens;
        ++done;
        cv.notify_all();
      }
    });
    EXPECT_TRUE(bool(id)) << id.message();
    if (!id) return out;
    which[i] = id.value();
  }
  cv.wait(lk, [&] { return done == specs.size(); });
  return out;
}

GenerationSpec spec(int vocab, int seed, int prompt_len, int max_tokens) {
  GenerationSpec s;
  for (int t = 0; t < prompt_len; ++t) s.prompt.push_back(2 + (seed * 131 + t * 37) % (vocab - 3));
  s.max_tokens = max_tokens;
  return s;
}

SamplingParams sampled(uint64_t seed, int top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = seed;
  p.has_seed = true;
  return p;
}

// G4_DEVICE_SAMPLING=1 while it lives (sampling where the logits are on the host backends too).
struct DeviceSamplingEnv {
  DeviceSamplingEnv() { setenv("G4_DEVICE_SAMPLING", "1", 1); }
  ~DeviceSamplingEnv() { unsetenv("G4_DEVICE_SAMPLING"); }
};

void queued_steps_match_plain_steps(const std::string& backend) {
  const DeviceSamplingEnv env;
  std::string skip;
  const auto model = test::fixture_model("dense-q4g64", backend, &skip);
  if (!model) GTEST_SKIP() << skip;
  const int V = model->config().vocab;
  auto engine = [&](DA mode, size_t pool_bytes = 0, int parallel = 4) {
    EngineOptions o;
    o.parallel = parallel;
    o.decode_buckets = parallel > 8;  // steps of 9 or more rows padded to a bucket (Model::set_decode_padding)
    o.max_context = 256;
    o.decode_ahead = mode;
    o.kv_pool_bytes = pool_bytes;
    return std::make_unique<Engine>(*model, o);
  };
  const DA on = backend == "cuda" ? DA::Device : DA::Always;

  // Greedy and sampled sequences together, ending at different lengths.
  std::vector<GenerationSpec> mixed = {spec(V, 1, 5, 7), spec(V, 2, 9, 12), spec(V, 3, 3, 4), spec(V, 4, 6, 10)};
  mixed[1].sampling = sampled(11, 20, 0.9f, 0.f);
  mixed[2].sampling = sampled(12, 40, 1.f, 0.05f);
  mixed[3].sampling = sampled(13, 8, 0.7f, 0.1f);
  auto off_e = engine(DA::Off);
  const auto plain = run(*off_e, mixed);
  EXPECT_EQ(off_e->stats().ahead_steps, 0u);
  for (size_t i = 0; i < mixed.size(); ++i) {
    ASSERT_EQ(plain[i].tokens.size(), size_t(mixed[i].max_tokens)) << "request " << i;
    EXPECT_EQ(plain[i].reason, FinishReason::Length);
  }
  auto on_e = engine(on);
  EXPECT_EQ(run(*on_e, mixed), plain);
  EXPECT_GE(on_e->stats().ahead_steps, 8u) << "the steps were not queued ahead";
  EXPECT_EQ(run(*engine(on, size_t(8) << 20), mixed), plain) << "with a KV pool";

  // Ten sequences: decode steps padded to a bucket of 16 rows, the pad rows' tokens on the device too.
  std::vector<GenerationSpec> ten;
  for (int i = 0; i < 10; ++i) {
    ten.push_back(spec(V, 30 + i, 3 + i % 4, 6 + i % 5));
    if (i % 2) ten.back().sampling = sampled(40 + uint64_t(i), 16, 0.9f, 0.f);
  }
  auto ten_on = engine(on, 0, 10);
  EXPECT_EQ(run(*ten_on, ten), run(*engine(DA::Off, 0, 10), ten)) << "ten sequences, padded steps";
  EXPECT_GE(ten_on->stats().ahead_steps, 4u);

  // Stop tokens: each sequence stops at the token it gave 3 to 6 steps in, with a step queued
  // behind it; then prompts that extend each whole sequence reuse the prefix cache's KV.
  std::vector<GenerationSpec> stopping = mixed;
  for (size_t i = 0; i < stopping.size(); ++i) {
    stopping[i].max_tokens = 12;
    stopping[i].stop_ids = {plain[i].tokens[std::min<size_t>(3 + i, plain[i].tokens.size() - 1)]};
  }
  for (size_t pool : {size_t(0), size_t(8) << 20}) {
    auto off_e = engine(DA::Off, pool), on_e = engine(on, pool);
    const auto want = run(*off_e, stopping), got = run(*on_e, stopping);
    EXPECT_EQ(got, want) << "pool " << pool;
    for (const Outcome& o : want) EXPECT_EQ(o.reason, FinishReason::Stop);
    std::vector<GenerationSpec> more;
    for (size_t i = 0; i < stopping.size(); ++i) {
      GenerationSpec m = spec(V, 20 + int(i), 0, 6);
      m.prompt = stopping[i].prompt;
      m.prompt.insert(m.prompt.end(), want[i].tokens.begin(), want[i].tokens.end());
      m.prompt.push_back(7);
      m.sampling = stopping[i].sampling;
      more.push_back(m);
    }
    const auto more_want = run(*off_e, more);
    EXPECT_EQ(run(*on_e, more), more_want) << "prompts over the prefix cache's KV, pool " << pool;
    for (size_t i = 0; i < more.size(); ++i)  // the ended sequence's KV (all it fed: not its stop token) reused
      EXPECT_EQ(more_want[i].cached, int(stopping[i].prompt.size() + want[i].tokens.size()) - 1)
          << "request " << i << ", pool " << pool;
  }

  // Cancelled from the event callback after 2, 5 and 3 tokens; one runs to its end.
  std::vector<GenerationSpec> cancelled = mixed;
  const std::vector<int> after = {2, 5, 0, 3};
  const auto want = run(*engine(DA::Off), cancelled, after), got = run(*engine(on), cancelled, after);
  EXPECT_EQ(got, want);
  for (size_t i = 0; i < after.size(); ++i)
    if (after[i] > 0) {
      EXPECT_EQ(want[i].reason, FinishReason::Cancelled);
      EXPECT_EQ(want[i].tokens.size(), size_t(after[i]));
    }
}

TEST(EngineAhead, ReferenceQueuedStepsMatchPlainSteps) { queued_steps_match_plain_steps("reference"); }
TEST(EngineAhead, CpuQueuedStepsMatchPlainSteps) { queued_steps_match_plain_steps("cpu"); }
TEST(EngineAhead, CudaQueuedStepsMatchPlainSteps) { queued_steps_match_plain_steps("cuda"); }

}  // namespace
}  // namespace g4
