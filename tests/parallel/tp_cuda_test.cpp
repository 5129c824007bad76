// Tensor parallelism on the CUDA backend, against the single-rank CUDA model on the mlx-lm fixtures
// (f32 activations: `--dtype f32`, the parity path). Three groups:
//   - two ranks sharing GPU 0 through the in-process host group (the sharded forward, the device
//     place_cols and the host-staged collectives: runs on any one GPU);
//   - one rank through NCCL (`--tensor-parallel 1 --collectives nccl`: the NCCL collectives recorded
//     in the step and replayed from graphs, on one GPU);
//   - two ranks on GPUs 0 and 1 through NCCL (skipped on a machine with one GPU).
// MoE fixtures split by expert: another rank's experts are zero experts in the device tables.
// Contract: max |Δlogit| <= 1e-5 * max(1, max |logit|), as on the host (tp_model_test.cpp), and the
// same greedy tokens, also when the group gathers each shard's best candidate instead of the logits. Skips with the reason where there is no CUDA device, no libnccl or too few GPUs.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io/model_dir.h"
#include "model/model.h"
#include "parallel/tp_model.h"
#include "../model/model_test_util.h"
#include "tp_model_test_util.h"

namespace g4 {
namespace {
namespace fs = std::filesystem;
using namespace tp_test;  // NOLINT: the group tests' helpers

struct CudaGroup {
  const char* name;
  int ranks;
  std::vector<int> devices;
  BackendOptions::Collectives how;
};

class TensorParallelCuda : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

const CudaGroup kGroups[] = {
    {"host-shared-gpu", 2, {0, 0}, BackendOptions::Collectives::Host},
    {"nccl-1rank", 1, {0}, BackendOptions::Collectives::Nccl},
    {"nccl-2gpus", 2, {0, 1}, BackendOptions::Collectives::Nccl},
};

TEST_P(TensorParallelCuda, RanksGiveTheSingleRankLogits) {
  const auto [fixture, group_index] = GetParam();
  const CudaGroup& g = kGroups[group_index];
  const fs::path dir = test::fixture_root() / fixture;
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " missing (make fixtures)";
  auto om = open_model(dir.string());
  ASSERT_TRUE(om) << om.message();
  BackendOptions opt;
  opt.activations = DType::F32;
  auto one = build_model(om.value(), "cuda", opt);
  if (!one) GTEST_SKIP() << "no CUDA device: " << one.message();
  const int V = one.value()->config().vocab;
  std::vector<int32_t> prompt;
  for (int t = 0; t < 13; ++t) prompt.push_back(2 + (t * 89 + 7) % (V - 3));
  std::vector<int32_t> ref_picked;
  const std::vector<float> ref = score(*one.value(), prompt, &ref_picked);

  BackendOptions gopt = opt;
  gopt.tensor_parallel = g.ranks;
  gopt.devices = g.devices;
  gopt.collectives = g.how;
  auto group = build_tp_model(om.value(), "cuda", gopt);
  if (!group) {
    const std::string m = group.message();
    if (m.find("libnccl") != std::string::npos || m.find("CUDA device") != std::string::npos)
      GTEST_SKIP() << g.name << ": " << m;
    FAIL() << g.name << ": " << m;
  }
  ASSERT_EQ(group.value()->ranks(), g.ranks);
  std::vector<int32_t> picked;
  const std::vector<float> got = score(*group.value(), prompt, &picked);
  const Diff d = compare(ref, got);
  std::printf("%s, %s: max |logit - single rank| %.3g (max |logit| %.3g)\n", fixture.c_str(), g.name,
              double(d.max_diff), double(d.max_ref));
  EXPECT_TRUE(d.within_contract());
  EXPECT_EQ(picked, ref_picked);
  // Greedy outputs alone: the group gathers each shard's best candidate instead of the logits.
  auto argmax_of = [&](Model& m) {
    std::vector<int32_t> am(prompt.size());
    auto c = m.new_cache();
    m.forward({SeqInput{c.get(), prompt.data(), int(prompt.size()), true}}, ActPrecision::F32, nullptr, am.data());
    return am;
  };
  EXPECT_EQ(argmax_of(*group.value()), argmax_of(*one.value())) << "gathered picks";
  CudaStepCounts c;
  if (cuda_step_counts(group.value()->backend(), &c))
    std::printf("  leader's steps: %ld replayed, %ld captured, %ld direct\n", c.replayed, c.captured, c.direct);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelCuda,
                         ::testing::Combine(::testing::Values("dense-bf16", "dense-q4g64", "estyle-q4g64", "estyle-hf",
                                                              "moe-q4g64", "moe-mixed"),
                                            ::testing::Values(0, 1, 2)),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + kGroups[std::get<1>(info.param)].name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace g4
