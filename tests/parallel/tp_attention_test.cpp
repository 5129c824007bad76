// Attention sharded by heads on 2 and 4 ranks (threads, each with its own backend and KV cache):
// q, k and v column-parallel in units of head_dim (rank r holds q heads [r*H/n, (r+1)*H/n) and
// the KV heads they read under GQA), RoPE, kv_write and attention on the local heads, o_proj
// row-parallel (shard_cols in units of head_dim) + all_reduce_sum. Checked against the same ops
// on the unsharded weights: every rank's output is the same bits, within 1e-5 of the reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "parallel/inproc_communicator.h"
#include "parallel/shard.h"
#include "parallel_test_util.h"

namespace g4 {
namespace {

using test::TpFormat;

constexpr int kD = 256;  // hidden
constexpr int kHeadDim = 256;
constexpr int kH = 8, kHk = 4;  // GQA: 2 query heads per KV head
constexpr int kM = 5;           // one sequence of 5 tokens at positions 0..4

struct AttnWeights {
  WeightView q, k, v, o;
};

// out [kM, o.rows] = o_proj(attention(rope(x·qᵀ), cache of rope(x·kᵀ), x·vᵀ)) over q.rows / kHeadDim
// heads (k.rows / kHeadDim KV heads).
std::vector<float> attn_forward(Backend& be, const std::vector<float>& x, const AttnWeights& w) {
  const int H = int(w.q.rows / kHeadDim), Hk = int(w.k.rows / kHeadDim);
  std::vector<float> q(size_t(kM) * size_t(w.q.rows)), k(size_t(kM) * size_t(w.k.rows)), v(k.size());
  be.matmul(x.data(), kM, w.q, ActPrecision::F32, q.data());
  be.matmul(x.data(), kM, w.k, ActPrecision::F32, k.data());
  be.matmul(x.data(), kM, w.v, ActPrecision::F32, v.data());
  const RopeTable rope = make_rope_table(RopeSpec{}, kHeadDim);
  be.rope(q.data(), kM, H, kHeadDim, 0, rope, ActPrecision::F32);
  be.rope(k.data(), kM, Hk, kHeadDim, 0, rope, ActPrecision::F32);
  std::vector<float> kc(k.size()), vc(v.size());
  std::vector<int32_t> pos(size_t(kM), -1);
  AttnSeq s;
  s.n = kM;
  s.kv.k = kc.data();
  s.kv.v = vc.data();
  s.kv.pos = pos.data();
  s.kv.capacity = kM;
  s.kv.n_kv_heads = Hk;
  s.kv.head_dim = kHeadDim;
  be.kv_write(s, k.data(), v.data());
  std::vector<float> att(q.size()), out(size_t(kM) * size_t(w.o.rows));
  be.attention(q.data(), H, {s}, 1.f / std::sqrt(float(kHeadDim)), ActPrecision::F32, att.data());
  be.matmul(att.data(), kM, w.o, ActPrecision::F32, out.data());
  return out;
}

using AttnParam = std::tuple<std::string, TpFormat, int>;  // backend, format, ranks

class TpAttentionTest : public ::testing::TestWithParam<AttnParam> {};

TEST_P(TpAttentionTest, HeadShardedEqualsSingleRank) {
  const auto [kind, fmt, n] = GetParam();
  const test::OwnedWeight q = test::random_weight(fmt, kH * kHeadDim, kD, 31);
  const test::OwnedWeight k = test::random_weight(fmt, kHk * kHeadDim, kD, 32);
  const test::OwnedWeight v = test::random_weight(fmt, kHk * kHeadDim, kD, 33);
  const test::OwnedWeight o = test::random_weight(fmt, kD, kH * kHeadDim, 34);
  std::vector<float> x = test::random_x(int64_t(kM) * kD, 7);
  for (auto& e : x) e *= 0.1f;  // keeps the softmax away from one-hot on the quantized formats
  auto single_be = test::backend_of(kind);
  const std::vector<float> ref = attn_forward(*single_be, x, {q.view, k.view, v.view, o.view});

  std::vector<AttnWeights> views;
  std::vector<PackedWeight> o_shards;
  for (int r = 0; r < n; ++r) {
    auto qs = shard_rows(q.view, r, n, "attn_q", kHeadDim);
    auto ks = shard_rows(k.view, r, n, "attn_k", kHeadDim);
    auto vs = shard_rows(v.view, r, n, "attn_v", kHeadDim);
    auto os = shard_cols(o.view, r, n, "attn_output", kHeadDim);
    ASSERT_TRUE(qs.is_ok()) << qs.message();
    ASSERT_TRUE(ks.is_ok()) << ks.message();
    ASSERT_TRUE(vs.is_ok()) << vs.message();
    ASSERT_TRUE(os.is_ok()) << os.message();
    ASSERT_EQ(qs->rows, kH / n * kHeadDim);
    ASSERT_EQ(ks->rows, kHk / n * kHeadDim);
    o_shards.push_back(std::move(os).value());
    views.push_back({*qs, *ks, *vs, o_shards.back().view()});
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  auto group = make_inproc_group(n);
  test::run_ranks(group, [&](Communicator& c) {
    auto be = test::backend_of(kind);
    std::vector<float> y = attn_forward(*be, x, views[size_t(c.rank())]);
    c.all_reduce_sum(y.data(), y.size(), DType::F32);
    out[size_t(c.rank())] = std::move(y);
  });
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(std::memcmp(out[size_t(r)].data(), out[0].data(), out[0].size() * 4), 0) << "rank " << r;
  EXPECT_LE(test::rel_err(out[0], ref), 1e-5);
  EXPECT_GT(test::rel_err(attn_forward(*single_be, x, views[0]), ref), 1e-2);  // one rank's part alone
}

std::string attn_name(const ::testing::TestParamInfo<AttnParam>& p) {
  return test::tp_case_name(std::get<0>(p.param), std::get<1>(p.param), std::get<2>(p.param));
}

INSTANTIATE_TEST_SUITE_P(Parallel, TpAttentionTest,
                         ::testing::Combine(::testing::Values("cpu", "reference"),
                                            ::testing::Values(TpFormat::F32, TpFormat::BF16, TpFormat::Q8_0,
                                                              TpFormat::Q4_K, TpFormat::Mlx4g64),
                                            ::testing::Values(2, 4)),
                         attn_name);

}  // namespace
}  // namespace g4
