// core/thread_pool: coverage of [0, n) by disjoint ranges, many back-to-back regions (the decode
// pattern), nested regions, and regions issued after the workers went to sleep.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace g4 {
namespace {

TEST(ThreadPool, CoversRangeExactlyOnce) {
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 4097}) {
    for (int64_t min_chunk : {1, 16, 5000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      parallel_for(n, [&](int64_t b, int64_t e) {
        ASSERT_LE(0, b);
        ASSERT_LT(b, e);
        ASSERT_LE(e, n);
        for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1);
      }, min_chunk);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n " << n << " i " << i;
    }
  }
}

TEST(ThreadPool, ManyBackToBackRegions) {
  std::atomic<int64_t> sum{0};
  for (int it = 0; it < 5000; ++it)
    parallel_for(8, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  EXPECT_EQ(sum.load(), 5000 * 8);
}

TEST(ThreadPool, NestedRegionRunsInline) {
  std::atomic<int64_t> sum{0};
  parallel_for(4, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      parallel_for(10, [&](int64_t bb, int64_t ee) { sum.fetch_add(ee - bb); });
  });
  EXPECT_EQ(sum.load(), 40);
}

TEST(ThreadPool, WakesAfterWorkersSleep) {
  std::atomic<int64_t> sum{0};
  for (int it = 0; it < 3; ++it) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // past the spin budget
    parallel_for(1000, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  }
  EXPECT_EQ(sum.load(), 3000);
}

TEST(ThreadPool, ConcurrentCallersAreSerialized) {
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 3; ++t)
    callers.emplace_back([&] {
      for (int it = 0; it < 500; ++it) parallel_for(16, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
    });
  for (auto& c : callers) c.join();
  EXPECT_EQ(sum.load(), 3 * 500 * 16);
}

}  // namespace
}  // namespace g4
