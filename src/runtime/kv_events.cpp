#include "runtime/kv_events.h"

namespace g4 {
namespace {

constexpr uint64_t kFnvOffset = 0xcbf29ce484222325ull, kFnvPrime = 0x100000001b3ull;
constexpr uint64_t kChainSeed = 0x67656d6d61346b76ull;  // h_{-1}

uint64_t fnv_word(uint64_t h, uint64_t w) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((w >> (8 * i)) & 0xff)) * kFnvPrime;
  return h;
}

uint64_t splitmix_final(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

KvBlockTracker::KvBlockTracker(int block_size, std::shared_ptr<KvEventSink> sink,
                               std::function<std::string(uint64_t)> adapter_name)
    : block_size_(block_size), sink_(std::move(sink)), adapter_name_(std::move(adapter_name)) {
  G4_CHECK(block_size_ > 0 && sink_);
  sink_->publish({KvEvent{}});  // Kind::Cleared
}

std::vector<uint64_t> KvBlockTracker::block_hashes(const std::vector<int32_t>& tokens, uint64_t tag,
                                                   int block_size) {
  std::vector<uint64_t> out;
  uint64_t parent = kChainSeed;
  for (size_t b = 0; (b + 1) * size_t(block_size) <= tokens.size(); ++b) {
    uint64_t h = fnv_word(fnv_word(kFnvOffset, parent), tag);
    for (size_t i = b * size_t(block_size); i < (b + 1) * size_t(block_size); ++i)
      h = fnv_word(h, uint64_t(uint32_t(tokens[i])));
    parent = splitmix_final(h);
    out.push_back(parent);
  }
  return out;
}

void KvBlockTracker::entry_added(const std::vector<int32_t>& tokens, uint64_t tag) {
  const std::vector<uint64_t> hashes = block_hashes(tokens, tag, block_size_);
  std::lock_guard<std::mutex> lock(mu_);
  // Every entry holds its chain from the first block, so the blocks held already are a prefix of
  // this chain and the new ones the rest.
  size_t first = hashes.size();
  for (size_t i = 0; i < hashes.size(); ++i)
    if (holders_[hashes[i]]++ == 0 && first == hashes.size()) first = i;
  if (first == hashes.size()) return;  // every block was held already
  KvEvent e;
  e.kind = KvEvent::Kind::Stored;
  e.hashes.assign(hashes.begin() + long(first), hashes.end());
  e.has_parent = first > 0;
  e.parent = first > 0 ? hashes[first - 1] : 0;
  e.tokens.assign(tokens.begin() + long(first * size_t(block_size_)),
                  tokens.begin() + long(hashes.size() * size_t(block_size_)));
  e.block_size = block_size_;
  e.tag = tag;
  if (tag != 0 && adapter_name_) e.lora_name = adapter_name_(tag);
  sink_->publish({std::move(e)});
}

void KvBlockTracker::entry_removed(const std::vector<int32_t>& tokens, uint64_t tag) {
  const std::vector<uint64_t> hashes = block_hashes(tokens, tag, block_size_);
  std::lock_guard<std::mutex> lock(mu_);
  KvEvent e;
  e.kind = KvEvent::Kind::Removed;
  for (uint64_t h : hashes) {
    auto it = holders_.find(h);
    if (it == holders_.end()) continue;  // (added before the tracker was listening)
    if (--it->second == 0) {
      holders_.erase(it);
      e.hashes.push_back(h);
    }
  }
  if (!e.hashes.empty()) sink_->publish({std::move(e)});
}

size_t KvBlockTracker::blocks_held() const {
  std::lock_guard<std::mutex> lock(mu_);
  return holders_.size();
}

}  // namespace g4
