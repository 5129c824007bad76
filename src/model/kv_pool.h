// A pool of fixed-size KV blocks shared by every sequence of a serving engine (paged KV, as vLLM
// keeps it): per layer that owns KV, one K and one V array [blocks * block, n_kv_heads, head_dim]
// in the backend's activation dtype, and a host positions array (backend.h KvBuffer::pos).
// Blocks come in two groups, one per attention kind: the full-attention layers share one block
// numbering (pool block b holds the same positions in each of them), the sliding layers another,
// since a sliding layer needs only its window's blocks and a full layer every position's.
// A sequence's KvCache maps its logical blocks (position / block) to pool blocks, one table per
// group. Blocks are reference counted: prefix-cache entries and the sequences started from them
// share blocks without copying; a shared block is copied before it is written (KvCache::reserve).
// Unquantized KV only (--kv-bits keeps per-sequence caches).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"

namespace g4 {

// An empty KV buffer of layer l's geometry: its KV heads, head_dim and window (0: full attention).
inline KvBuffer layer_kv(const LayerSpec& l) {
  KvBuffer b;
  b.n_kv_heads = l.n_kv_heads;
  b.head_dim = l.head_dim;
  b.window = l.kind == AttnKind::Sliding ? l.window : 0;
  return b;
}

class KvPool {
 public:
  enum Group { kFull = 0, kSliding = 1 };
  static constexpr int kGroups = 2;
  static Group group_of(const LayerSpec& l) { return l.kind == AttnKind::Sliding ? kSliding : kFull; }

  // Bytes one block of group g takes over the group's layers (K and V of elem_bytes elements).
  static size_t block_bytes(const ModelConfig& cfg, Group g, int block, int elem_bytes);
  // Blocks per group for a pool of `bytes`, shared in proportion to what one sequence of `context`
  // tokens needs at most in each group (full: every position; sliding: the window and a prompt
  // chunk, chunk_rows, beside it).
  static std::array<int64_t, kGroups> blocks_for_bytes(const ModelConfig& cfg, int block, int elem_bytes,
                                                       uint64_t bytes, int context, int chunk_rows);
  // Blocks group g needs for one sequence of `tokens` positions written `chunk_rows` at a time
  // (sliding: bounded by its window), one more for a copy-on-write of a shared block.
  static int64_t sequence_blocks(const ModelConfig& cfg, Group g, int block, int64_t tokens, int chunk_rows);

  // block: positions per block (a power of two); blocks: per group; max_positions: the most
  // positions one sequence holds (its tables' length).
  KvPool(const ModelConfig& cfg, Backend& be, int block, std::array<int64_t, kGroups> blocks, int max_positions);
  ~KvPool();
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;

  int block() const { return block_; }
  int max_positions() const { return max_positions_; }
  // Entries of a sequence's table (logical blocks of max_positions).
  int table_len() const { return (max_positions_ + block_ - 1) / block_; }
  bool has_group(Group g) const { return total_[g] > 0; }
  int64_t total_blocks(Group g) const { return total_[g]; }
  int64_t free_blocks(Group g) const { return int64_t(free_[g].size()); }
  size_t block_bytes(Group g) const { return block_bytes_[g]; }
  size_t bytes() const;

  // A free block of group g with one reference, or -1 when none is free.
  int32_t take(Group g);
  void retain(Group g, int32_t b) { ++refs_[g][size_t(b)]; }
  // Drops a reference; the block is free again at zero.
  void release(Group g, int32_t b);
  int refs(Group g, int32_t b) const { return refs_[g][size_t(b)]; }
  // Copies block `from`'s K/V rows and positions into block `to` in every layer of group g.
  void copy_block(Group g, int32_t from, int32_t to);

  // Owning layer i's storage (k, v, pos, pool_slots, block, geometry); the caller sets the table
  // and capacity (KvCache).
  const KvBuffer& layer(int i) const { return layers_[size_t(i)]; }

 private:
  const ModelConfig& cfg_;
  Backend& be_;
  int block_;
  int max_positions_;
  std::array<int64_t, kGroups> total_{};
  std::array<size_t, kGroups> block_bytes_{};
  std::array<std::vector<int32_t>, kGroups> free_;  // free block ids (a stack: the most recently freed on top)
  std::array<std::vector<int32_t>, kGroups> refs_;
  std::vector<KvBuffer> layers_;  // indexed by layer; empty for KV-shared layers
};

}  // namespace g4
