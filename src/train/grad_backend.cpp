// GradBackend's tape: memory and gradients, recording, checkpoints and the backward sweep. The
// ops themselves (forward and backward of each) are in grad_ops.cpp.
#include "train/grad_backend.h"

#include <algorithm>
#include <cstring>

namespace g4::train {

void GradBackend::add_param(const void* weight_data, float* g) { params_[weight_data] = g; }

void GradBackend::arm() {
  segs_.clear();
  armed_ = true;
  recording_ = false;
}

void GradBackend::start_recording() {
  recording_ = true;
  segs_.emplace_back();
}

void GradBackend::begin_layer(int) {
  if (recording_) segs_.emplace_back();
}

Buf GradBackend::alloc(DType t, size_t n) {
  Buf b = HostBackend::alloc(t, n);
  Alloc a;
  a.bytes = n * dtype_size(t);
  a.dtype = t;
  allocs_[static_cast<const uint8_t*>(b.data)] = std::move(a);
  return b;
}

void GradBackend::free(void* p) {
  allocs_.erase(static_cast<const uint8_t*>(p));
  HostBackend::free(p);
}

float* GradBackend::grad(const Buf& b, bool create) {
  const auto* p = static_cast<const uint8_t*>(b.data);
  auto it = allocs_.upper_bound(p);
  if (it == allocs_.begin()) return nullptr;
  --it;
  Alloc& a = it->second;
  const size_t off = size_t(p - it->first);
  if (a.dtype != DType::F32 || off >= a.bytes) return nullptr;
  if (a.grad.empty()) {
    if (!create) return nullptr;
    a.grad.assign(a.bytes / 4, 0.f);
  }
  return a.grad.data() + off / 4;
}

AlignedVector<float> GradBackend::take_grad(const Buf& b, size_t n) {
  float* g = grad(b, false);
  if (!g) return {};
  AlignedVector<float> out(g, g + n);
  std::fill_n(g, n, 0.f);
  return out;
}

void GradBackend::seed_grad(const Buf& b, const float* g, size_t n) {
  float* d = grad(b, true);
  G4_CHECK(d && "GradBackend::seed_grad: not an f32 buffer of this backend");
  for (size_t i = 0; i < n; ++i) d[i] += g[i];
}

std::vector<GradBackend::Region> GradBackend::cache_rows(const KvBuffer& kv, bool value, int pos0, int n) {
  const size_t row = kv.row_floats() * 4;
  const auto* base = static_cast<const uint8_t*>((value ? kv.v : kv.k).data);
  std::vector<Region> out;
  for (int t = 0; t < n; ++t) {
    const uint8_t* p = base + size_t(kv_slot(kv, pos0 + t)) * row;
    if (!out.empty() && out.back().p + out.back().bytes == p) out.back().bytes += row;
    else out.push_back({p, row});
  }
  return out;
}

void GradBackend::write_bytes(const void* src, size_t bytes, const Buf& dst) {
  if (!recording_) return HostBackend::write_bytes(src, bytes, dst);
  // The source is the caller's and gone by the recomputation: the op keeps a copy.
  auto data = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                     static_cast<const uint8_t*>(src) + bytes);
  const size_t n = bytes / dst.elem_bytes();
  exec({{}, {region(dst, n)},
        [this, data, dst](bool) { HostBackend::write_bytes(data->data(), data->size(), dst); },
        [this, dst, n] { take_grad(dst, n); }});
}

void GradBackend::copy_bytes(const Buf& src, size_t bytes, const Buf& dst) {
  const size_t n = bytes / src.elem_bytes();
  exec({{region(src, n)}, {region(dst, n)},
        [this, src, dst, bytes](bool) { HostBackend::copy_bytes(src, bytes, dst); },
        [this, src, dst, n] {
          const AlignedVector<float> dy = take_grad(dst, n);
          float* dx = dy.empty() ? nullptr : grad(src, true);
          if (dx)
            for (size_t i = 0; i < n; ++i) dx[i] += dy[i];
        }});
}

void GradBackend::exec(Op op) {
  if (!recording_) {
    op.fwd(false);
    return;
  }
  Segment& s = segs_.back();
  auto covered = [](const std::vector<Region>& rs, const Region& r) {
    for (const Region& w : rs)
      if (w.p <= r.p && r.p + r.bytes <= w.p + w.bytes) return true;
    return false;
  };
  for (const Region& r : op.reads) {
    if (r.bytes == 0 || covered(s.written, r)) continue;
    bool saved = false;
    for (const Saved& v : s.inputs) saved = saved || (v.r.p <= r.p && r.p + r.bytes <= v.r.p + v.r.bytes);
    if (!saved) s.inputs.push_back({r, std::vector<uint8_t>(r.p, r.p + r.bytes)});
  }
  op.fwd(false);
  for (const Region& r : op.writes) s.written.push_back(r);
  s.ops.push_back(std::move(op));
}

void GradBackend::backward() {
  recording_ = false;
  armed_ = false;
  for (auto seg = segs_.rbegin(); seg != segs_.rend(); ++seg) {
    for (const Saved& v : seg->inputs) std::memcpy(const_cast<uint8_t*>(v.r.p), v.bytes.data(), v.bytes.size());
    for (Op& op : seg->ops) op.fwd(true);
    for (auto op = seg->ops.rbegin(); op != seg->ops.rend(); ++op) op->bwd();
    seg->ops.clear();
    seg->inputs.clear();
  }
  segs_.clear();
  for (auto& [p, a] : allocs_) AlignedVector<float>().swap(a.grad);
}

}  // namespace g4::train
