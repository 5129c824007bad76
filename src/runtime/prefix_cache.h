// Prompt-prefix cache: KV caches of finished sequences, keyed by the tokens they hold, so that a
// follow-up request (the next turn of a conversation) starts from the longest shared prefix
// instead of recomputing it. Bounded in bytes, least-recently-used entries evicted first.
// Correct with sliding-window layers: a cache is only reused when it can be rolled back to the
// shared prefix (KvCache::truncate checks the ring still holds the needed window).
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <vector>

#include "model/kv_cache.h"

namespace g4 {

// Told of every entry that enters or leaves the cache (runtime/kv_events.h publishes them as KV
// events): called on the thread that changes the cache, after an entry was added and before one
// that replaces it is dropped, so a prefix both hold is never reported gone.
class PrefixCacheListener {
 public:
  virtual ~PrefixCacheListener() = default;
  virtual void entry_added(const std::vector<int32_t>& tokens, uint64_t tag) = 0;
  virtual void entry_removed(const std::vector<int32_t>& tokens, uint64_t tag) = 0;
};

class PrefixCache {
 public:
  explicit PrefixCache(size_t max_bytes) : max_bytes_(max_bytes) {}
  // The listener of every later change (null: none); it outlives the cache's use.
  void set_listener(std::shared_ptr<PrefixCacheListener> l) { listener_ = std::move(l); }

  // Entries carry a tag (the KV's LoRA adapter mount, runtime/adapter_set.h; 0: the base model):
  // an entry only serves lookups of its own tag.
  // Stores `cache` holding the KV of `tokens` (takes ownership). Evicts LRU entries over budget.
  void insert(std::vector<int32_t> tokens, std::unique_ptr<KvCache> cache, uint64_t tag = 0);
  // Fills `dst` (a fresh cache of the same model) with the longest cached prefix of `prompt`,
  // leaving at least one prompt token to compute. Returns the number of reused tokens (0: none).
  int lookup(const std::vector<int32_t>& prompt, KvCache& dst, uint64_t tag = 0);
  // The base model's entry sharing the longest prefix (of at most max_len tokens) with `tokens`: its
  // tokens, its cache and that prefix's length; nulls and 0 when none shares a token.
  struct Match {
    const std::vector<int32_t>* tokens = nullptr;
    const KvCache* cache = nullptr;
    size_t len = 0;
  };
  Match longest(const std::vector<int32_t>& tokens, size_t max_len);
  // Drops the least recently used entry; false when there is none.
  bool evict_oldest();
  size_t bytes() const { return bytes_; }
  size_t entries() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<int32_t> tokens;
    std::unique_ptr<KvCache> cache;
    size_t bytes = 0;
    uint64_t tag = 0;
  };
  // Drops an entry (the listener told); returns the next.
  std::list<Entry>::iterator erase(std::list<Entry>::iterator it);
  std::list<Entry>::iterator best(const std::vector<int32_t>& tokens, size_t max_len, uint64_t tag, size_t* len);

  size_t max_bytes_;
  size_t bytes_ = 0;
  std::list<Entry> entries_;  // front = most recently used
  std::shared_ptr<PrefixCacheListener> listener_;
};

}  // namespace g4
