#include "runtime/prefix_cache.h"

#include <algorithm>

namespace g4 {

void PrefixCache::insert(std::vector<int32_t> tokens, std::unique_ptr<KvCache> cache) {
  if (max_bytes_ == 0 || tokens.empty()) return;
  // An entry that is a prefix of the new one is now redundant.
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->tokens.size() <= tokens.size() &&
        std::equal(it->tokens.begin(), it->tokens.end(), tokens.begin())) {
      bytes_ -= it->bytes;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  Entry e;
  e.bytes = cache->bytes();
  if (e.bytes > max_bytes_) return;
  e.tokens = std::move(tokens);
  e.cache = std::move(cache);
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  while (bytes_ > max_bytes_ && !entries_.empty()) {
    bytes_ -= entries_.back().bytes;
    entries_.pop_back();
  }
}

int PrefixCache::lookup(const std::vector<int32_t>& prompt, KvCache& dst) {
  auto best = entries_.end();
  size_t best_len = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    size_t n = std::min(it->tokens.size(), prompt.size() - 1);
    size_t l = 0;
    while (l < n && it->tokens[l] == prompt[l]) ++l;
    if (l > best_len) {
      best_len = l;
      best = it;
    }
  }
  if (best == entries_.end() || best_len == 0) return 0;
  dst.copy_from(*best->cache);
  if (!dst.truncate(int(best_len))) {
    dst.truncate(0);
    return 0;
  }
  entries_.splice(entries_.begin(), entries_, best);  // mark as recently used
  return int(best_len);
}

}  // namespace g4
