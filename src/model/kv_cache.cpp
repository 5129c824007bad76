#include "model/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "quant/affine_quantize.h"

namespace g4 {

Status validate_kv_options(const KvCacheOptions& opt, const ModelConfig& cfg, const Backend& be) {
  if (opt.quantized_start < 0) return err("--quantized-kv-start must be >= 0, got %d", opt.quantized_start);
  const KvQuant& q = opt.quant;
  if (q.bits == 0) return Status::ok();
  if (!affine_quant_supported(q.bits, 64))
    return err("--kv-bits: expected 2, 3, 4, 5, 6 or 8, got %d", q.bits);
  if (!affine_quant_supported(q.bits, q.group_size))
    return err("--kv-group-size: expected 32, 64 or 128, got %d", q.group_size);
  if (!be.supports_kv_quant())
    return err("--kv-bits: backend '%s' has no quantized KV cache (use --backend cpu or reference)",
               be.name().c_str());
  for (size_t i = 0; i < cfg.layers.size(); ++i) {
    const LayerSpec& ls = cfg.layers[i];
    if (ls.kv_source >= 0 || ls.kind == AttnKind::Sliding) continue;
    if (ls.head_dim % q.group_size != 0)
      return err("--kv-group-size %d does not divide the head_dim %d of layer %zu", q.group_size,
                 ls.head_dim, i);
  }
  return Status::ok();
}

KvCache::KvCache(const ModelConfig& cfg, Backend& be, KvCacheOptions opt, std::shared_ptr<KvPool> pool)
    : cfg_(cfg), be_(be), opt_(opt), pool_(std::move(pool)) {
  for (const LayerSpec& ls : cfg.layers) buf_.push_back(layer_kv(ls));
  if (pool_) init_paged();
}

KvCache::~KvCache() {
  if (pool_) {
    drop_all_blocks();
    for (Buf& t : table_dev_) be_.free(t);
    return;
  }
  for (KvBuffer& b : buf_) release(b);
}

void KvCache::allocate(KvBuffer& b, int cap) {
  b.capacity = cap;
  const size_t n = size_t(cap);
  if (b.quantized()) {
    b.kq = be_.alloc(DType::U8, n * b.row_code_bytes()).as<uint8_t>();
    b.vq = be_.alloc(DType::U8, n * b.row_code_bytes()).as<uint8_t>();
    for (float** p : {&b.ks, &b.kb, &b.vs, &b.vb}) *p = be_.alloc_f32(n * b.row_groups()).f32();
  } else {
    b.k = be_.alloc_act(n * b.row_floats());
    b.v = be_.alloc_act(n * b.row_floats());
  }
  b.pos = new int32_t[n];
  std::fill(b.pos, b.pos + n, -1);
}

void KvCache::release(KvBuffer& b) {
  for (void* p : {b.k.data, b.v.data, static_cast<void*>(b.kq),
                  static_cast<void*>(b.vq), static_cast<void*>(b.ks), static_cast<void*>(b.kb),
                  static_cast<void*>(b.vs), static_cast<void*>(b.vb)})
    be_.free(p);
  delete[] b.pos;
  b.k = b.v = Buf();
  b.ks = b.kb = b.vs = b.vb = nullptr;
  b.kq = b.vq = nullptr;
  b.pos = nullptr;
  b.capacity = 0;
}

std::vector<std::pair<Buf, size_t>> KvCache::slot_bytes(const KvBuffer& b, int first, int count) const {
  const size_t f = size_t(first), n = size_t(count);
  if (b.quantized()) {
    const size_t cb = b.row_code_bytes(), ng = b.row_groups();
    const int dev = be_.on_device() ? 0 : -1;
    auto codes = [&](uint8_t* p) { return std::pair{Buf(p + f * cb, DType::U8, 0, dev), n * cb}; };
    auto f32 = [&](float* p) { return std::pair{Buf(p + f * ng, DType::F32, 0, dev), n * ng * 4}; };
    return {codes(b.kq), codes(b.vq), f32(b.ks), f32(b.kb), f32(b.vs), f32(b.vb)};
  }
  const int64_t row = int64_t(b.row_floats());
  const size_t bytes = n * size_t(row) * b.k.elem_bytes();
  return {{b.k.at(int64_t(f) * row), bytes}, {b.v.at(int64_t(f) * row), bytes}};
}

void KvCache::copy_slots(const KvBuffer& from, int s, KvBuffer& to, int d, int count) {
  const auto src = slot_bytes(from, s, count), dst = slot_bytes(to, d, count);
  for (size_t i = 0; i < src.size(); ++i) be_.copy_bytes(src[i].first, src[i].second, dst[i].first);
  std::copy(from.pos + s, from.pos + s + count, to.pos + d);
}

void KvCache::grow(int li, int cap) {
  KvBuffer& b = buf_[size_t(li)];
  KvBuffer nb = b;
  allocate(nb, cap);
  // K/V rows are copied in backend memory: full layers keep slot = position (one copy), rings
  // re-slot by position.
  if (b.window == 0) {
    if (b.capacity > 0) copy_slots(b, 0, nb, 0, b.capacity);
  } else {
    for (int s = 0; s < b.capacity; ++s) {
      const int p = b.pos[s];
      if (p >= 0) copy_slots(b, s, nb, p % cap, 1);
    }
  }
  release(b);
  b = nb;
}

void KvCache::fix_capacity(int positions) {
  G4_CHECK(!pool_ && size_ == 0 && positions > 0);
  for (size_t i = 0; i < buf_.size(); ++i)
    if (owns(i) && buf_[i].capacity != positions) grow(int(i), positions);
  fixed_ = positions;
}

bool KvCache::reserve(int n_new) {
  if (pool_) return reserve_paged(n_new);
  if (fixed_ > 0) return size_ + n_new <= fixed_;
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (!owns(i)) continue;
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
  return true;
}

void KvCache::advance(int n) {
  size_ += n;
  if (opt_.quant.bits > 0 && !quantized_ && size_ >= opt_.quantized_start) quantize_full_layers();
}

// mlx-lm KVCache.to_quantized: every cached row of the full layers through mx.quantize. Full
// layers hold position p in slot p, so the first size_ slots are the rows to convert.
void KvCache::quantize_full_layers() {
  for (size_t i = 0; i < buf_.size(); ++i) {
    KvBuffer& b = buf_[i];
    if (!owns(i) || b.window > 0 || b.quantized()) continue;
    KvBuffer nb = b;
    nb.k = nb.v = Buf();
    nb.quant = opt_.quant;
    allocate(nb, std::max(b.capacity, 1));
    AttnSeq all;
    all.row0 = 0;
    all.n = size_;
    all.pos0 = 0;
    all.kv = nb;
    if (size_ > 0) be_.kv_write(all, b.k, b.v);
    release(b);
    b = nb;
  }
  be_.sync();
  quantized_ = true;
}

bool KvCache::truncate_own(int n) {
  if (n >= size_) return n == size_;
  if (pool_) return truncate_paged(n);
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (!owns(i)) continue;
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

void KvCache::copy_from_own(const KvCache& o) {
  if (pool_) return copy_from_paged(o);
  for (size_t i = 0; i < buf_.size(); ++i) {
    if (!owns(i)) continue;
    const KvBuffer& src = o.buf_[i];
    KvBuffer& b = buf_[i];
    if (b.capacity != src.capacity || b.quant.bits != src.quant.bits) {
      release(b);
      b.quant = src.quant;
      allocate(b, src.capacity);
    }
    if (b.capacity > 0) copy_slots(src, 0, b, 0, b.capacity);
  }
  size_ = o.size_;
  quantized_ = o.quantized_;
}

size_t KvCache::own_bytes() const {
  size_t t = 0;
  if (pool_) {
    for (int g = 0; g < KvPool::kGroups; ++g)
      t += size_t(blocks_held(KvPool::Group(g))) * pool_->block_bytes(KvPool::Group(g));
    return t;
  }
  for (const KvBuffer& b : buf_) {
    const size_t per_slot = b.quantized() ? 2 * (b.row_code_bytes() + 2 * 4 * b.row_groups())
                                          : 2 * b.row_floats() * dtype_size(be_.activation_dtype());
    t += size_t(b.capacity) * (per_slot + 4);
  }
  return t;
}

bool KvCache::truncate(int n) {
  bool ok = truncate_own(n);
  for (auto& p : peers_) ok = p->truncate_own(n) && ok;  // the same geometry: the same answer
  return ok;
}

void KvCache::copy_from(const KvCache& o) {
  G4_CHECK(o.peers_.size() == peers_.size() && "KvCache::copy_from: caches of groups of different sizes");
  copy_from_own(o);
  for (size_t i = 0; i < peers_.size(); ++i) peers_[i]->copy_from_own(*o.peers_[i]);
}

size_t KvCache::bytes() const {
  size_t b = own_bytes();
  for (const auto& p : peers_) b += p->own_bytes();
  return b;
}

}  // namespace g4
