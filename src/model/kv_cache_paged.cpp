// KvCache over a KvPool (model/kv_cache.h, "Paged"): block tables, copy-on-write, window release,
// and the paged layers' state sections.
#include <algorithm>
#include <cstring>

#include "model/kv_cache.h"

namespace g4 {

void KvCache::init_paged() {
  G4_CHECK(opt_.quant.bits == 0 && "KvCache: paged storage holds unquantized KV only");
  const int len = pool_->table_len();
  for (int g = 0; g < KvPool::kGroups; ++g) {
    if (!pool_->has_group(KvPool::Group(g))) continue;
    table_[size_t(g)].assign(size_t(len), -1);
    table_dev_[size_t(g)] = be_.alloc_i32(size_t(len));
    table_dirty_[size_t(g)] = true;
  }
  for (size_t i = 0; i < buf_.size(); ++i) {
    const LayerSpec& ls = cfg_.layers[i];
    if (!owns(i)) continue;
    if (ls.kind == AttnKind::Sliding) window_ = std::max(window_, ls.window);
    const size_t g = size_t(KvPool::group_of(ls));
    KvBuffer b = pool_->layer(int(i));
    b.table = static_cast<const int32_t*>(table_dev_[g].data);
    b.table_host = table_[g].data();
    b.capacity = 0;
    buf_[i] = b;
  }  // the tables reach backend memory with the first reserve, copy_from or load_state
}

void KvCache::upload_tables() {
  for (int g = 0; g < KvPool::kGroups; ++g) {
    if (!table_dirty_[size_t(g)]) continue;
    be_.write_bytes(table_[size_t(g)].data(), table_[size_t(g)].size() * 4, table_dev_[size_t(g)]);
    table_dirty_[size_t(g)] = false;
  }
}

void KvCache::set_capacity(int cap) {
  for (size_t i = 0; i < buf_.size(); ++i)
    if (owns(i)) buf_[i].capacity = cap;
}

void KvCache::drop_block(KvPool::Group g, int b) {
  int32_t& e = table_[g][size_t(b)];
  if (e < 0) return;
  pool_->release(g, e);
  e = -1;
  table_dirty_[g] = true;
}

void KvCache::drop_all_blocks() {
  for (int g = 0; g < KvPool::kGroups; ++g)
    for (size_t b = 0; b < table_[size_t(g)].size(); ++b) drop_block(KvPool::Group(g), int(b));
}

int KvCache::first_sliding_block(int size) const {
  const int B = pool_->block();
  return std::max(0, size - window_ - B) / B;
}

bool KvCache::map_blocks(KvPool::Group g, int lo, int hi, bool copy_shared) {
  const int B = pool_->block();
  for (int b = lo / B; hi > lo && b <= (hi - 1) / B; ++b) {
    int32_t& e = table_[g][size_t(b)];
    if (e < 0) {
      e = pool_->take(g);
      if (e < 0) return false;
      table_dirty_[g] = true;
    } else if (copy_shared && pool_->refs(g, e) > 1) {
      const int32_t nb = pool_->take(g);
      if (nb < 0) return false;
      pool_->copy_block(g, e, nb);
      pool_->release(g, e);
      e = nb;
      table_dirty_[g] = true;
    }
  }
  return true;
}

bool KvCache::reserve_paged(int n_new) {
  const int need = size_ + n_new;
  if (need > pool_->max_positions()) return false;
  bool ok = true;
  if (!table_[KvPool::kSliding].empty())
    for (int b = 0; b < first_sliding_block(size_); ++b) drop_block(KvPool::kSliding, b);
  for (int g = 0; g < KvPool::kGroups && ok; ++g)
    if (!table_[size_t(g)].empty()) ok = map_blocks(KvPool::Group(g), size_, need, /*copy_shared=*/true);
  // Launch bounds grow as a full layer's buffer does (doubling), so recorded steps stay few.
  const int cap = buf_.empty() ? 0 : [&] {
    for (size_t i = 0; i < buf_.size(); ++i)
      if (owns(i)) return buf_[i].capacity;
    return 0;
  }();
  if (need > cap) set_capacity(std::min(pool_->table_len() * pool_->block(), std::max(need, std::max(256, 2 * cap))));
  upload_tables();
  return ok;
}

std::array<int64_t, KvPool::kGroups> KvCache::blocks_to_map(int n_new) const {
  std::array<int64_t, KvPool::kGroups> n{};
  if (!pool_ || n_new <= 0) return n;
  const int B = pool_->block();
  for (int g = 0; g < KvPool::kGroups; ++g) {
    const auto& t = table_[size_t(g)];
    for (int b = size_ / B; !t.empty() && b <= (size_ + n_new - 1) / B && b < int(t.size()); ++b)
      if (t[size_t(b)] < 0 || pool_->refs(KvPool::Group(g), t[size_t(b)]) > 1) ++n[size_t(g)];
  }
  return n;
}

int64_t KvCache::blocks_held(KvPool::Group g) const {
  if (!pool_) return 0;
  return std::count_if(table_[g].begin(), table_[g].end(), [](int32_t e) { return e >= 0; });
}

bool KvCache::truncate_paged(int n) {
  const int B = pool_->block();
  // The sliding layers must still hold the window before position n (their first layer's
  // positions tell: every sliding layer is written with it).
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (!owns(i) || buf_[i].window == 0) continue;
    for (int p = std::max(0, n - window_); p < n; ++p)
      if (table_[KvPool::kSliding][size_t(p / B)] < 0 || buf_[i].pos[kv_slot(buf_[i], p)] != p) return false;
    break;
  }
  for (int g = 0; g < KvPool::kGroups; ++g)
    for (int b = (n + B - 1) / B; b < int(table_[size_t(g)].size()); ++b) drop_block(KvPool::Group(g), b);
  size_ = n;
  upload_tables();
  return true;
}

void KvCache::copy_from_paged(const KvCache& o) {
  G4_CHECK(o.pool_ == pool_ && "KvCache::copy_from: caches of different pools");
  drop_all_blocks();
  for (int g = 0; g < KvPool::kGroups; ++g) {
    table_[size_t(g)] = o.table_[size_t(g)];
    table_dirty_[size_t(g)] = !table_[size_t(g)].empty();
    for (int32_t e : table_[size_t(g)])
      if (e >= 0) pool_->retain(KvPool::Group(g), e);
  }
  // The vectors kept their storage (same length), so the layers' table_host pointers hold.
  for (size_t i = 0; i < buf_.size(); ++i)
    if (owns(i)) buf_[i].capacity = o.buf_[i].capacity;
  size_ = o.size_;
  upload_tables();
}

template <class Fn>
void KvCache::for_runs(KvPool::Group g, int lo, int hi, int ring, Fn&& fn) const {
  const int B = pool_->block();
  for (int p = lo; p < hi;) {
    int end = std::min(hi, (p / B + 1) * B);
    if (ring > 0) end = std::min(end, p + (ring - p % ring));
    const int32_t e = table_[g][size_t(p / B)];
    if (e >= 0) fn(p, end - p, int64_t(e) * B + p % B);
    p = end;
  }
}

int KvCache::state_ring() const { return window_ + 2 * pool_->block(); }

void KvCache::save_paged_layer(size_t i, int slots, std::vector<uint8_t>& out) const {
  const KvBuffer& b = buf_[i];
  const KvPool::Group g = KvPool::group_of(cfg_.layers[i]);
  const bool ring = b.window > 0;
  const size_t rb = b.row_floats() * b.k.elem_bytes();
  const size_t at = out.size();
  out.resize(at + 2 * size_t(slots) * rb + size_t(slots) * 4, 0);
  std::vector<int32_t> pos(size_t(slots), -1);
  const int lo = ring ? std::max(0, size_ - slots) : 0;
  for_runs(g, lo, size_, ring ? slots : 0, [&](int p0, int count, int64_t slot) {
    const int dst = ring ? p0 % slots : p0;
    const auto views = slot_bytes(b, int(slot), count);
    be_.read_bytes(views[0].first, views[0].second, out.data() + at + size_t(dst) * rb);
    be_.read_bytes(views[1].first, views[1].second, out.data() + at + (size_t(slots) + size_t(dst)) * rb);
    for (int t = 0; t < count; ++t) pos[size_t(dst + t)] = p0 + t;
  });
  std::memcpy(out.data() + at + 2 * size_t(slots) * rb, pos.data(), size_t(slots) * 4);
}

Status KvCache::load_paged_layer(size_t i, int slots, int size, const uint8_t* k, const uint8_t* v,
                                 const int32_t* pos) {
  const KvBuffer& b = buf_[i];
  const KvPool::Group g = KvPool::group_of(cfg_.layers[i]);
  const bool ring = b.window > 0;
  const size_t rb = b.row_floats() * b.k.elem_bytes();
  // Every position the cache needs must be in the state: a full layer's all, a sliding layer's window.
  for (int p = ring ? std::max(0, size - b.window) : 0; p < size; ++p)
    if (pos[ring ? p % slots : p] != p) return err("position %d is missing", p);
  // Positions below a sliding window that the ring no longer holds stay empty (pos -1).
  const int lo = ring ? first_sliding_block(size) * pool_->block() : 0;
  for_runs(g, lo, size, ring ? slots : 0, [&](int p0, int count, int64_t slot) {
    const int src = ring ? p0 % slots : p0;
    for (int t = 0; t < count; ++t)
      if (pos[src + t] != p0 + t) return;
    const auto views = slot_bytes(b, int(slot), count);
    be_.write_bytes(k + size_t(src) * rb, views[0].second, views[0].first);
    be_.write_bytes(v + size_t(src) * rb, views[1].second, views[1].first);
    for (int t = 0; t < count; ++t) b.pos[slot + t] = p0 + t;
  });
  return Status::ok();
}

}  // namespace g4
