// Greedy decoding with the host a step ahead (model/greedy_pipeline.h: each step's token read on
// the device from the previous step's argmax) gives the tokens of plain greedy steps, one sequence
// and three, and leaves the caches as plain steps do: after next(false), and after finish() when
// the caller stops with a step queued. On the reference and cpu backends (the defaults of
// Backend::queue_read) and on cuda where a device is present. Fixture: dense-q4g64
// (G4_FIXTURE_DIR overrides tests/fixtures/generated).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "model_test_util.h"
#include "model/greedy_pipeline.h"

namespace g4 {
namespace {

struct Seqs {
  std::vector<std::unique_ptr<KvCache>> caches;
  std::vector<KvCache*> ptrs() const {
    std::vector<KvCache*> p;
    for (const auto& c : caches) p.push_back(c.get());
    return p;
  }
};

// n sequences with prompts of different lengths, prefilled; returns each one's first token.
std::vector<int32_t> prefill(Model& m, ActPrecision P, int n, Seqs& s) {
  const int V = m.config().vocab;
  std::vector<int32_t> first;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> prompt;
    for (int t = 0; t < 4 + 3 * i; ++t) prompt.push_back(2 + (i * 131 + t * 37) % (V - 3));
    s.caches.push_back(m.new_cache());
    int32_t tok = 0;
    m.forward({SeqInput{s.caches.back().get(), prompt.data(), int(prompt.size()), false}}, P, nullptr, &tok);
    first.push_back(tok);
  }
  return first;
}

// `steps` plain greedy steps of all sequences from tokens `in`: the tokens they give, step by step.
std::vector<std::vector<int32_t>> plain_steps(Model& m, ActPrecision P, Seqs& s, std::vector<int32_t> in, int steps) {
  std::vector<std::vector<int32_t>> out;
  for (int k = 0; k < steps; ++k) {
    std::vector<SeqInput> batch;
    for (size_t i = 0; i < in.size(); ++i) batch.push_back(SeqInput{s.caches[i].get(), &in[i], 1, false});
    std::vector<int32_t> next(in.size());
    m.forward(batch, P, nullptr, next.data());
    out.push_back(next);
    in = next;
  }
  return out;
}

void pipeline_matches_plain_steps(const std::string& backend, int n) {
  std::string skip;
  const auto model = test::fixture_model("dense-q4g64", backend, &skip);
  if (!model && !skip.empty()) GTEST_SKIP() << skip;
  if (!model) return;
  Model& m = *model;
  const ActPrecision P = backend == "cuda" ? ActPrecision::BF16 : ActPrecision::F32;
  constexpr int kSteps = 6;
  Seqs plain, piped, stopped;
  const std::vector<int32_t> first = prefill(m, P, n, plain);
  ASSERT_EQ(prefill(m, P, n, piped), first);
  ASSERT_EQ(prefill(m, P, n, stopped), first);
  const auto want = plain_steps(m, P, plain, first, kSteps);

  {  // all steps through the pipeline, the last with nothing queued after it
    GreedyPipeline g(m, piped.ptrs(), P);
    g.start(first);
    for (int k = 0; k < kSteps; ++k) {
      EXPECT_EQ(g.next(k + 1 < kSteps), want[size_t(k)]) << backend << " step " << k;
      EXPECT_EQ(g.queued(), k + 1 < kSteps);
    }
  }
  for (int i = 0; i < n; ++i) EXPECT_EQ(piped.caches[size_t(i)]->size(), plain.caches[size_t(i)]->size()) << i;

  {  // stopped early with a step queued: finish() takes it back, and plain steps go on from there
    GreedyPipeline g(m, stopped.ptrs(), P);
    g.start(first);
    EXPECT_EQ(g.next(true), want[0]);
    EXPECT_EQ(g.next(true), want[1]);
    g.finish();
    EXPECT_FALSE(g.queued());
  }
  Seqs& s = stopped;
  const int fed = 2;  // first and want[0] are in the caches; want[1] is the caller's to feed
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(s.caches[size_t(i)]->size(), plain.caches[size_t(i)]->size() - (kSteps - fed)) << i;
  const auto rest = plain_steps(m, P, s, want[size_t(fed - 1)], kSteps - fed);
  for (int k = 0; k < kSteps - fed; ++k) EXPECT_EQ(rest[size_t(k)], want[size_t(fed + k)]) << backend << " step " << k;
}

class GreedyAhead : public ::testing::TestWithParam<const char*> {};

TEST_P(GreedyAhead, OneSequenceAsPlainSteps) { pipeline_matches_plain_steps(GetParam(), 1); }
TEST_P(GreedyAhead, ThreeSequencesAsPlainSteps) { pipeline_matches_plain_steps(GetParam(), 3); }

INSTANTIATE_TEST_SUITE_P(Backends, GreedyAhead, ::testing::Values("reference", "cpu", "cuda"));

}  // namespace
}  // namespace g4
