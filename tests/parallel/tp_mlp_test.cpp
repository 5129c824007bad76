// A tensor-parallel Gemma MLP, y = down(gelu_tanh(gate x) * up x), on 2 and 4 ranks (threads,
// each with its own backend): gate and up column-parallel (shard_rows, in units of down's column
// block so that each rank's slice of the intermediate dimension is its down columns), down
// row-parallel (shard_cols) + all_reduce_sum. Checked against the same ops on the unsharded
// weights on one backend: every rank's y is the same bits and within 1e-5 (max |Δ| / max |ref|).
#include <gtest/gtest.h>

#include <cstring>

#include "parallel/inproc_communicator.h"
#include "parallel/shard.h"
#include "parallel_test_util.h"

namespace g4 {
namespace {

using test::TpFormat;

constexpr int64_t kD = 256;        // hidden (a whole Q4_K super-block)
constexpr int64_t kI = 5 * 256;    // intermediate: 5 super-blocks, so 2 and 4 ranks split unevenly
constexpr double kTol = 1e-5;

struct Mlp {
  test::OwnedWeight gate, up, down;
};

Mlp make_mlp(TpFormat f) {
  return {test::random_weight(f, kI, kD, 21), test::random_weight(f, kI, kD, 22), test::random_weight(f, kD, kI, 23)};
}

// y [M, down.rows] = down(gelu_mul(x·gateᵀ, x·upᵀ)); gate and up have the same rows.
std::vector<float> mlp_forward(Backend& be, const std::vector<float>& x, int M, const WeightView& gate,
                               const WeightView& up, const WeightView& down) {
  std::vector<float> g(size_t(M * gate.rows)), u(g.size()), h(g.size()), y(size_t(M * down.rows));
  be.matmul(x.data(), M, gate, ActPrecision::F32, g.data());
  be.matmul(x.data(), M, up, ActPrecision::F32, u.data());
  be.gelu_mul(g.data(), u.data(), h.size(), ActPrecision::F32, h.data());
  be.matmul(h.data(), M, down, ActPrecision::F32, y.data());
  return y;
}

// One rank's shard of the MLP.
struct RankMlp {
  WeightView gate, up;
  PackedWeight down;
};

using MlpParam = std::tuple<std::string, TpFormat, int, int>;  // backend, format, ranks, rows M

class TpMlpTest : public ::testing::TestWithParam<MlpParam> {};

TEST_P(TpMlpTest, ShardedEqualsSingleRank) {
  const auto [kind, fmt, n, M] = GetParam();
  const Mlp w = make_mlp(fmt);
  const std::vector<float> x = test::random_x(int64_t(M) * kD, 5);
  auto single_be = test::backend_of(kind);
  const std::vector<float> ref = mlp_forward(*single_be, x, M, w.gate.view, w.up.view, w.down.view);

  const int64_t unit = col_split_unit(w.down.view);
  std::vector<RankMlp> shards;
  for (int r = 0; r < n; ++r) {
    auto gate = shard_rows(w.gate.view, r, n, "ffn_gate", unit);
    auto up = shard_rows(w.up.view, r, n, "ffn_up", unit);
    auto down = shard_cols(w.down.view, r, n, "ffn_down");
    ASSERT_TRUE(gate.is_ok()) << gate.message();
    ASSERT_TRUE(up.is_ok()) << up.message();
    ASSERT_TRUE(down.is_ok()) << down.message();
    shards.push_back({*gate, *up, std::move(down).value()});
  }
  std::vector<std::vector<float>> out(static_cast<size_t>(n));
  auto group = make_inproc_group(n);
  test::run_ranks(group, [&](Communicator& c) {
    const RankMlp& s = shards[size_t(c.rank())];
    auto be = test::backend_of(kind);
    std::vector<float> y = mlp_forward(*be, x, M, s.gate, s.up, s.down.view());
    c.all_reduce_sum(y.data(), y.size(), DType::F32);
    out[size_t(c.rank())] = std::move(y);
  });
  for (int r = 1; r < n; ++r)
    EXPECT_EQ(std::memcmp(out[size_t(r)].data(), out[0].data(), out[0].size() * 4), 0) << "rank " << r;
  EXPECT_LE(test::rel_err(out[0], ref), kTol);
  // Not vacuous: a rank's partial sum alone is far from the full product.
  EXPECT_GT(test::rel_err(mlp_forward(*single_be, x, M, shards[0].gate, shards[0].up, shards[0].down.view()), ref),
            1e-2);
}

std::string mlp_name(const ::testing::TestParamInfo<MlpParam>& p) {
  return test::tp_case_name(std::get<0>(p.param), std::get<1>(p.param), std::get<2>(p.param)) + "_M" +
         std::to_string(std::get<3>(p.param));
}

INSTANTIATE_TEST_SUITE_P(Parallel, TpMlpTest,
                         ::testing::Combine(::testing::Values("cpu", "reference"),
                                            ::testing::Values(TpFormat::F32, TpFormat::BF16, TpFormat::Q8_0,
                                                              TpFormat::Q4_K, TpFormat::Mlx4g64),
                                            ::testing::Values(2, 4), ::testing::Values(1, 5)),
                         mlp_name);

// gate|up stacked in one matrix (one matmul per rank), split part by part: same result.
TEST(TpMlp, StackedGateUpEqualsSingleRank) {
  for (TpFormat fmt : {TpFormat::Q4_K, TpFormat::Mlx4g64}) {
    SCOPED_TRACE(test::tp_format_name(fmt));
    const Mlp w = make_mlp(fmt);
    const test::OwnedWeight gu = test::stack_rows(w.gate.view, w.up.view);
    const int M = 3, n = 2;
    const std::vector<float> x = test::random_x(int64_t(M) * kD, 6);
    auto single_be = make_cpu_backend();
    const std::vector<float> ref = mlp_forward(*single_be, x, M, w.gate.view, w.up.view, w.down.view);
    std::vector<std::vector<float>> out(static_cast<size_t>(n));
    auto group = make_inproc_group(n);
    test::run_ranks(group, [&](Communicator& c) {
      auto be = make_cpu_backend();
      auto gate_up = shard_rows_stacked(gu.view, {kI, kI}, c.rank(), n, "ffn_gate_up", col_split_unit(w.down.view));
      auto down = shard_cols(w.down.view, c.rank(), n, "ffn_down");
      G4_CHECK(gate_up.is_ok() && down.is_ok());
      const int64_t Ir = gate_up->view().rows / 2;
      std::vector<float> gu_out(size_t(M * 2 * Ir)), g(size_t(M * Ir)), u(g.size()), h(g.size());
      be->matmul(x.data(), M, gate_up->view(), ActPrecision::F32, gu_out.data());
      be->copy_cols(gu_out.data(), M, int(2 * Ir), 0, int(Ir), g.data());
      be->copy_cols(gu_out.data(), M, int(2 * Ir), int(Ir), int(Ir), u.data());
      be->gelu_mul(g.data(), u.data(), h.size(), ActPrecision::F32, h.data());
      std::vector<float> y(size_t(M * kD));
      be->matmul(h.data(), M, down->view(), ActPrecision::F32, y.data());
      c.all_reduce_sum(y.data(), y.size(), DType::F32);
      out[size_t(c.rank())] = std::move(y);
    });
    EXPECT_EQ(out[0], out[1]);
    EXPECT_LE(test::rel_err(out[0], ref), kTol);
  }
}

}  // namespace
}  // namespace g4
