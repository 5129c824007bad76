// Per-sequence KV caches: one KvBuffer per layer that owns its KV (KV-shared layers read their
// donor's). Full layers grow by doubling (outside the decode step); sliding layers are rings whose
// capacity is window + largest chunk - 1, so their memory is bounded by the window.
//
// Quantized KV (KvCacheOptions::quant.bits > 0), mlx-lm's `--kv-bits` semantics: once the cache
// holds `quantized_start` tokens or more after a forward step (mlx-lm maybe_quantize_kv_cache,
// checked after every model call), the full-attention layers' K and V are converted to MLX affine
// codes (backend.h KvBuffer; mlx-lm QuantizedKVCache), and every later token is quantized as it is
// written. Sliding-window rings keep f32 rows: their memory is bounded by the window, and mlx-lm
// 0.32.2 cannot quantize them either (RotatingKVCache.to_quantized raises NotImplementedError).
// KV-shared layers read their donor's cache, quantized or not.
//
// Paged (a KvPool given; model/kv_pool.h): the layers' rows live in the pool's blocks, mapped by a
// table per group that KvCache keeps on the host and mirrors into backend memory; full and sliding
// layers both index by position, sliding layers returning the blocks below their window to the
// pool. copy_from shares blocks instead of copying them; a shared block is copied before written.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "core/config.h"
#include "model/kv_pool.h"

namespace g4 {

struct KvCacheOptions {
  KvQuant quant;             // bits 0: f32 caches
  int quantized_start = 0;   // tokens before the full layers' KV is quantized (mlx-lm: 5000)
};

// Whether `opt` can run for this model on this backend: bits / group size MLX supports, a group
// that divides every full-attention layer's head_dim, a backend that takes quantized KV. The
// message names the flag (--kv-bits / --kv-group-size) and what is wrong.
Status validate_kv_options(const KvCacheOptions& opt, const ModelConfig& cfg, const Backend& be);

class KvCache {
 public:
  // pool: paged storage (unquantized options only), or null for per-sequence buffers.
  KvCache(const ModelConfig& cfg, Backend& be, KvCacheOptions opt = {}, std::shared_ptr<KvPool> pool = nullptr);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // Makes room for n_new tokens after the current ones (may allocate; call before forward).
  // False only for a paged cache whose pool has too few free blocks (or past its max_positions):
  // the blocks taken so far stay mapped, nothing else changes.
  bool reserve(int n_new);
  // A cache that never holds more than `positions` tokens (the decode pad sequence, which writes
  // position 0 again every step: Model::set_decode_padding): storage for exactly that many slots
  // in every layer it owns, sliding layers' rings included (shorter than their window, which is
  // safe while no position wraps). reserve then never grows it and answers false past `positions`.
  // Per-sequence buffers only (a paged cache maps blocks as reserve does); call on a fresh cache.
  void fix_capacity(int positions);
  bool paged() const { return pool_ != nullptr; }
  // Paged: blocks of group g this cache maps now, and the free blocks reserve(n_new) would take
  // from each group (unmapped or shared blocks of the positions it writes).
  int64_t blocks_held(KvPool::Group g) const;
  std::array<int64_t, KvPool::kGroups> blocks_to_map(int n_new) const;
  // Number of tokens already in the cache (= next position).
  int size() const { return size_; }
  // Called by the model after a forward pass consumed n tokens; quantizes the full layers when
  // the cache reaches the options' quantized_start.
  void advance(int n);
  // Forgets everything after the first n tokens (n <= size). Sliding layers keep only the
  // positions still in their ring; rolling back past those is refused (returns false).
  bool truncate(int n);
  // Copies the full state of `other` (same config and options) into this cache.
  void copy_from(const KvCache& other);

  // The cache's state as bytes, for a prompt cache on disk (runtime/prompt_store.h): the size, and
  // every owned layer's occupied slots (full layers: the first size() slots; sliding rings: all
  // slots, their positions included), copied to the host. load_state fills a fresh cache of the
  // same config and options from such bytes, checking every count, size and position against
  // this cache's geometry (a false message names what does not fit; the cache is then empty).
  std::vector<uint8_t> save_state() const;
  Status load_state(const uint8_t* p, size_t n);

  // Tensor parallelism: the same sequence's caches on the group's other ranks (a group leader's
  // Model::new_cache adds them; model/model.h set_peers). truncate, copy_from, save_state /
  // load_state and bytes cover them too; reserve and advance do not (each rank's forward calls
  // them on its own cache).
  void add_peer(std::unique_ptr<KvCache> c) { peers_.push_back(std::move(c)); }
  size_t peers() const { return peers_.size(); }
  KvCache* peer(size_t i) const { return peers_[i].get(); }

  const KvBuffer& layer(int i) const { return buf_[size_t(i)]; }
  // Whether the full layers hold quantized KV now.
  bool quantized() const { return quantized_; }
  size_t bytes() const;

 private:
  bool owns(size_t layer) const { return cfg_.layers[layer].kv_source < 0; }
  // This rank's part of truncate, copy_from, save_state, load_state and bytes.
  bool truncate_own(int n);
  void copy_from_own(const KvCache& other);
  std::vector<uint8_t> save_own_state() const;
  Status load_own_state(const uint8_t* p, size_t n);
  size_t own_bytes() const;
  // Allocates storage for `capacity` slots in b's format (quantized or f32), positions empty.
  void allocate(KvBuffer& b, int capacity);
  void release(KvBuffer& b);
  // Copies slots [s, s+count) of `from` into slots [d, d+count) of `to` (same format).
  void copy_slots(const KvBuffer& from, int s, KvBuffer& to, int d, int count);
  // The backend memory of slots [first, first + count) of b, one range per array in a fixed order
  // (k, v; quantized: k codes, v codes, k scales, k biases, v scales, v biases) and its bytes.
  std::vector<std::pair<Buf, size_t>> slot_bytes(const KvBuffer& b, int first, int count) const;
  void grow(int layer, int capacity);
  void quantize_full_layers();

  // Paged storage (kv_cache_paged.cpp).
  void init_paged();
  bool reserve_paged(int n_new);
  bool truncate_paged(int n);
  void copy_from_paged(const KvCache& o);
  void drop_block(KvPool::Group g, int b);  // unmaps logical block b (its reference released)
  void drop_all_blocks();
  // Maps every unmapped block of positions [lo, hi) of group g, and copies shared ones among them
  // (copy_shared); false when the pool runs out.
  bool map_blocks(KvPool::Group g, int lo, int hi, bool copy_shared);
  // The first block a sliding layer still needs when the cache holds `size` tokens: one block
  // below its window stays mapped, so a short rollback (truncate) finds its keys.
  int first_sliding_block(int size) const;
  void set_capacity(int cap);
  void upload_tables();  // the tables that changed since their last upload
  // Calls fn(p0, count, slot) for the runs of positions [lo, hi) that sit in consecutive pool
  // slots of group g (one block at most) and, with ring > 0, in consecutive ring slots p % ring.
  template <class Fn>
  void for_runs(KvPool::Group g, int lo, int hi, int ring, Fn&& fn) const;
  // The ring a paged sliding layer's state is written as (kv_cache_state.cpp).
  int state_ring() const;
  // A paged layer's state section (kv_cache_state.cpp's layout) written / read: slots rows of k
  // and v, then pos[slots]; load: the tables already map what a cache of `size` tokens holds.
  void save_paged_layer(size_t layer, int slots, std::vector<uint8_t>& out) const;
  Status load_paged_layer(size_t layer, int slots, int size, const uint8_t* k, const uint8_t* v,
                          const int32_t* pos);

  const ModelConfig& cfg_;
  Backend& be_;
  KvCacheOptions opt_;
  std::vector<KvBuffer> buf_;  // indexed by layer; empty (capacity 0) for KV-shared layers
  int size_ = 0;
  int fixed_ = 0;  // fix_capacity's positions, or 0: buffers grow as reserve needs
  bool quantized_ = false;
  std::shared_ptr<KvPool> pool_;  // paged storage, or null
  std::array<std::vector<int32_t>, KvPool::kGroups> table_;  // paged: logical block -> pool block, -1: none
  std::array<Buf, KvPool::kGroups> table_dev_;               // paged: the tables in backend memory
  std::array<bool, KvPool::kGroups> table_dirty_{};          // paged: a table changed since its upload
  int window_ = 0;                                           // paged: the sliding layers' window
  std::vector<std::unique_ptr<KvCache>> peers_;             // the other ranks' (add_peer)
};

}  // namespace g4
