// KvCache::save_state / load_state (model/kv_cache.h): a cache read back from its bytes attends
// and grows exactly as the cache it was saved from (f32 and quantized layers, a sliding ring that
// has wrapped), and bytes that do not fit the cache (cut short, another layout, other options,
// impossible positions, any flipped byte) are refused or give a cache that stays within its
// buffers, never a crash. And a cache of fixed capacity (fix_capacity) holds what it was sized for.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "backend/host_backend.h"
#include "backend_test_util.h"
#include "model/kv_cache.h"

namespace g4 {
namespace {

using test::randn;

constexpr int kH = 4, kHk = 2, kD = 64, kWindow = 8;

std::vector<float> attend_last(Backend& be, const KvCache& c, const std::vector<float>& q) {
  return test::attend_last(be, c, q, kH, 0.1f);
}

class KvCacheState : public ::testing::TestWithParam<int> {};  // the KV bits (0: f32)

TEST_P(KvCacheState, ReadBackAttendsAndGrowsAsTheOriginal) {
  auto be = make_cpu_backend();
  const ModelConfig cfg = test::sliding_and_full(kHk, kD, kWindow);
  const int total = 40, more = 5;
  const auto k = randn(size_t(total + more) * kHk * kD, 21), v = randn(size_t(total + more) * kHk * kD, 22);
  const auto q = randn(size_t(kH) * kD, 23);
  KvCacheOptions opt;
  opt.quant = KvQuant{GetParam(), 64, false};
  opt.quantized_start = GetParam() ? 10 : 0;
  KvCache a(cfg, *be, opt);
  test::feed_cache(*be, a, k.data(), v.data(), 0, total, 3);  // the ring of 8 (+ chunk) has wrapped
  ASSERT_EQ(a.quantized(), GetParam() != 0);
  const std::vector<uint8_t> state = a.save_state();

  KvCache b(cfg, *be, opt);
  ASSERT_TRUE(b.load_state(state.data(), state.size()));
  EXPECT_EQ(b.size(), total);
  EXPECT_EQ(b.quantized(), a.quantized());
  EXPECT_EQ(attend_last(*be, b, q), attend_last(*be, a, q));
  // A read-back cache holds its full layers' rows in as many slots as it has tokens; saved and read
  // back again, it is the same bytes.
  const std::vector<uint8_t> again = b.save_state();
  KvCache c(cfg, *be, opt);
  ASSERT_TRUE(c.load_state(again.data(), again.size()));
  EXPECT_EQ(c.save_state(), again);
  // Both go on the same way: decode steps through the read-back cache's first growth.
  test::feed_cache(*be, a, k.data(), v.data(), total, total + more, 1);
  test::feed_cache(*be, b, k.data(), v.data(), total, total + more, 1);
  EXPECT_EQ(attend_last(*be, b, q), attend_last(*be, a, q));
  // And roll back as the original does.
  ASSERT_EQ(a.truncate(total + 1), b.truncate(total + 1));
  EXPECT_EQ(attend_last(*be, b, q), attend_last(*be, a, q));
}

INSTANTIATE_TEST_SUITE_P(Bits, KvCacheState, ::testing::Values(0, 4, 8));

// fix_capacity (the decode pad sequence's cache): one slot a layer, the sliding ring included,
// attends over its one position as a grown cache does, and refuses a second position instead of
// growing.
TEST(KvCacheFixed, OnePositionInOneSlotALayer) {
  auto be = make_cpu_backend();
  const ModelConfig cfg = test::sliding_and_full(kHk, kD, kWindow);
  const auto k = randn(size_t(kHk) * kD, 31), v = randn(size_t(kHk) * kD, 32), q = randn(size_t(kH) * kD, 33);
  KvCache grown(cfg, *be), fixed(cfg, *be);
  fixed.fix_capacity(1);
  for (int l = 0; l < 2; ++l) EXPECT_EQ(fixed.layer(l).capacity, 1) << "layer " << l;
  test::feed_cache(*be, grown, k.data(), v.data(), 0, 1, 1);
  test::feed_cache(*be, fixed, k.data(), v.data(), 0, 1, 1);
  EXPECT_GT(grown.layer(0).capacity, 1);  // the ring a reserve makes: the whole window
  EXPECT_EQ(attend_last(*be, fixed, q), attend_last(*be, grown, q));
  EXPECT_FALSE(fixed.reserve(1)) << "a fixed cache must refuse a position past its capacity";
  for (int l = 0; l < 2; ++l) EXPECT_EQ(fixed.layer(l).capacity, 1) << "layer " << l << " grew";
}

TEST(KvCacheStateRefused, WhatDoesNotFitTheCache) {
  auto be = make_cpu_backend();
  const ModelConfig cfg = test::sliding_and_full(kHk, kD, kWindow);
  const auto k = randn(size_t(30) * kHk * kD, 31), v = randn(size_t(30) * kHk * kD, 32);
  KvCache a(cfg, *be);
  test::feed_cache(*be, a, k.data(), v.data(), 0, 30, 4);
  const std::vector<uint8_t> state = a.save_state();
  auto refused = [&](const std::vector<uint8_t>& s, const KvCacheOptions& o = {}) {
    KvCache c(cfg, *be, o);
    const Status st = c.load_state(s.data(), s.size());
    EXPECT_EQ(c.size(), 0);
    return !st;
  };
  // Cut short anywhere, or with a byte more.
  for (size_t n : {size_t(0), size_t(3), size_t(9), size_t(20), state.size() / 2, state.size() - 1})
    EXPECT_TRUE(refused(std::vector<uint8_t>(state.begin(), state.begin() + ptrdiff_t(n)))) << n << " bytes";
  std::vector<uint8_t> longer = state;
  longer.push_back(0);
  EXPECT_TRUE(refused(longer));
  // Another model (three layers), other KV options (4-bit full layers).
  ModelConfig three = cfg;
  three.layers.push_back(cfg.layers[1]);
  {
    KvCache c(three, *be);
    EXPECT_FALSE(c.load_state(state.data(), state.size()));
  }
  KvCache quant_src(cfg, *be, KvCacheOptions{KvQuant{4, 64, false}, 0});
  test::feed_cache(*be, quant_src, k.data(), v.data(), 0, 30, 4);
  const auto qstate = quant_src.save_state();
  EXPECT_TRUE(refused(qstate));                                           // into an f32 cache
  EXPECT_TRUE(refused(qstate, KvCacheOptions{KvQuant{8, 64, false}, 0}));  // other bits
  EXPECT_TRUE(refused(state, KvCacheOptions{KvQuant{4, 64, false}, 0}));   // f32 state past the start
  // A position in a slot that cannot hold it (the full layer's last slot, the last 4 bytes).
  std::vector<uint8_t> moved = state;
  moved[moved.size() - 4] ^= 1;
  EXPECT_TRUE(refused(moved));
  // Not into a cache that holds tokens.
  KvCache used(cfg, *be);
  test::feed_cache(*be, used, k.data(), v.data(), 0, 2, 2);
  EXPECT_FALSE(used.load_state(state.data(), state.size()));
}

TEST(KvCacheStateRefused, FlippedBytesNeverCrash) {
  // Every header and count byte flipped in turn, and random flips anywhere: load_state either
  // refuses or gives a cache whose attention runs within its buffers (what an ASan build of this
  // test checks; CI's ASan job runs the io tests only).
  auto be = make_cpu_backend();
  const ModelConfig cfg = test::sliding_and_full(kHk, kD, kWindow);
  const auto k = randn(size_t(20) * kHk * kD, 41), v = randn(size_t(20) * kHk * kD, 42);
  const auto q = randn(size_t(kH) * kD, 43);
  KvCache a(cfg, *be);
  test::feed_cache(*be, a, k.data(), v.data(), 0, 20, 4);
  const std::vector<uint8_t> state = a.save_state();
  std::mt19937 rng(7);
  int refused = 0, taken = 0;
  for (int t = 0; t < 400; ++t) {
    std::vector<uint8_t> s = state;
    const size_t at = t < 40 ? size_t(t) : rng() % s.size();
    s[at] ^= uint8_t(1u << (rng() % 8));
    KvCache c(cfg, *be);
    if (c.load_state(s.data(), s.size())) {
      ++taken;
      (void)attend_last(*be, c, q);
    } else {
      ++refused;
    }
  }
  EXPECT_GE(refused, 15);  // the header's counts and flags
  EXPECT_GT(taken, 100);   // flips in K/V values are values (the store's checksum catches those)
}

}  // namespace
}  // namespace g4
