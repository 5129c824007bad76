// KvCache::save_state / load_state (model/kv_cache.h). Layout, little-endian:
//   u32 layers, i32 size, u8 quantized, then per layer: i32 slots (-1: a KV-shared layer, nothing
//   follows), i32 capacity, u8 bits, u8 reserved, u16 group_size, then the slots' bytes: k, v (the
//   backend's activation dtype) or kq, vq, ks, kb, vs, vb (quantized), then i32 pos[slots].
#include <cstring>

#include "model/kv_cache.h"

namespace g4 {
namespace {

struct Writer {
  std::vector<uint8_t>& out;
  template <class T>
  void put(T v) {
    const auto* b = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), b, b + sizeof v);
  }
  uint8_t* grow(size_t n) {
    out.resize(out.size() + n);
    return out.data() + out.size() - n;
  }
};

struct Reader {
  const uint8_t* p;
  size_t n;
  bool ok = true;
  template <class T>
  T get() {
    T v{};
    if (!take(sizeof v)) return v;
    std::memcpy(&v, p - sizeof v, sizeof v);
    return v;
  }
  // The next n bytes, or null when fewer are left.
  const uint8_t* take(size_t bytes) {
    if (!ok || bytes > n) {
      ok = false;
      return nullptr;
    }
    p += bytes;
    n -= bytes;
    return p - bytes;
  }
};

}  // namespace

std::vector<uint8_t> KvCache::save_own_state() const {
  std::vector<uint8_t> out;
  Writer w{out};
  w.put(uint32_t(buf_.size()));
  w.put(int32_t(size_));
  w.put(uint8_t(quantized_));
  for (size_t i = 0; i < buf_.size(); ++i) {
    const KvBuffer& b = buf_[i];
    if (!owns(i)) {
      w.put(int32_t(-1));
      continue;
    }
    const int slots = paged() ? (b.window > 0 ? state_ring() : size_)
                              : b.window > 0 ? b.capacity : std::min(size_, b.capacity);
    w.put(int32_t(slots));
    w.put(int32_t(paged() ? slots : b.capacity));
    w.put(uint8_t(b.quant.bits));
    w.put(uint8_t(0));
    w.put(uint16_t(b.quant.group_size));
    if (paged()) {  // written as a per-sequence buffer of `slots` slots would be
      save_paged_layer(i, slots, out);
      continue;
    }
    for (const auto& [buf, bytes] : slot_bytes(b, 0, slots))
      if (bytes) be_.read_bytes(buf, bytes, w.grow(bytes));
    if (slots) std::memcpy(w.grow(size_t(slots) * 4), b.pos, size_t(slots) * 4);
  }
  return out;
}

Status KvCache::load_own_state(const uint8_t* p, size_t n) {
  if (size_ != 0) return err("load_state: the cache is not empty");
  Reader r{p, n};
  const uint32_t layers = r.get<uint32_t>();
  const int32_t size = r.get<int32_t>();
  const bool quantized = r.get<uint8_t>() != 0;
  if (!r.ok || layers != buf_.size()) return err("the state has %u layers, the model %zu", layers, buf_.size());
  if (size <= 0) return err("the state holds %d tokens", size);
  if (quantized && opt_.quant.bits == 0) return err("the state is quantized, this cache is not");
  if (!quantized && opt_.quant.bits > 0 && size >= opt_.quantized_start)
    return err("the state's %d tokens are not quantized, this cache quantizes from %d", size, opt_.quantized_start);
  auto empty = [&] {  // back to a fresh cache's state
    if (paged()) {
      drop_all_blocks();
      upload_tables();
      return;
    }
    for (KvBuffer& b : buf_) {
      release(b);
      b.quant = KvQuant{};
    }
  };
  auto fail = [&](const char* what, size_t layer) {
    empty();
    return err("layer %zu: %s", layer, what);
  };
  if (paged()) {  // the blocks a cache of `size` tokens maps
    if (size > pool_->max_positions()) return err("the state's %d tokens exceed the pool's %d positions", size,
                                                  pool_->max_positions());
    const int lo[KvPool::kGroups] = {0, first_sliding_block(size) * pool_->block()};
    for (int g = 0; g < KvPool::kGroups; ++g)
      if (!table_[size_t(g)].empty() && !map_blocks(KvPool::Group(g), lo[g], size, false)) {
        empty();
        return err("the KV pool has no free blocks for the state's %d tokens", size);
      }
  }
  for (size_t i = 0; i < buf_.size(); ++i) {
    KvBuffer& b = buf_[i];
    const int32_t slots = r.get<int32_t>();
    if (!owns(i)) {
      if (slots != -1) return fail("a KV-shared layer with slots", i);
      continue;
    }
    const int32_t capacity = r.get<int32_t>();
    const int bits = r.get<uint8_t>();
    r.get<uint8_t>();
    const int group = r.get<uint16_t>();
    if (!r.ok) return fail("the state ends early", i);
    const bool want_quant = quantized && b.window == 0;
    if (bits != (want_quant ? opt_.quant.bits : 0) || (bits && group != opt_.quant.group_size))
      return fail("KV quantization differs from this cache's options", i);
    if (b.window > 0 ? (slots != capacity || capacity < b.window || capacity > b.window + (1 << 20))
                     : (slots != size || capacity < size))
      return fail("slot count does not fit the layer", i);
    if (paged()) {
      const size_t rb = b.row_floats() * b.k.elem_bytes();
      const uint8_t* k = r.take(size_t(slots) * rb);
      const uint8_t* v = r.take(size_t(slots) * rb);
      const uint8_t* pos = r.take(size_t(slots) * 4);
      if (!pos) return fail("the state ends early", i);
      std::vector<int32_t> ps(static_cast<size_t>(slots));
      std::memcpy(ps.data(), pos, size_t(slots) * 4);
      for (int s = 0; s < slots; ++s) {
        const int q = ps[size_t(s)];
        if (q >= size || q < -1 || (q >= 0 && q % slots != s) || (b.window == 0 && q != s))
          return fail("a slot holds a position it cannot hold", i);
      }
      if (Status st = load_paged_layer(i, slots, size, k, v, ps.data()); !st) return fail(st.message().c_str(), i);
      continue;
    }
    b.quant = want_quant ? opt_.quant : KvQuant{};
    allocate(b, std::max(slots, 1));
    for (const auto& [buf, bytes] : slot_bytes(b, 0, slots)) {
      const uint8_t* src = r.take(bytes);
      if (!src) return fail("the state ends early", i);
      if (bytes) be_.write_bytes(src, bytes, buf);
    }
    const uint8_t* pos = r.take(size_t(slots) * 4);
    if (!pos) return fail("the state ends early", i);
    if (slots) std::memcpy(b.pos, pos, size_t(slots) * 4);
    // A position must sit in the slot attention expects it in, below the size.
    for (int s = 0; s < slots; ++s) {
      const int q = b.pos[s];
      if (q >= size || q < -1 || (q >= 0 && q % slots != s) || (b.window == 0 && q != s))
        return fail("a slot holds a position it cannot hold", i);
    }
  }
  if (r.n != 0) {
    empty();
    return err("%zu bytes follow the state", r.n);
  }
  size_ = size;
  quantized_ = quantized;
  if (paged()) {
    set_capacity(std::min(pool_->table_len() * pool_->block(), std::max(size, 256)));
    upload_tables();
  }
  return Status::ok();
}

// A group's state (a cache with peers): kGroupMarker, the number of parts (this rank's first, then
// each peer's), and each part as a u64 length and a rank's own state. One rank's state is its own.
constexpr uint32_t kGroupMarker = 0xfffffff0u;

std::vector<uint8_t> KvCache::save_state() const {
  if (peers_.empty()) return save_own_state();
  std::vector<uint8_t> out;
  Writer w{out};
  w.put(kGroupMarker);
  w.put(uint32_t(peers_.size() + 1));
  for (size_t i = 0; i <= peers_.size(); ++i) {
    const std::vector<uint8_t> part = i == 0 ? save_own_state() : peers_[i - 1]->save_own_state();
    w.put(uint64_t(part.size()));
    std::memcpy(w.grow(part.size()), part.data(), part.size());
  }
  return out;
}

Status KvCache::load_state(const uint8_t* p, size_t n) {
  if (peers_.empty()) return load_own_state(p, n);
  Reader r{p, n};
  const uint32_t marker = r.get<uint32_t>(), parts = r.get<uint32_t>();
  if (!r.ok || marker != kGroupMarker || parts != peers_.size() + 1)
    return err("the state is not one of a %zu-rank group", peers_.size() + 1);
  for (size_t i = 0; i < parts; ++i) {
    const uint64_t len = r.get<uint64_t>();
    const uint8_t* part = r.ok ? r.take(size_t(len)) : nullptr;
    if (!part) return err("the state's part %zu is cut short", i);
    Status st = i == 0 ? load_own_state(part, size_t(len)) : peers_[i - 1]->load_own_state(part, size_t(len));
    if (!st) return err("rank %zu: %s", i, st.message().c_str());
  }
  return {};
}

}  // namespace g4
