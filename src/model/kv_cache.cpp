#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace g4 {

KvCache::KvCache(const ModelConfig& cfg, Backend& be) : cfg_(cfg), be_(be) {
  buf_.resize(cfg.layers.size());
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    const LayerSpec& ls = cfg.layers[i];
    KvBuffer& b = buf_[i];
    b.n_kv_heads = ls.n_kv_heads;
    b.head_dim = ls.head_dim;
    b.window = ls.kind == AttnKind::Sliding ? ls.window : 0;
  }
}

KvCache::~KvCache() {
  for (KvBuffer& b : buf_) {
    be_.free(b.k);
    be_.free(b.v);
    delete[] b.pos;
  }
}

void KvCache::grow(int li, int cap) {
  KvBuffer& b = buf_[size_t(li)];
  const size_t row = size_t(b.n_kv_heads) * b.head_dim;
  KvBuffer nb = b;
  nb.capacity = cap;
  nb.k = be_.alloc(size_t(cap) * row);
  nb.v = be_.alloc(size_t(cap) * row);
  nb.pos = new int32_t[size_t(cap)];
  std::fill(nb.pos, nb.pos + cap, -1);
  // Slots move (rings re-slot by position); K/V rows are copied in backend memory.
  for (int s = 0; s < b.capacity; ++s) {
    const int p = b.pos[s];
    if (p < 0) continue;
    const int ns = nb.window > 0 ? p % cap : p;
    be_.copy(b.k + size_t(s) * row, row, nb.k + size_t(ns) * row);
    be_.copy(b.v + size_t(s) * row, row, nb.v + size_t(ns) * row);
    nb.pos[ns] = p;
  }
  be_.free(b.k);
  be_.free(b.v);
  delete[] b.pos;
  b = nb;
}

void KvCache::reserve(int n_new) {
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (cfg_.layers[i].kv_source >= 0) continue;
    KvBuffer& b = buf_[i];
    int need;
    if (b.window > 0) {
      need = b.window + n_new - 1;
    } else {
      need = size_ + n_new;
    }
    if (need > b.capacity) {
      int cap = b.window > 0 ? need : std::max(need, std::max(256, b.capacity * 2));
      grow(int(i), cap);
    }
  }
}

bool KvCache::truncate(int n) {
  if (n >= size_) return n == size_;
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (cfg_.layers[i].kv_source >= 0) continue;
    KvBuffer& b = buf_[i];
    if (b.window > 0) {
      // The ring must still hold the window before position n.
      const int first = std::max(0, n - b.window);
      for (int p = first; p < n; ++p)
        if (b.pos[p % b.capacity] != p) return false;
    }
  }
  for (size_t i = 0; i < buf_.size(); ++i) {
    KvBuffer& b = buf_[i];
    for (int s = 0; s < b.capacity; ++s)
      if (b.pos[s] >= n) b.pos[s] = -1;
  }
  size_ = n;
  return true;
}

void KvCache::copy_from(const KvCache& o) {
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (cfg_.layers[i].kv_source >= 0) continue;
    const KvBuffer& src = o.buf_[i];
    KvBuffer& b = buf_[i];
    if (b.capacity != src.capacity) {
      be_.free(b.k);
      be_.free(b.v);
      delete[] b.pos;
      const size_t row = size_t(b.n_kv_heads) * b.head_dim;
      b.capacity = src.capacity;
      b.k = be_.alloc(size_t(b.capacity) * row);
      b.v = be_.alloc(size_t(b.capacity) * row);
      b.pos = new int32_t[size_t(b.capacity)];
    }
    const size_t row = size_t(b.n_kv_heads) * b.head_dim;
    be_.copy(src.k, size_t(b.capacity) * row, b.k);
    be_.copy(src.v, size_t(b.capacity) * row, b.v);
    std::copy(src.pos, src.pos + b.capacity, b.pos);
  }
  size_ = o.size_;
}

size_t KvCache::bytes() const {
  size_t t = 0;
  for (const KvBuffer& b : buf_) t += size_t(b.capacity) * (2 * size_t(b.n_kv_heads) * b.head_dim * 4 + 4);
  return t;
}

}  // namespace g4
