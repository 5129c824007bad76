// KV events from prefix-cache entries (runtime/kv_events.h) and their msgpack encoding
// (server/kv_event_publisher.h): chained block hashes, full blocks only, shared prefixes stored
// once and removed when their last holder leaves, and the wire bytes of a batch.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "runtime/kv_events.h"
#include "server/kv_event_publisher.h"

namespace g4 {
namespace {

struct Collect : KvEventSink {
  std::vector<KvEvent> events;
  void publish(std::vector<KvEvent> batch) override {
    for (auto& e : batch) events.push_back(std::move(e));
  }
};

std::vector<int32_t> seq(int n, int base = 100) {
  std::vector<int32_t> t;
  for (int i = 0; i < n; ++i) t.push_back(base + i * 7);
  return t;
}

TEST(KvBlockTracker, HashesChainOverFullBlocksAndDependOnEverythingBefore) {
  const auto a = KvBlockTracker::block_hashes(seq(10), 0, 4);
  ASSERT_EQ(a.size(), 2u);  // the partial third block is not named
  EXPECT_NE(a[0], a[1]);
  auto b_tokens = seq(10);
  b_tokens[5] += 1;  // a token of block 1
  const auto b = KvBlockTracker::block_hashes(b_tokens, 0, 4);
  EXPECT_EQ(a[0], b[0]);
  EXPECT_NE(a[1], b[1]);
  auto c_tokens = seq(10);
  c_tokens[0] += 1;  // block 0 differs: every later hash differs (chained)
  const auto c = KvBlockTracker::block_hashes(c_tokens, 0, 4);
  EXPECT_NE(a[0], c[0]);
  EXPECT_NE(a[1], c[1]);
  EXPECT_NE(KvBlockTracker::block_hashes(seq(10), 3, 4)[0], a[0]);  // an adapter's KV is named apart
}

TEST(KvBlockTracker, SharedPrefixesAreStoredOnceAndRemovedWithTheirLastHolder) {
  auto sink = std::make_shared<Collect>();
  KvBlockTracker t(4, sink, [](uint64_t tag) { return "adapter" + std::to_string(tag); });
  ASSERT_EQ(sink->events.size(), 1u);
  EXPECT_EQ(sink->events[0].kind, KvEvent::Kind::Cleared);

  const auto shortp = seq(9), longp = seq(17);  // 2 and 4 full blocks, the first 2 shared
  const auto hs = KvBlockTracker::block_hashes(longp, 0, 4);
  t.entry_added(shortp, 0);
  ASSERT_EQ(sink->events.size(), 2u);
  const KvEvent& s1 = sink->events[1];
  EXPECT_EQ(s1.kind, KvEvent::Kind::Stored);
  EXPECT_FALSE(s1.has_parent);
  EXPECT_EQ(s1.hashes, std::vector<uint64_t>(hs.begin(), hs.begin() + 2));
  EXPECT_EQ(s1.tokens, std::vector<int32_t>(shortp.begin(), shortp.begin() + 8));
  EXPECT_EQ(s1.block_size, 4);

  t.entry_added(longp, 0);  // only blocks 2 and 3 are new; their parent is block 1
  ASSERT_EQ(sink->events.size(), 3u);
  const KvEvent& s2 = sink->events[2];
  EXPECT_TRUE(s2.has_parent);
  EXPECT_EQ(s2.parent, hs[1]);
  EXPECT_EQ(s2.hashes, std::vector<uint64_t>(hs.begin() + 2, hs.end()));
  EXPECT_EQ(s2.tokens, std::vector<int32_t>(longp.begin() + 8, longp.begin() + 16));
  EXPECT_EQ(t.blocks_held(), 4u);

  t.entry_added(shortp, 0);  // held already: nothing new
  EXPECT_EQ(sink->events.size(), 3u);
  t.entry_removed(shortp, 0);  // the long entry still holds blocks 0, 1
  EXPECT_EQ(sink->events.size(), 3u);
  t.entry_removed(shortp, 0);
  EXPECT_EQ(sink->events.size(), 3u);
  t.entry_removed(longp, 0);
  ASSERT_EQ(sink->events.size(), 4u);
  EXPECT_EQ(sink->events[3].kind, KvEvent::Kind::Removed);
  EXPECT_EQ(sink->events[3].hashes.size(), 4u);
  EXPECT_EQ(t.blocks_held(), 0u);

  t.entry_added(seq(3), 0);  // no full block: no event
  EXPECT_EQ(sink->events.size(), 4u);
  t.entry_added(seq(4), 7);
  ASSERT_EQ(sink->events.size(), 5u);
  EXPECT_EQ(sink->events[4].tag, 7u);
  EXPECT_EQ(sink->events[4].lora_name, "adapter7");
}

TEST(KvEventEncoding, BatchBytesAreVllmsArrayForm) {
  KvEvent cleared;
  const std::string p = server::encode_kv_event_batch(1.5, {cleared}, "CPU");
  // [1.5, [["AllBlocksCleared"]], 0]
  std::string want = "\x93\xcb";
  const double ts = 1.5;
  uint64_t bits;
  std::memcpy(&bits, &ts, 8);
  for (int i = 7; i >= 0; --i) want += char((bits >> (8 * i)) & 0xff);
  want += "\x91\x91\xb0" "AllBlocksCleared";
  want += '\0';
  EXPECT_EQ(p, want);

  KvEvent stored;
  stored.kind = KvEvent::Kind::Stored;
  stored.hashes = {1, 2};
  stored.tokens = {5, 6};
  stored.block_size = 1;
  const std::string q = server::encode_kv_event_batch(0, {stored}, "GPU");
  // ..., ["BlockStored", [1, 2], nil, [5, 6], 1, nil, "GPU", nil], 0]
  const std::string tail = std::string("\x98\xab") + "BlockStored" + "\x92\x01\x02\xc0\x92\x05\x06\x01\xc0\xa3" +
                           "GPU" + "\xc0" + std::string(1, '\0');
  ASSERT_GE(q.size(), tail.size());
  EXPECT_EQ(q.substr(q.size() - tail.size()), tail);
}

}  // namespace
}  // namespace g4
