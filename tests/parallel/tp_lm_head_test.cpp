// A vocabulary-sharded LM head on 2 and 4 ranks: each rank computes the logits of its vocabulary
// rows (shard_rows). Two ways back to the full answer are checked against the unsharded head:
// all_gather of the logit slices (equal vocabulary shares) gives the full logits within 1e-5 and
// the same argmax; all_gather of each rank's (max, global index) gives the same argmax for a
// vocabulary that does not split evenly (what greedy decoding needs, without moving the logits).
#include <gtest/gtest.h>

#include <set>

#include "parallel/inproc_communicator.h"
#include "parallel/shard.h"
#include "parallel_test_util.h"
#include "quant/matmul.h"

namespace g4 {
namespace {

using test::TpFormat;

constexpr int kD = 2048;  // 8 K-quant super-blocks per row: row norms of random blocks vary less
constexpr int kM = 4;

std::vector<int32_t> argmax_rows(Backend& be, const std::vector<float>& logits, int n) {
  std::vector<int32_t> idx(static_cast<size_t>(kM));
  be.argmax(logits.data(), kM, n, idx.data());
  return idx;
}

std::vector<float> head(Backend& be, const std::vector<float>& x, const WeightView& w) {
  std::vector<float> y(size_t(kM) * size_t(w.rows));
  be.matmul(x.data(), kM, w, ActPrecision::F32, y.data());
  return y;
}

using HeadParam = std::tuple<std::string, TpFormat, int>;  // backend, format, ranks

class TpLmHeadTest : public ::testing::TestWithParam<HeadParam> {};

TEST_P(TpLmHeadTest, GatheredLogitsEqualUnsharded) {
  const auto [kind, fmt, n] = GetParam();
  const int V = 1024;  // an equal share per rank for 2 and 4 ranks
  const test::OwnedWeight w = test::random_weight(fmt, V, kD, 41);
  const std::vector<float> x = test::random_x(int64_t(kM) * kD, 8);
  auto single_be = test::backend_of(kind);
  const std::vector<float> ref = head(*single_be, x, w.view);
  const int Vr = V / n;

  std::vector<std::vector<float>> full(size_t(n), std::vector<float>(size_t(kM) * size_t(V)));
  auto group = make_inproc_group(n);
  test::run_ranks(group, [&](Communicator& c) {
    auto be = test::backend_of(kind);
    auto ws = shard_rows(w.view, c.rank(), n, "output");
    G4_CHECK(ws.is_ok() && ws->rows == Vr);
    const std::vector<float> mine = head(*be, x, *ws);
    std::vector<float> recv(size_t(n) * mine.size());  // [rank, kM, Vr]
    c.all_gather(mine.data(), mine.size(), DType::F32, recv.data());
    auto& f = full[size_t(c.rank())];
    for (int r = 0; r < n; ++r)
      for (int m = 0; m < kM; ++m)
        for (int j = 0; j < Vr; ++j)
          f[size_t(m) * V + size_t(r) * Vr + j] = recv[(size_t(r) * kM + m) * Vr + j];
  });
  for (int r = 1; r < n; ++r) EXPECT_EQ(full[size_t(r)], full[0]) << "rank " << r;
  EXPECT_LE(test::rel_err(full[0], ref), 1e-5);
  EXPECT_EQ(argmax_rows(*single_be, full[0], V), argmax_rows(*single_be, ref, V));
}

TEST_P(TpLmHeadTest, GatheredArgmaxEqualsUnshardedForAnUnevenVocabulary) {
  const auto [kind, fmt, n] = GetParam();
  const int V = 1001;  // 2 ranks: 501 / 500; 4 ranks: 251 / 250 / 250 / 250
  const test::OwnedWeight w = test::random_weight(fmt, V, kD, 42);
  // Each x row is a vocabulary row (at both ends and around the 2-rank boundary), so that the
  // answers are spread over the ranks.
  const int targets[kM] = {0, 500, 501, V - 1};
  std::vector<float> x(size_t(kM) * kD);
  for (int m = 0; m < kM; ++m) dequant_row(w.view, targets[m], x.data() + size_t(m) * kD);
  auto single_be = test::backend_of(kind);
  const std::vector<int32_t> want = argmax_rows(*single_be, head(*single_be, x, w.view), V);

  std::vector<std::vector<int32_t>> got(static_cast<size_t>(n), std::vector<int32_t>(static_cast<size_t>(kM)));
  auto group = make_inproc_group(n);
  test::run_ranks(group, [&](Communicator& c) {
    auto be = test::backend_of(kind);
    auto ws = shard_rows(w.view, c.rank(), n, "output");
    auto range = shard_range(V, 1, c.rank(), n, "output rows");
    G4_CHECK(ws.is_ok() && range.is_ok());
    const int Vr = int(ws->rows);
    const std::vector<float> mine = head(*be, x, *ws);
    const std::vector<int32_t> local = argmax_rows(*be, mine, Vr);
    std::vector<float> best(static_cast<size_t>(kM));
    std::vector<int32_t> best_idx(static_cast<size_t>(kM));
    for (int m = 0; m < kM; ++m) {
      best[size_t(m)] = mine[size_t(m) * Vr + local[size_t(m)]];
      best_idx[size_t(m)] = int32_t(range->begin) + local[size_t(m)];
    }
    std::vector<float> vals(size_t(n) * kM);
    std::vector<int32_t> idx(size_t(n) * kM);
    c.all_gather(best.data(), kM, DType::F32, vals.data());
    c.all_gather(best_idx.data(), kM, DType::I32, idx.data());
    for (int m = 0; m < kM; ++m) {
      int pick = 0;  // ranks hold increasing vocabulary ranges: the first maximum is the lowest index
      for (int r = 1; r < n; ++r)
        if (vals[size_t(r) * kM + m] > vals[size_t(pick) * kM + m]) pick = r;
      got[size_t(c.rank())][size_t(m)] = idx[size_t(pick) * kM + m];
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(got[size_t(r)], want) << "rank " << r;
  // Not vacuous: the rows' answers lie in the vocabulary ranges of at least two ranks.
  std::set<int64_t> owners;
  for (int32_t id : want)
    for (int r = 0; r < n; ++r)
      if (auto s = shard_range(V, 1, r, n, "output rows"); s.is_ok() && id >= s->begin && id < s->end) owners.insert(r);
  EXPECT_GE(owners.size(), 2u);
}

std::string head_name(const ::testing::TestParamInfo<HeadParam>& p) {
  return test::tp_case_name(std::get<0>(p.param), std::get<1>(p.param), std::get<2>(p.param));
}

INSTANTIATE_TEST_SUITE_P(Parallel, TpLmHeadTest,
                         ::testing::Combine(::testing::Values("cpu", "reference"),
                                            ::testing::Values(TpFormat::F32, TpFormat::Q8_0, TpFormat::Q6_K,
                                                              TpFormat::Mlx4g64),
                                            ::testing::Values(2, 4)),
                         head_name);

}  // namespace
}  // namespace g4
