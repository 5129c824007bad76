// Per-sequence KV caches: one KvBuffer per layer that owns its KV (KV-shared layers read their
// donor's). Full layers grow by doubling (outside the decode step); sliding layers are rings whose
// capacity is window + largest chunk - 1, so their memory is bounded by the window.
#pragma once
#include <vector>

#include "backend/backend.h"
#include "model/config.h"

namespace g4 {

class KvCache {
 public:
  KvCache(const ModelConfig& cfg, Backend& be);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Makes room for n_new tokens after the current ones (may allocate; call before forward).
  void reserve(int n_new);
  // Number of tokens already in the cache (= next position).
  int size() const { return size_; }
  // Called by the model after a forward pass consumed n tokens.
  void advance(int n) { size_ += n; }
  // Forgets everything after the first n tokens (n <= size). Sliding layers keep only the
  // positions still in their ring; rolling back past those is refused (returns false).
  bool truncate(int n);
  // Copies the full state of `other` (same config) into this cache.
  void copy_from(const KvCache& other);

  const KvBuffer& layer(int i) const { return buf_[size_t(i)]; }
  size_t bytes() const;

 private:
  void grow(int layer, int capacity);
  const ModelConfig& cfg_;
  Backend& be_;
  std::vector<KvBuffer> buf_;  // indexed by layer; empty (capacity 0) for KV-shared layers
  int size_ = 0;
};

}  // namespace g4
