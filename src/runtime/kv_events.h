// KV events: what the prompt-prefix cache holds, told the way vLLM tells it (BlockStored,
// BlockRemoved, AllBlocksCleared), so that a cache-aware router (llm-d's KV-cache indexer, NVIDIA
// Dynamo's KV router) sends a prompt to the server holding its prefix. This file turns prefix-cache
// entries into block events; server/kv_event_publisher.h sends them over ZeroMQ.
//
// Blocks: an entry's tokens in blocks of block_size, full blocks only (a partial last block is not
// reusable by the router's block-aligned lookups either). Block i is named by a 64-bit hash chained
// from its parent's: h_i = H(h_{i-1}, tag, tokens of block i), with h_{-1} a fixed seed (H: FNV-1a
// over the little-endian 64-bit words, then the splitmix64 finalizer), so a prefix has one chain of
// hashes whichever entry holds it; routers re-derive their own keys from the tokens and the parent.
// Entries share prefixes, so each block is counted: BlockStored when its first holder arrives,
// BlockRemoved when its last one leaves. tag: the KV's LoRA adapter mount (PrefixCache's tag; 0:
// the base model), hashed in and reported as lora_id.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/prefix_cache.h"

namespace g4 {

struct KvEvent {
  enum class Kind { Stored, Removed, Cleared };
  Kind kind = Kind::Cleared;
  std::vector<uint64_t> hashes;  // Stored, Removed: the blocks (Stored: in chain order)
  bool has_parent = false;       // Stored: whether the first block has a parent block
  uint64_t parent = 0;           // ... and its hash
  std::vector<int32_t> tokens;   // Stored: the blocks' tokens, block after block
  int block_size = 0;
  uint64_t tag = 0;              // Stored: the adapter mount (0: none)
  std::string lora_name;         // Stored: that adapter's name (empty: none)
};

// Where batches of events go (server/kv_event_publisher.h); called on the cache's thread.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void publish(std::vector<KvEvent> batch) = 0;
};

class KvBlockTracker : public PrefixCacheListener {
 public:
  // Publishes AllBlocksCleared at once: a (re)started server holds nothing yet.
  // adapter_name(tag): the name reported with an adapter's blocks (null: none).
  KvBlockTracker(int block_size, std::shared_ptr<KvEventSink> sink,
                 std::function<std::string(uint64_t)> adapter_name = nullptr);
  void entry_added(const std::vector<int32_t>& tokens, uint64_t tag) override;
  void entry_removed(const std::vector<int32_t>& tokens, uint64_t tag) override;

  // The chained hashes of the full blocks of `tokens` (the rule above).
  static std::vector<uint64_t> block_hashes(const std::vector<int32_t>& tokens, uint64_t tag, int block_size);
  size_t blocks_held() const;

 private:
  const int block_size_;
  std::shared_ptr<KvEventSink> sink_;
  std::function<std::string(uint64_t)> adapter_name_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, int> holders_;  // block hash -> entries holding it
};

}  // namespace g4
