// Paged KV caches (model/kv_pool.h, KvCache over a KvPool) against per-sequence buffers on every
// backend: the same rows written give the same attention bit for bit (sliding windows wrapped,
// prompt-sized and one-row calls, tiny blocks so that every call crosses blocks); copy_from shares
// blocks and a write into a shared block copies it first; sliding layers give their blocks back;
// an empty pool is a false from reserve, never a crash; states move between both kinds of cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend_test_util.h"
#include "model/kv_cache.h"
#include "model/kv_pool.h"

namespace g4 {
namespace {

using test::randn;

constexpr int kH = 4, kHk = 2, kD = 64, kWindow = 8, kBlock = 4;

struct BackendCase {
  std::string name;
  DType act = DType::F32;  // cuda: its activation (and KV) dtype
};

std::unique_ptr<Backend> open_backend(const BackendCase& c, std::string* why) {
  if (c.name == "cpu") return make_cpu_backend();
  if (c.name == "reference") return make_reference_backend();
  BackendOptions o;
  o.activations = c.act;
  return make_cuda_backend(why, o);
}

class KvPoolTest : public ::testing::TestWithParam<BackendCase> {
 protected:
  void SetUp() override {
    std::string why;
    be_ = open_backend(GetParam(), &why);
    if (!be_) GTEST_SKIP() << "no " << GetParam().name << " backend: " << why;
    cfg_ = test::sliding_and_full(kHk, kD, kWindow);
    k_ = upload(randn(size_t(kRows) * kHk * kD, 11));
    v_ = upload(randn(size_t(kRows) * kHk * kD, 12));
    k2_ = upload(randn(size_t(kRows) * kHk * kD, 13));
  }
  void TearDown() override {
    if (!be_) return;
    for (Buf* b : {&k_, &v_, &k2_}) be_->free(*b);
  }
  Buf upload(const std::vector<float>& h) {
    Buf b = be_->alloc_act(h.size());
    be_->from_host(h.data(), h.size(), b);
    return b;
  }
  std::shared_ptr<KvPool> pool(int64_t blocks) {
    return std::make_shared<KvPool>(cfg_, *be_, kBlock, std::array<int64_t, 2>{blocks, blocks}, 256);
  }
  // Attention of the cache's last n positions (query rows from seed) in both layers, on the host.
  std::vector<float> attend(const KvCache& c, int n, uint32_t seed = 5) {
    const Buf q = upload(randn(size_t(n) * kH * kD, seed));
    const Buf out = be_->alloc_act(size_t(n) * kH * kD);
    std::vector<float> all;
    for (int l = 0; l < 2; ++l) {
      AttnSeq s;
      s.row0 = 0;
      s.n = n;
      s.pos0 = c.size() - n;
      s.kv = c.layer(l);
      be_->attention(q, kH, {s}, 0.125f, ActPrecision::F32, out);
      std::vector<float> h(size_t(n) * kH * kD);
      be_->to_host(out, h.size(), h.data());
      all.insert(all.end(), h.begin(), h.end());
    }
    be_->free(q);
    be_->free(out);
    return all;
  }

  static constexpr int kRows = 80;
  std::unique_ptr<Backend> be_;
  ModelConfig cfg_;
  Buf k_, v_, k2_;
};

TEST_P(KvPoolTest, PagedAttendsAsPerSequenceBuffers) {
  auto p = pool(64);
  for (int chunk : {1, 3, 16, 20}) {
    KvCache plain(cfg_, *be_), paged(cfg_, *be_, {}, p);
    for (int at = 0; at < 60; at += chunk) {
      const int n = std::min(chunk, 60 - at);
      test::feed_cache(*be_, plain, k_, v_, at, at + n, n);
      test::feed_cache(*be_, paged, k_, v_, at, at + n, n, /*steps=*/true);
      ASSERT_EQ(attend(paged, n), attend(plain, n)) << "chunk " << chunk << " at " << at;
      // The sliding layer keeps its window, one block below it and the call's blocks.
      EXPECT_LE(paged.blocks_held(KvPool::kSliding), (kWindow + n) / kBlock + 3);
      EXPECT_EQ(paged.blocks_held(KvPool::kFull), (at + n + kBlock - 1) / kBlock);
    }
  }
  EXPECT_EQ(p->free_blocks(KvPool::kFull), 64);  // every block back once the caches are gone
  EXPECT_EQ(p->free_blocks(KvPool::kSliding), 64);
}

TEST_P(KvPoolTest, CopiesShareBlocksAndWritesCopyThemFirst) {
  auto p = pool(64);
  KvCache a(cfg_, *be_, {}, p);
  test::feed_cache(*be_, a, k_, v_, 0, 37, 5);
  const auto a_before = attend(a, 3);
  const int64_t free_full = p->free_blocks(KvPool::kFull), free_sliding = p->free_blocks(KvPool::kSliding);
  KvCache b(cfg_, *be_, {}, p);
  b.copy_from(a);
  EXPECT_EQ(p->free_blocks(KvPool::kFull), free_full);  // shared, not copied
  EXPECT_EQ(p->free_blocks(KvPool::kSliding), free_sliding);
  EXPECT_EQ(attend(b, 3), a_before);
  // b rolls back into a shared block and writes other rows there: a keeps its own.
  ASSERT_TRUE(b.truncate(34));
  test::feed_cache(*be_, b, k2_, v_, 34, 45, 4);
  EXPECT_EQ(attend(a, 3), a_before);
  KvCache want(cfg_, *be_);
  test::feed_cache(*be_, want, k_, v_, 0, 34, 5);
  test::feed_cache(*be_, want, k2_, v_, 34, 45, 4);
  EXPECT_EQ(attend(b, 5), attend(want, 5));
  // A rollback past what the sliding layer still holds is refused, as for a ring.
  KvCache c(cfg_, *be_, {}, p);
  c.copy_from(a);
  EXPECT_FALSE(c.truncate(5));
}

TEST_P(KvPoolTest, AnEmptyPoolRefusesRoomWithoutHarm) {
  auto p = pool(3);
  {
    KvCache a(cfg_, *be_, {}, p);
    EXPECT_TRUE(a.reserve(12));
    EXPECT_EQ(a.blocks_to_map(1)[KvPool::kFull], 0);  // position 12 needs block 3 next: none left
    test::feed_cache(*be_, a, k_, v_, 0, 12, 12);
    EXPECT_EQ(a.blocks_to_map(1)[KvPool::kFull], 1);
    EXPECT_FALSE(a.reserve(1));
    KvCache b(cfg_, *be_, {}, p);
    EXPECT_FALSE(b.reserve(1));
  }
  EXPECT_EQ(p->free_blocks(KvPool::kFull), 3);
  EXPECT_EQ(p->free_blocks(KvPool::kSliding), 3);
}

TEST_P(KvPoolTest, StatesMoveBetweenPagedAndPerSequenceCaches) {
  auto p = pool(64);
  KvCache paged(cfg_, *be_, {}, p), plain(cfg_, *be_);
  test::feed_cache(*be_, paged, k_, v_, 0, 50, 7);  // the sliding layer's early blocks are gone
  test::feed_cache(*be_, plain, k_, v_, 0, 50, 7);
  const auto want = attend(plain, 4);
  const auto from_paged = paged.save_state(), from_plain = plain.save_state();
  KvCache a(cfg_, *be_), b(cfg_, *be_, {}, p), c(cfg_, *be_, {}, p);
  for (auto [x, s] : {std::pair{&a, &from_paged}, std::pair{&b, &from_paged}, std::pair{&c, &from_plain}}) {
    const Status st = x->load_state(s->data(), s->size());
    ASSERT_TRUE(st) << st.message();
  }
  // a, a per-sequence buffer read back, holds its 50 rows in 50 slots where `plain` has 256: on
  // cuda its attention takes other position splits (f32 partial sums in another order).
  const auto near = [](const std::vector<float>& x, const std::vector<float>& y) {
    float d = 0.f;
    for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
    return x.size() == y.size() && d <= 1e-5f;
  };
  EXPECT_TRUE(near(attend(a, 4), want));
  EXPECT_EQ(attend(b, 4), want);
  EXPECT_EQ(attend(c, 4), want);
  for (KvCache* x : {&a, &b, &c}) test::feed_cache(*be_, *x, k_, v_, 50, 58, 3);
  test::feed_cache(*be_, plain, k_, v_, 50, 58, 3);
  for (KvCache* x : {&a, &b, &c}) EXPECT_EQ(attend(*x, 2), attend(plain, 2));
  // A pool too small for the state: refused, its blocks back.
  auto small = pool(2);
  KvCache d(cfg_, *be_, {}, small);
  EXPECT_FALSE(d.load_state(from_plain.data(), from_plain.size()));
  EXPECT_EQ(small->free_blocks(KvPool::kFull), 2);
}

INSTANTIATE_TEST_SUITE_P(Backends, KvPoolTest,
                         ::testing::Values(BackendCase{"reference"}, BackendCase{"cpu"}, BackendCase{"cuda"},
                                           BackendCase{"cuda", DType::BF16}),
                         [](const auto& info) {
                           return info.param.name + (info.param.act == DType::BF16 ? "_bf16" : "");
                         });

TEST(KvPoolSizing, BlocksFollowWhatOneSequenceNeeds) {
  const ModelConfig cfg = test::sliding_and_full(kHk, kD, kWindow);
  // One sequence of 64 tokens fed 8 rows a step: 16 full blocks + 1, and the window's (8 + 8
  // rows, 2 blocks of slack) 6 + 1 sliding ones.
  EXPECT_EQ(KvPool::sequence_blocks(cfg, KvPool::kFull, kBlock, 64, 8), 17);
  EXPECT_EQ(KvPool::sequence_blocks(cfg, KvPool::kSliding, kBlock, 64, 8), 7);
  EXPECT_EQ(KvPool::sequence_blocks(cfg, KvPool::kSliding, kBlock, 5, 8), 3);  // short: its own tokens
  const size_t bb = KvPool::block_bytes(cfg, KvPool::kFull, kBlock, 2);
  EXPECT_EQ(bb, size_t(kBlock) * (2 * kHk * kD * 2 + 4));
  const auto n = KvPool::blocks_for_bytes(cfg, kBlock, 2, 24 * bb, 64, 8);
  EXPECT_EQ(n[KvPool::kFull], 17);  // 17 : 7 of 24 blocks' bytes
  EXPECT_EQ(n[KvPool::kSliding], 7);
}

}  // namespace
}  // namespace g4
