// The whole model split over 2 and 4 ranks (parallel/tp_model.h: one thread per rank, the
// in-process communicator) against the same model on one rank, on the mlx-lm fixtures of every
// architecture (dense K=V, E-style with per-layer inputs and KV sharing, routed experts) and format
// (bf16, MLX 4-bit g64 and 8-bit g32, mixed precision, HF names): a prompt scored at every position,
// then greedy decode steps, in f32, through the group's leader used as one model. Contract: within
// 1e-5 of the single rank's logits times max(1, max |logit|) (the partial sums add in another order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "io/model_dir.h"
#include "model/kv_pool.h"
#include "model/model.h"
#include "parallel/tp_model.h"
#include "parallel/tp_source.h"
#include "../model/model_test_util.h"
#include "tp_model_test_util.h"

namespace g4 {
namespace {
namespace fs = std::filesystem;
using namespace tp_test;  // NOLINT: the group tests' helpers

class TensorParallelModel : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(TensorParallelModel, RanksGiveTheSingleRankLogits) {
  const auto [fixture, ranks] = GetParam();
  const fs::path dir = test::fixture_root() / fixture;
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " missing (make fixtures)";
  auto om = open_model(dir.string());
  ASSERT_TRUE(om) << om.message();
  auto one = build_model(om.value(), "cpu");
  ASSERT_TRUE(one) << one.message();
  const int V = one.value()->config().vocab;
  std::vector<int32_t> prompt;
  for (int t = 0; t < 13; ++t) prompt.push_back(2 + (t * 89 + 7) % (V - 3));
  std::vector<int32_t> ref_picked;
  const std::vector<float> ref = score(*one.value(), prompt, &ref_picked);

  auto leader = build_tp_model(om.value(), "cpu", ranks_opt(ranks));
  ASSERT_TRUE(leader) << leader.message();
  ASSERT_EQ(leader.value()->ranks(), ranks);
  std::vector<int32_t> picked;
  const std::vector<float> got = score(*leader.value(), prompt, &picked);

  const Diff d = compare(ref, got);
  RecordProperty("max_abs_diff", std::to_string(d.max_diff));
  std::printf("%s, %d ranks: max |logit - single rank| %.3g (max |logit| %.3g)\n", fixture.c_str(), ranks,
              double(d.max_diff), double(d.max_ref));
  EXPECT_TRUE(d.within_contract());
  EXPECT_EQ(picked, ref_picked);
}

// The group as one model in the engine's uses: several sequences in one batch (a KV pool's blocks
// on every rank), a prefix shared by copy_from and truncate, and the caches' state saved and read
// back: the same logits as one rank within the contract above.
TEST(TensorParallelModelCaches, PoolCopyTruncateAndStateFollowEveryRank) {
  const fs::path dir = test::fixture_root() / "estyle-q4g64";
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " missing (make fixtures)";
  auto om = open_model(dir.string());
  ASSERT_TRUE(om) << om.message();
  auto one = build_model(om.value(), "cpu");
  auto two = build_tp_model(om.value(), "cpu", ranks_opt(2));
  ASSERT_TRUE(one && two) << one.message() << two.message();
  const int V = one.value()->config().vocab;
  auto run = [&](Model& m) {
    m.set_kv_pool(std::make_shared<KvPool>(m.config(), m.backend(), 16, std::array<int64_t, 2>{64, 64}, 256));
    std::vector<int32_t> a = {2, 17, 40, 61, 99, 120, 7, 8, 9}, b = {2, 300, 301, 5};
    auto ca = m.new_cache(), cb = m.new_cache();
    std::vector<float> out(size_t(V) * 4);
    m.forward({SeqInput{ca.get(), a.data(), int(a.size()), false}, SeqInput{cb.get(), b.data(), int(b.size()), false}},
              ActPrecision::F32, out.data());
    auto cc = m.new_cache();  // a's first 5 tokens, then another continuation
    cc->copy_from(*ca);
    EXPECT_TRUE(cc->truncate(5));
    const int32_t next[2] = {77, 78};
    m.forward({SeqInput{cc.get(), next, 2, false}}, ActPrecision::F32, out.data() + 2 * size_t(V));
    auto cd = m.new_cache();  // b's cache through its saved state
    const std::vector<uint8_t> state = cb->save_state();
    EXPECT_TRUE(cd->load_state(state.data(), state.size()));
    const int32_t t = 55;
    m.forward({SeqInput{cd.get(), &t, 1, false}}, ActPrecision::F32, out.data() + 3 * size_t(V));
    return out;
  };
  const Diff d = compare(run(*one.value()), run(*two.value()));
  EXPECT_TRUE(d.within_contract()) << d.max_diff << " at max |logit| " << d.max_ref;
}

// LoRA adapters split as their projections (parallel/tp_lora.h): the model's own adapter, and
// per-sequence adapters beside a sequence without one in the same batch, give one rank's logits.
TEST(TensorParallelModelAdapters, ShardedAdaptersGiveTheSingleRankLogits) {
  for (const char* name : {"dense-q4g64", "estyle-q4g64"}) {
    SCOPED_TRACE(name);
    const fs::path dir = test::fixture_root() / name, lora = test::fixture_root() / (std::string(name) + "-lora");
    if (!fs::exists(lora / "adapters.safetensors")) GTEST_SKIP() << lora << " missing (make fixtures)";
    auto om = open_model(dir.string());
    ASSERT_TRUE(om) << om.message();
    for (int ranks : {2, 4}) {
      auto one = build_model(om.value(), "cpu");
      auto group = build_tp_model(om.value(), "cpu", ranks_opt(ranks));
      ASSERT_TRUE(one && group) << one.message() << group.message();
      const int V = one.value()->config().vocab;
      auto run = [&](Model& m) {
        auto ad = m.load_adapter(lora.string());
        EXPECT_TRUE(ad) << ad.message();
        std::vector<int32_t> a = {2, 17, 40, 61, 99, 120, 7}, b = {2, 300, 301, 5, 9};
        std::vector<float> out(size_t(V) * 2);
        auto ca = m.new_cache(), cb = m.new_cache();
        SeqInput with{ca.get(), a.data(), int(a.size()), false};
        with.adapter = ad.value().get();
        m.forward({with, SeqInput{cb.get(), b.data(), int(b.size()), false}}, ActPrecision::F32, out.data());
        m.set_adapter(std::move(ad).value());  // the model's own adapter, then on every row
        auto cc = m.new_cache();
        std::vector<float> own(size_t(V) * size_t(a.size()));
        m.forward({SeqInput{cc.get(), a.data(), int(a.size()), true}}, ActPrecision::F32, own.data());
        out.insert(out.end(), own.begin(), own.end());
        return out;
      };
      const Diff d = compare(run(*one.value()), run(*group.value()));
      std::printf("%s + adapter, %d ranks: max |logit - single rank| %.3g (max |logit| %.3g)\n", name, ranks,
                  double(d.max_diff), double(d.max_ref));
      EXPECT_TRUE(d.within_contract());
    }
  }
}

// What does not split is refused before anything loads, naming it; so is a backend without a
// communicator; the rank-local config holds the rank's heads and MLP width.
TEST(TensorParallelModelRefusals, NameWhatDoesNotSplit) {
  const fs::path dir = test::fixture_root() / "dense-q4g64";
  if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " missing (make fixtures)";
  auto om = open_model(dir.string());
  ASSERT_TRUE(om) << om.message();
  auto three = build_tp_model(om.value(), "cpu", ranks_opt(3));
  ASSERT_FALSE(three);
  EXPECT_EQ(three.message(), "tensor parallel over 3 ranks: the model's 4 query heads do not split evenly");
  auto ggml = build_tp_model(om.value(), "ggml", ranks_opt(2));
  ASSERT_FALSE(ggml);
  EXPECT_NE(ggml.message().find("not 'ggml'"), std::string::npos) << ggml.message();

  auto src = ShardedWeightSource::make(om.value().weights, om.value().config, 1, 2);
  ASSERT_TRUE(src) << src.message();
  const ModelConfig& g = om.value().config;
  const ModelConfig& c = src.value()->config();
  EXPECT_EQ(c.n_heads, g.n_heads / 2);
  for (size_t l = 0; l < g.layers.size(); ++l) {
    const LayerSpec &gl = g.layers[l], &cl = c.layers[l];
    EXPECT_EQ(cl.n_kv_heads, gl.n_kv_heads >= 2 ? gl.n_kv_heads / 2 : 1) << "layer " << l;
    EXPECT_EQ(cl.mlp_width, gl.mlp_width / 2) << "layer " << l;
  }
  EXPECT_NE(src.value()->describe().find("tensor-parallel rank 1 of 2"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, TensorParallelModel,
    ::testing::Combine(::testing::Values("dense-bf16", "dense-q4g64", "dense-q8g32", "dense-mixed", "estyle-bf16",
                                         "estyle-q4g64", "estyle-mixed", "estyle-hf", "moe-bf16", "moe-q4g64",
                                         "moe-q8g32", "moe-mixed", "moe-hf"),
                       ::testing::Values(2, 4)),
    [](const auto& info) {
      std::string n = std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "ranks";
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

}  // namespace
}  // namespace g4

namespace g4 {
namespace {

// How a group is placed and which collectives it takes (plan_tp_group), and what is refused.
TEST(TensorParallelPlan, PlacesRanksAndPicksCollectives) {
  using C = BackendOptions::Collectives;
  BackendOptions o = ranks_opt(2);
  auto host = plan_tp_group("cpu", o);
  ASSERT_TRUE(host) << host.message();
  EXPECT_FALSE(host.value().nccl);
  EXPECT_EQ(host.value().devices, (std::vector<int>{-1, -1}));

  auto gpus = plan_tp_group("cuda", o);  // GPUs 0..N-1, distinct: NCCL
  ASSERT_TRUE(gpus) << gpus.message();
  EXPECT_TRUE(gpus.value().nccl);
  EXPECT_EQ(gpus.value().devices, (std::vector<int>{0, 1}));

  o.devices = {0, 0};  // ranks sharing a GPU: the host group
  auto shared = plan_tp_group("cuda", o);
  ASSERT_TRUE(shared) << shared.message();
  EXPECT_FALSE(shared.value().nccl);
  EXPECT_EQ(shared.value().devices, (std::vector<int>{0, 0}));

  BackendOptions one = ranks_opt(1);
  one.collectives = C::Nccl;  // the NCCL path with one rank
  auto nccl1 = plan_tp_group("cuda", one);
  ASSERT_TRUE(nccl1) << nccl1.message();
  EXPECT_TRUE(nccl1.value().nccl);
  EXPECT_TRUE(uses_tp_group(one));
  EXPECT_FALSE(uses_tp_group(ranks_opt(1)));

  auto refused = [](const std::string& be, BackendOptions opt) {
    auto p = plan_tp_group(be, opt);
    EXPECT_FALSE(p);
    return p ? std::string() : p.message();
  };
  BackendOptions listed = ranks_opt(2);
  listed.devices = {0, 1};
  EXPECT_EQ(refused("cpu", listed), "--devices places ranks on GPUs: it needs --backend cuda");
  BackendOptions nccl_cpu = ranks_opt(2);
  nccl_cpu.collectives = C::Nccl;
  EXPECT_EQ(refused("reference", nccl_cpu), "--collectives nccl needs --backend cuda");
  BackendOptions short_list = ranks_opt(4);
  short_list.devices = {0, 1};
  EXPECT_EQ(refused("cuda", short_list), "--devices lists 2 GPUs for --tensor-parallel 4 (one per rank)");
  BackendOptions host1 = ranks_opt(1);
  host1.collectives = C::Host;
  host1.devices = {0};
  EXPECT_NE(refused("cuda", host1).find("plain model"), std::string::npos);
}

}  // namespace
}  // namespace g4

namespace g4 {
namespace {

// Greedy and top-k sampling outputs without the logits: each vocabulary shard's best candidates
// are gathered instead of [rows, vocab] (Model::shard_pick_k); the same argmax as one rank, the same
// top-k ids, their values and the row's log-sum-exp within the logits' contract.
TEST(TensorParallelModelPicks, ArgmaxAndTopKFromGatheredCandidates) {
  for (const char* fixture : {"dense-q4g64", "moe-q8g32"}) {
    const fs::path dir = test::fixture_root() / fixture;
    if (!fs::exists(dir / "config.json")) GTEST_SKIP() << dir << " missing (make fixtures)";
    auto om = open_model(dir.string());
    ASSERT_TRUE(om) << om.message();
    auto one = build_model(om.value(), "cpu");
    ASSERT_TRUE(one) << one.message();
    auto group = build_tp_model(om.value(), "cpu", ranks_opt(4));
    ASSERT_TRUE(group) << group.message();
    const int V = one.value()->config().vocab, L = 9, K = 5;
    std::vector<int32_t> prompt;
    for (int t = 0; t < L; ++t) prompt.push_back(2 + (t * 131 + 5) % (V - 3));
    struct Out {
      std::vector<int32_t> argmax, ids;
      std::vector<float> vals, lse;
    };
    auto run = [&](Model& m) {
      Out o;
      o.argmax.resize(L);
      o.ids.resize(size_t(L) * K);
      o.vals.resize(size_t(L) * K);
      o.lse.resize(L);
      Model::TopK tk{K, o.vals.data(), o.ids.data(), o.lse.data()};
      auto c1 = m.new_cache();
      m.forward({SeqInput{c1.get(), prompt.data(), L, true}}, ActPrecision::F32, nullptr, o.argmax.data());
      auto c2 = m.new_cache();
      m.forward({SeqInput{c2.get(), prompt.data(), L, true}}, ActPrecision::F32, nullptr, nullptr, &tk);
      for (int i = 0; i < L; ++i) {  // top k in no particular order: sort each row by id
        std::vector<std::pair<int32_t, float>> row;
        for (int j = 0; j < K; ++j) row.push_back({o.ids[size_t(i * K + j)], o.vals[size_t(i * K + j)]});
        std::sort(row.begin(), row.end());
        for (int j = 0; j < K; ++j) {
          o.ids[size_t(i * K + j)] = row[size_t(j)].first;
          o.vals[size_t(i * K + j)] = row[size_t(j)].second;
        }
      }
      return o;
    };
    const Out ref = run(*one.value()), got = run(*group.value());
    EXPECT_EQ(got.argmax, ref.argmax) << fixture;
    EXPECT_EQ(got.ids, ref.ids) << fixture;
    const Diff dv = compare(ref.vals, got.vals), dl = compare(ref.lse, got.lse);
    const float max_diff = std::max(dv.max_diff, dl.max_diff);
    std::printf("%s, 4 ranks, gathered picks: max |value or lse - single rank| %.3g (max |value| %.3g)\n", fixture,
                double(max_diff), double(dv.max_ref));
    EXPECT_LE(max_diff, 1e-5f * std::max(1.f, dv.max_ref)) << fixture;
  }
}

}  // namespace
}  // namespace g4
