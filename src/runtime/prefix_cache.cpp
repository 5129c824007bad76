#include "runtime/prefix_cache.h"

#include <algorithm>

namespace g4 {

void PrefixCache::insert(std::vector<int32_t> tokens, std::unique_ptr<KvCache> cache, uint64_t tag) {
  if (max_bytes_ == 0 || tokens.empty()) return;
  Entry e;
  e.bytes = cache->bytes();
  if (e.bytes > max_bytes_) return;
  e.tokens = std::move(tokens);
  e.cache = std::move(cache);
  e.tag = tag;
  bytes_ += e.bytes;
  entries_.push_front(std::move(e));
  if (listener_) listener_->entry_added(entries_.front().tokens, tag);
  // An entry that is a prefix of the new one is now redundant.
  const std::vector<int32_t>& added = entries_.front().tokens;
  for (auto it = std::next(entries_.begin()); it != entries_.end();) {
    if (it->tag == tag && it->tokens.size() <= added.size() &&
        std::equal(it->tokens.begin(), it->tokens.end(), added.begin()))
      it = erase(it);
    else
      ++it;
  }
  while (bytes_ > max_bytes_ && !entries_.empty()) erase(std::prev(entries_.end()));
}

std::list<PrefixCache::Entry>::iterator PrefixCache::erase(std::list<Entry>::iterator it) {
  bytes_ -= it->bytes;
  if (listener_) listener_->entry_removed(it->tokens, it->tag);
  return entries_.erase(it);
}

std::list<PrefixCache::Entry>::iterator PrefixCache::best(const std::vector<int32_t>& tokens, size_t max_len,
                                                          uint64_t tag, size_t* len) {
  auto best = entries_.end();
  size_t best_len = 0;
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->tag != tag) continue;
    const size_t n = std::min({it->tokens.size(), tokens.size(), max_len});
    size_t l = 0;
    while (l < n && it->tokens[l] == tokens[l]) ++l;
    if (l > best_len) {
      best_len = l;
      best = it;
    }
  }
  *len = best_len;
  return best;
}

int PrefixCache::lookup(const std::vector<int32_t>& prompt, KvCache& dst, uint64_t tag) {
  size_t best_len = 0;
  const auto it = prompt.empty() ? entries_.end() : best(prompt, prompt.size() - 1, tag, &best_len);
  if (it == entries_.end()) return 0;
  dst.copy_from(*it->cache);
  if (!dst.truncate(int(best_len))) {
    dst.truncate(0);
    return 0;
  }
  entries_.splice(entries_.begin(), entries_, it);  // mark as recently used
  return int(best_len);
}

bool PrefixCache::evict_oldest() {
  if (entries_.empty()) return false;
  erase(std::prev(entries_.end()));
  return true;
}

PrefixCache::Match PrefixCache::longest(const std::vector<int32_t>& tokens, size_t max_len) {
  size_t len = 0;
  const auto it = best(tokens, max_len, 0, &len);
  if (it == entries_.end()) return {};
  return Match{&it->tokens, it->cache.get(), len};
}

}  // namespace g4
