// Sharded weight views (parallel/shard.h): the split rule, exactness of row and column shards in
// every weight format (dequantized values equal to the unsharded matrix's, bit for bit), stacked
// projections split part by part, and the refusals with their documented messages.
#include <gtest/gtest.h>

#include <cstring>

#include "parallel/shard.h"
#include "parallel_test_util.h"
#include "quant/gguf_quant.h"
#include "quant/matmul.h"

namespace g4 {
namespace {

std::vector<float> dequant(const WeightView& w, int64_t r) {
  std::vector<float> out(size_t(w.cols));
  dequant_row(w, r, out.data());
  return out;
}

TEST(ShardRange, FirstRanksGetOneMoreUnitAndRangesTileTheDimension) {
  // 5 units of 256 over 2 / 3 / 4 ranks.
  const std::vector<std::vector<int64_t>> want_units = {{3, 2}, {2, 2, 1}, {2, 1, 1, 1}};
  for (int size = 2; size <= 4; ++size) {
    int64_t next = 0;
    for (int r = 0; r < size; ++r) {
      auto s = shard_range(1280, 256, r, size, "x");
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(s->begin, next) << "size " << size << " rank " << r;
      EXPECT_EQ(s->size(), want_units[size_t(size - 2)][size_t(r)] * 256) << "size " << size << " rank " << r;
      next = s->end;
    }
    EXPECT_EQ(next, 1280) << "size " << size;
  }
}

TEST(ShardRange, Refusals) {
  auto msg = [](Result<ShardRange> r) { return r.is_ok() ? std::string("ok") : r.message(); };
  EXPECT_EQ(msg(shard_range(512, 256, 0, 3, "w columns")), "w columns: 512 in units of 256 is 2 units, fewer than the 3 ranks");
  EXPECT_EQ(msg(shard_range(1000, 256, 0, 2, "w rows")), "w rows: 1000 is not a multiple of the split unit 256");
  EXPECT_EQ(msg(shard_range(1024, 256, 2, 2, "w rows")), "w rows: rank 2 is outside [0, 2)");
  EXPECT_EQ(msg(shard_range(1024, 0, 0, 2, "w rows")), "w rows: split unit 0 is not positive");
  EXPECT_EQ(msg(shard_range(1024, 1, 0, 0, "w rows")), "w rows: rank count 0 is not positive");
}

struct FormatCase {
  const char* label;
  test::OwnedWeight (*make)(int64_t rows, int64_t cols, uint32_t seed);
};

template <WFormat F>
test::OwnedWeight gguf(int64_t rows, int64_t cols, uint32_t seed) {
  return test::random_gguf(F, rows, cols, seed);
}
template <WFormat F>
test::OwnedWeight floats(int64_t rows, int64_t cols, uint32_t seed) {
  return test::random_float(rows, cols, F, seed, 3);  // rows padded: shards keep the source stride
}
template <int Bits, int Group, DType S>
test::OwnedWeight mlx(int64_t rows, int64_t cols, uint32_t seed) {
  return test::random_mlx(rows, cols, Bits, Group, S, seed);
}

const FormatCase kFormats[] = {
    {"f32", floats<WFormat::F32>},       {"f16", floats<WFormat::F16>},
    {"bf16", floats<WFormat::BF16>},     {"mlx2g32", mlx<2, 32, DType::BF16>},
    {"mlx3g64", mlx<3, 64, DType::F16>}, {"mlx4g64", mlx<4, 64, DType::BF16>},
    {"mlx5g32", mlx<5, 32, DType::F32>}, {"mlx6g128", mlx<6, 128, DType::BF16>},
    {"mlx8g32", mlx<8, 32, DType::F16>}, {"q4_0", gguf<WFormat::GgufQ4_0>},
    {"q5_0", gguf<WFormat::GgufQ5_0>},   {"q8_0", gguf<WFormat::GgufQ8_0>},
    {"q4_k", gguf<WFormat::GgufQ4_K>},   {"q5_k", gguf<WFormat::GgufQ5_K>},
    {"q6_k", gguf<WFormat::GgufQ6_K>},
};

// Every rank's row shard holds exactly its rows, and every rank's column shard exactly its
// columns of every row, for 1..4 ranks; the column shards are valid matrices of the format.
TEST(Shard, RowAndColumnShardsHoldExactlyTheirValues) {
  const int64_t rows = 7, cols = 5 * 256;
  for (const auto& fc : kFormats) {
    SCOPED_TRACE(fc.label);
    const test::OwnedWeight full = fc.make(rows, cols, 11);
    ASSERT_TRUE(validate_weight(full.view, fc.label).is_ok());
    for (int size = 1; size <= 4; ++size) {
      int64_t row_next = 0, col_next = 0;
      for (int r = 0; r < size; ++r) {
        SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(size));
        auto rv = shard_rows(full.view, r, size, fc.label);
        ASSERT_TRUE(rv.is_ok()) << rv.message();
        const auto rr = shard_range(rows, 1, r, size, "rows");
        ASSERT_TRUE(rr.is_ok());
        ASSERT_EQ(rv->rows, rr->size());
        EXPECT_EQ(rr->begin, row_next);
        row_next = rr->end;
        for (int64_t i = 0; i < rv->rows; ++i) EXPECT_EQ(dequant(*rv, i), dequant(full.view, rr->begin + i));

        auto cv = shard_cols(full.view, r, size, fc.label);
        ASSERT_TRUE(cv.is_ok()) << cv.message();
        const WeightView& c = cv->view();
        const auto cr = shard_range(cols, col_split_unit(full.view), r, size, "cols");
        ASSERT_TRUE(cr.is_ok());
        ASSERT_EQ(c.rows, rows);
        ASSERT_EQ(c.cols, cr->size());
        EXPECT_EQ(cr->begin, col_next);
        col_next = cr->end;
        EXPECT_TRUE(validate_weight(c, fc.label).is_ok());
        if (is_gguf_format(c.fmt)) {
          EXPECT_TRUE(gguf_validate(c, fc.label).is_ok());
        }
        for (int64_t i = 0; i < rows; ++i) {
          const auto whole = dequant(full.view, i);
          EXPECT_EQ(dequant(c, i), std::vector<float>(whole.begin() + cr->begin, whole.begin() + cr->end));
        }
      }
      EXPECT_EQ(row_next, rows);
      EXPECT_EQ(col_next, cols);
    }
  }
}

TEST(Shard, ColumnShardByHeadsUsesTheGivenUnit) {
  // o_proj of 5 heads of 128 (q8_0): 2 ranks split heads 3 / 2.
  const test::OwnedWeight o = gguf<WFormat::GgufQ8_0>(16, 5 * 128, 5);
  auto s0 = shard_cols(o.view, 0, 2, "attn_output", 128);
  auto s1 = shard_cols(o.view, 1, 2, "attn_output", 128);
  ASSERT_TRUE(s0.is_ok() && s1.is_ok());
  EXPECT_EQ(s0->view().cols, 3 * 128);
  EXPECT_EQ(s1->view().cols, 2 * 128);
  for (int64_t i = 0; i < 16; ++i) {
    auto a = dequant(s0->view(), i), b = dequant(s1->view(), i);
    a.insert(a.end(), b.begin(), b.end());
    EXPECT_EQ(a, dequant(o.view, i));
  }
}

// An MLX matrix cut inside its groups (one 32-column head of groups of 64 or 128): the shard is
// regrouped to 32 columns, each group keeping its source group's scale and bias, so its values are
// exactly the source's; a unit that is not a multiple of 32 is still refused.
TEST(Shard, MlxColumnShardInsideAGroupRegroups) {
  const FormatCase cases[] = {{"mlx4g64", mlx<4, 64, DType::BF16>}, {"mlx6g128", mlx<6, 128, DType::BF16>},
                              {"mlx8g64", mlx<8, 64, DType::F32>}};
  for (const FormatCase& fc : cases) {
    const char* label = fc.label;
    const auto& make = fc.make;
    SCOPED_TRACE(label);
    const test::OwnedWeight o = make(6, 4 * 32, 9);  // 4 heads of 32
    std::vector<float> joined[6];
    for (int r = 0; r < 4; ++r) {
      auto s = shard_cols(o.view, r, 4, "o_proj", 32);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_EQ(s->view().group_size, 32);
      EXPECT_EQ(s->view().cols, 32);
      EXPECT_TRUE(validate_weight(s->view(), label).is_ok());
      for (int64_t i = 0; i < 6; ++i) {
        const auto v = dequant(s->view(), i);
        joined[i].insert(joined[i].end(), v.begin(), v.end());
      }
    }
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(joined[i], dequant(o.view, i));
  }
  const test::OwnedWeight w = mlx<4, 64, DType::BF16>(4, 128, 3);
  auto odd = shard_cols(w.view, 0, 2, "o_proj", 48);
  ASSERT_FALSE(odd.is_ok());
  EXPECT_EQ(odd.message(), "o_proj [4, 128] mlx_affine columns: split unit 48 is not a multiple of the 64-column mlx_affine block");
}

// gate|up stacked in one matrix: each rank's stacked shard is its gate slice followed by its up
// slice (the same slices shard_rows gives the separate matrices), for MLX (scales follow) and GGUF.
TEST(Shard, StackedProjectionSplitsEachPart) {
  for (const auto& fc : {kFormats[5], kFormats[12]}) {
    SCOPED_TRACE(fc.label);
    const int64_t I = 3 * 256, d = 256, unit = 256;
    const test::OwnedWeight gate = fc.make(I, d, 1), up = fc.make(I, d, 2);
    const test::OwnedWeight gu = test::stack_rows(gate.view, up.view);
    for (int r = 0; r < 2; ++r) {
      auto s = shard_rows_stacked(gu.view, {I, I}, r, 2, "gate_up", unit);
      auto g = shard_rows(gate.view, r, 2, "gate", unit);
      auto u = shard_rows(up.view, r, 2, "up", unit);
      ASSERT_TRUE(s.is_ok() && g.is_ok() && u.is_ok()) << s.message();
      ASSERT_EQ(s->view().rows, g->rows + u->rows);
      EXPECT_EQ(g->rows, r == 0 ? 512 : 256);
      for (int64_t i = 0; i < g->rows; ++i) EXPECT_EQ(dequant(s->view(), i), dequant(*g, i));
      for (int64_t i = 0; i < u->rows; ++i) EXPECT_EQ(dequant(s->view(), g->rows + i), dequant(*u, i));
    }
  }
}

TEST(Shard, RefusalsNameTensorShapeFormatAndRanks) {
  const test::OwnedWeight down = gguf<WFormat::GgufQ4_K>(64, 512, 3);
  auto c3 = shard_cols(down.view, 0, 3, "ffn_down");
  ASSERT_FALSE(c3.is_ok());
  EXPECT_EQ(c3.message(), "ffn_down [64, 512] q4_k columns: 512 in units of 256 is 2 units, fewer than the 3 ranks");
  EXPECT_TRUE(shard_cols(down.view, 1, 2, "ffn_down").is_ok());  // 2 super-blocks, 2 ranks: fine

  const test::OwnedWeight o = gguf<WFormat::GgufQ4_K>(256, 1024, 4);  // 16 heads of 64
  auto heads = shard_cols(o.view, 0, 2, "attn_output", 64);
  ASSERT_FALSE(heads.is_ok());
  EXPECT_EQ(heads.message(), "attn_output [256, 1024] q4_k columns: split unit 64 is not a multiple of the 256-column q4_k block");

  const test::OwnedWeight q = test::random_float(1000, 256, WFormat::F32, 5);
  auto rows = shard_rows(q.view, 0, 2, "attn_q", 256);
  ASSERT_FALSE(rows.is_ok());
  EXPECT_EQ(rows.message(), "attn_q [1000, 256] f32 rows: 1000 is not a multiple of the split unit 256");

  const test::OwnedWeight kv = test::random_float(3 * 64, 256, WFormat::F32, 6);
  auto stacked = shard_rows_stacked(kv.view, {128, 32, 32}, 0, 2, "attn_qkv", 64);
  ASSERT_FALSE(stacked.is_ok());
  EXPECT_EQ(stacked.message(), "attn_qkv [192, 256] f32 rows (part 1, 32 rows): 32 is not a multiple of the split unit 64");
  auto sum = shard_rows_stacked(kv.view, {128, 32}, 0, 2, "attn_qkv");
  ASSERT_FALSE(sum.is_ok());
  EXPECT_EQ(sum.message(), "attn_qkv [192, 256] f32 rows: the parts' rows add up to 160, not the matrix's 192 rows");

  WeightView bad = down.view;
  bad.cols = 300;  // not whole Q4_K blocks: the view itself is refused
  auto invalid = shard_rows(bad, 0, 2, "ffn_down");
  ASSERT_FALSE(invalid.is_ok());
  EXPECT_EQ(invalid.message(), "ffn_down: shape [64, 300] not a whole number of q4_k blocks of 256");
}

}  // namespace
}  // namespace g4
