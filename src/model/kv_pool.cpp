#include "model/kv_pool.h"

#include <algorithm>
#include <cmath>

#include "core/status.h"

namespace g4 {
namespace {

bool owning(const LayerSpec& l) { return l.kv_source < 0; }

// Positions a sequence of `tokens` holds at most at once in group g.
int64_t held_positions(const ModelConfig& cfg, KvPool::Group g, int64_t tokens, int chunk_rows) {
  if (g == KvPool::kFull) return tokens;
  int window = 0;
  for (const LayerSpec& l : cfg.layers)
    if (owning(l) && l.kind == AttnKind::Sliding) window = std::max(window, l.window);
  return std::min<int64_t>(tokens, int64_t(window) + std::max(1, chunk_rows));
}

}  // namespace

size_t KvPool::block_bytes(const ModelConfig& cfg, Group g, int block, int elem_bytes) {
  size_t b = 0;
  for (const LayerSpec& l : cfg.layers)
    if (owning(l) && group_of(l) == g)
      b += size_t(block) * (2 * size_t(l.n_kv_heads) * size_t(l.head_dim) * size_t(elem_bytes) + 4);
  return b;
}

int64_t KvPool::sequence_blocks(const ModelConfig& cfg, Group g, int block, int64_t tokens, int chunk_rows) {
  if (block_bytes(cfg, g, block, 1) == 0) return 0;
  // The sliding group keeps a block below its window (KvCache::reserve) and may straddle two more.
  const int64_t pos = held_positions(cfg, g, tokens, chunk_rows) + (g == kSliding ? 2 * int64_t(block) : 0);
  return (std::min(pos, tokens + block - 1) + block - 1) / block + 1;
}

std::array<int64_t, KvPool::kGroups> KvPool::blocks_for_bytes(const ModelConfig& cfg, int block, int elem_bytes,
                                                              uint64_t bytes, int context, int chunk_rows) {
  std::array<double, kGroups> want{};
  double want_bytes = 0;
  for (int g = 0; g < kGroups; ++g) {
    want[size_t(g)] = double(sequence_blocks(cfg, Group(g), block, context, chunk_rows)) *
                      double(block_bytes(cfg, Group(g), block, elem_bytes));
    want_bytes += want[size_t(g)];
  }
  std::array<int64_t, kGroups> n{};
  for (int g = 0; g < kGroups; ++g) {
    const size_t bb = block_bytes(cfg, Group(g), block, elem_bytes);
    if (bb == 0 || want_bytes <= 0) continue;
    n[size_t(g)] = int64_t(std::floor(double(bytes) * (want[size_t(g)] / want_bytes) / double(bb) + 1e-6));
  }
  return n;
}

KvPool::KvPool(const ModelConfig& cfg, Backend& be, int block, std::array<int64_t, kGroups> blocks, int max_positions)
    : cfg_(cfg), be_(be), block_(block), max_positions_(max_positions) {
  G4_CHECK(block > 0 && (block & (block - 1)) == 0 && "KvPool: block size must be a power of two");
  layers_.resize(cfg.layers.size());
  const int elem = int(dtype_size(be.activation_dtype()));
  for (int g = 0; g < kGroups; ++g) {
    if (block_bytes(cfg, Group(g), block, elem) == 0) continue;
    total_[size_t(g)] = blocks[size_t(g)];
    block_bytes_[size_t(g)] = block_bytes(cfg, Group(g), block, elem);
    refs_[size_t(g)].assign(size_t(blocks[size_t(g)]), 0);
    free_[size_t(g)].resize(size_t(blocks[size_t(g)]));
    for (int64_t b = 0; b < blocks[size_t(g)]; ++b)  // block 0 on top: taken first
      free_[size_t(g)][size_t(b)] = int32_t(blocks[size_t(g)] - 1 - b);
  }
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    const LayerSpec& l = cfg.layers[i];
    KvBuffer& b = layers_[i];
    b = layer_kv(l);
    if (!owning(l)) continue;
    const int64_t slots = total_[size_t(group_of(l))] * block;
    b.block = block;
    b.pool_slots = int(slots);
    if (slots == 0) continue;
    b.k = be.alloc_act(size_t(slots) * b.row_floats());
    b.v = be.alloc_act(size_t(slots) * b.row_floats());
    b.pos = new int32_t[size_t(slots)];
    std::fill(b.pos, b.pos + slots, -1);
  }
}

KvPool::~KvPool() {
  for (KvBuffer& b : layers_) {
    be_.free(b.k);
    be_.free(b.v);
    delete[] b.pos;
  }
}

size_t KvPool::bytes() const {
  size_t t = 0;
  for (int g = 0; g < kGroups; ++g) t += size_t(total_[size_t(g)]) * block_bytes_[size_t(g)];
  return t;
}

int32_t KvPool::take(Group g) {
  auto& f = free_[g];
  if (f.empty()) return -1;
  const int32_t b = f.back();
  f.pop_back();
  refs_[g][size_t(b)] = 1;
  // No position of a former owner stays visible (KvCache checks positions before a rollback).
  for (size_t i = 0; i < layers_.size(); ++i)
    if (layers_[i].pos && group_of(cfg_.layers[i]) == g)
      std::fill(layers_[i].pos + size_t(b) * size_t(block_), layers_[i].pos + size_t(b + 1) * size_t(block_), -1);
  return b;
}

void KvPool::release(Group g, int32_t b) {
  int32_t& r = refs_[g][size_t(b)];
  G4_CHECK(r > 0 && "KvPool: a block released more often than taken");
  if (--r == 0) free_[g].push_back(b);
}

void KvPool::copy_block(Group g, int32_t from, int32_t to) {
  const size_t first = size_t(from) * size_t(block_), dst = size_t(to) * size_t(block_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    const KvBuffer& b = layers_[i];
    if (!owning(cfg_.layers[i]) || group_of(cfg_.layers[i]) != g || b.pool_slots == 0) continue;
    const int64_t row = int64_t(b.row_floats());
    const size_t bytes = size_t(block_) * size_t(row) * b.k.elem_bytes();
    be_.copy_bytes(b.k.at(int64_t(first) * row), bytes, b.k.at(int64_t(dst) * row));
    be_.copy_bytes(b.v.at(int64_t(first) * row), bytes, b.v.at(int64_t(dst) * row));
    std::copy(b.pos + first, b.pos + first + size_t(block_), b.pos + dst);
  }
}

}  // namespace g4
