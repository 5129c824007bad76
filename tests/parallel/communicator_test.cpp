// The in-process communicator's collectives against their contract (parallel/communicator.h):
// all_reduce_sum equals the serial sum in rank order (f32 bit for bit; bf16 summed in f32 and
// rounded once) and every rank receives the same bits; all_gather concatenates in rank order;
// ranks that disagree on a collective, or never arrive, abort with a message naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>

#include "parallel/inproc_communicator.h"
#include "parallel_test_util.h"

namespace g4 {
namespace {

using test::run_ranks;

// Rank r's random input of `count` elements of dtype t (f32 values, or their bf16 roundings).
std::vector<uint8_t> rank_input(int r, size_t count, DType t, uint32_t seed) {
  std::mt19937 rng(seed * 131u + uint32_t(r));
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint8_t> out(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    test::store_float(out, t, i, nd(rng) * float(1 + r));
  }
  return out;
}

// The contract's reduction, computed serially: acc = x0 + x1 + ... in f32, rounded once to t.
std::vector<uint8_t> serial_sum(const std::vector<std::vector<uint8_t>>& in, size_t count, DType t) {
  std::vector<uint8_t> out(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    float acc = load_float(in[0].data(), t, i);
    for (size_t r = 1; r < in.size(); ++r) acc += load_float(in[r].data(), t, i);
    test::store_float(out, t, i, acc);
  }
  return out;
}

struct ReduceCase {
  int ranks;
  DType dtype;
  size_t count;
};

class AllReduceTest : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(AllReduceTest, EqualsSerialSumInRankOrderOnEveryRank) {
  const auto [n, dt, count] = GetParam();
  std::vector<std::vector<uint8_t>> in, buf;
  for (int r = 0; r < n; ++r) in.push_back(rank_input(r, count, dt, 7));
  buf = in;
  auto group = make_inproc_group(n);
  run_ranks(group, [&](Communicator& c) { c.all_reduce_sum(buf[size_t(c.rank())].data(), count, dt); });
  const std::vector<uint8_t> want = serial_sum(in, count, dt);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(buf[size_t(r)] == want) << "rank " << r;
  // The sum is not a trivial copy of one rank's input.
  if (n > 1 && count > 0) {
    EXPECT_FALSE(want == in[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, AllReduceTest,
                         ::testing::Values(ReduceCase{1, DType::F32, 100}, ReduceCase{2, DType::F32, 1},
                                           ReduceCase{2, DType::F32, 4097}, ReduceCase{4, DType::F32, 4097},
                                           ReduceCase{4, DType::F32, 3}, ReduceCase{2, DType::BF16, 4097},
                                           ReduceCase{4, DType::BF16, 1000}, ReduceCase{4, DType::F32, 0}),
                         [](const ::testing::TestParamInfo<ReduceCase>& p) {
                           return std::string(dtype_name(p.param.dtype)) + "_" + std::to_string(p.param.ranks) +
                                  "ranks_" + std::to_string(p.param.count);
                         });

// bf16 is summed in f32 and rounded once: 1 + 3 * 2^-8 is 1.5 bf16 ulps above 1 and rounds to
// 1 + 2^-6, where rounding after each addition would stay at 1 (each 1 + 2^-8 is a tie to even).
TEST(AllReduce, Bf16RoundsOnceNotPerAddition) {
  const float vals[4] = {1.f, 0x1p-8f, 0x1p-8f, 0x1p-8f};
  std::vector<uint16_t> buf(4);
  for (int r = 0; r < 4; ++r) buf[size_t(r)] = f32_to_bf16(vals[r]);
  auto group = make_inproc_group(4);
  run_ranks(group, [&](Communicator& c) { c.all_reduce_sum(&buf[size_t(c.rank())], 1, DType::BF16); });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(bf16_to_f32(buf[size_t(r)]), 1.f + 0x1p-6f) << "rank " << r;
}

// f32 is summed in rank order: (1e8 + -1e8) + 1 = 1, where an order that starts from the 1 gives
// 0 in f32 (1 + -1e8 rounds to -1e8).
TEST(AllReduce, F32SumsInRankOrder) {
  const float vals[3] = {1e8f, -1e8f, 1.f};
  std::vector<float> buf(vals, vals + 3);
  auto group = make_inproc_group(3);
  run_ranks(group, [&](Communicator& c) { c.all_reduce_sum(&buf[size_t(c.rank())], 1, DType::F32); });
  for (int r = 0; r < 3; ++r) EXPECT_EQ(buf[size_t(r)], 1.f) << "rank " << r;
}

class AllGatherTest : public ::testing::TestWithParam<std::tuple<int, DType, bool>> {};

TEST_P(AllGatherTest, ConcatenatesInRankOrder) {
  const auto [n, dt, in_place] = GetParam();
  const size_t count = 1001, bytes = count * dtype_size(dt);
  std::vector<std::vector<uint8_t>> in, recv(size_t(n), std::vector<uint8_t>(bytes * size_t(n), 0xAB));
  std::mt19937 rng(3);
  for (int r = 0; r < n; ++r) {
    in.emplace_back(bytes);
    for (auto& b : in.back()) b = uint8_t(rng());
    if (in_place) std::memcpy(recv[size_t(r)].data() + size_t(r) * bytes, in.back().data(), bytes);
  }
  auto group = make_inproc_group(n);
  run_ranks(group, [&](Communicator& c) {
    const size_t r = size_t(c.rank());
    const void* send = in_place ? recv[r].data() + r * bytes : in[r].data();
    c.all_gather(send, count, dt, recv[r].data());
  });
  std::vector<uint8_t> want;
  for (const auto& v : in) want.insert(want.end(), v.begin(), v.end());
  for (int r = 0; r < n; ++r) EXPECT_TRUE(recv[size_t(r)] == want) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Collectives, AllGatherTest,
                         ::testing::Combine(::testing::Values(1, 2, 4),
                                            ::testing::Values(DType::F32, DType::BF16, DType::I32),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<int, DType, bool>>& p) {
                           return std::string(dtype_name(std::get<1>(p.param))) + "_" +
                                  std::to_string(std::get<0>(p.param)) + "ranks" +
                                  (std::get<2>(p.param) ? "_in_place" : "");
                         });

// Many collectives back to back, of changing sizes and kinds: the shared scratch and the slots are
// reused correctly, and barrier() keeps ranks together.
TEST(Collectives, LongMixedSequence) {
  const int n = 4;
  auto group = make_inproc_group(n);
  std::vector<int> failures(size_t(n), 0);
  run_ranks(group, [&](Communicator& c) {
    for (int step = 0; step < 200; ++step) {
      const size_t count = size_t(1 + (step * 37) % 300);
      if (step % 3 == 0) {
        std::vector<float> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = float(c.rank() + 1) * float(i + size_t(step));
        c.all_reduce_sum(v.data(), count, DType::F32);
        // sum over ranks of (r + 1) * k = 10 * k for 4 ranks (exact in f32 for these sizes).
        for (size_t i = 0; i < count; ++i)
          if (v[i] != 10.f * float(i + size_t(step))) ++failures[size_t(c.rank())];
      } else if (step % 3 == 1) {
        std::vector<int32_t> send(count, c.rank() * 1000 + step), recv(count * n);
        c.all_gather(send.data(), count, DType::I32, recv.data());
        for (int r = 0; r < n; ++r)
          for (size_t i = 0; i < count; ++i)
            if (recv[size_t(r) * count + i] != r * 1000 + step) ++failures[size_t(c.rank())];
      } else {
        c.barrier();
      }
    }
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(failures[size_t(r)], 0) << "rank " << r;
}

// Rank 0 calls all_reduce_sum, rank 1 all_gather, as the first collective.
void mismatched_collectives() {
  auto group = make_inproc_group(2);
  std::vector<float> a(8), b(16);
  std::thread t([&] { group[1]->all_gather(a.data(), 8, DType::F32, b.data()); });
  group[0]->all_reduce_sum(a.data(), 8, DType::F32);
  t.join();
}

// Rank 0 calls barrier(); rank 1 never calls anything.
void lone_barrier() {
  auto group = make_inproc_group(2, std::chrono::milliseconds(200));
  group[0]->barrier();
}

// Both ranks run one all_reduce_sum; then rank 0 calls a second one that rank 1 never calls.
void second_collective_alone() {
  auto group = make_inproc_group(2, std::chrono::milliseconds(200));
  std::vector<float> a(4), b(4);
  std::thread t([&] { group[1]->all_reduce_sum(b.data(), 4, DType::F32); });
  group[0]->all_reduce_sum(a.data(), 4, DType::F32);
  t.join();
  group[0]->all_reduce_sum(a.data(), 4, DType::F32);
}

TEST(CollectivesDeathTest, RanksCallingDifferentCollectivesAbortNamingBoth) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(mismatched_collectives(),
               "inproc communicator: collective #0 differs between ranks: rank 0 called all_reduce_sum\\(count 8, "
               "F32\\), rank 1 called all_gather\\(count 8, F32\\)");
}

TEST(CollectivesDeathTest, ARankThatWaitsTooLongAbortsNamingTheCollective) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(lone_barrier(),
               "inproc communicator: rank 0 of 2 waited more than 200 ms in barrier\\(\\) \\(collective #0\\): 1 "
               "of 2 ranks arrived");
  EXPECT_DEATH(second_collective_alone(),
               "inproc communicator: rank 0 of 2 waited more than 200 ms in all_reduce_sum\\(count 4, F32\\) "
               "\\(collective #1\\): 1 of 2 ranks arrived");
}

}  // namespace
}  // namespace g4
