// GradBackend's tape: memory and gradients, recording, checkpoints and the backward sweep. The
// ops themselves (forward and backward of each) are in grad_ops.cpp.
#include "train/grad_backend.h"

#include <algorithm>
#include <cstring>

namespace g4::train {

GradBackend::GradBackend() : GradBackend(make_host_grad_arith()) {}
GradBackend::GradBackend(std::unique_ptr<GradArith> arith)
    : owned_(std::move(arith)), arith_(*owned_), base_(arith_.base()) {}
GradBackend::~GradBackend() = default;

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
  Buf b = base_.alloc(t, n);
  Alloc a;
  a.bytes = n * dtype_size(t);
  a.dtype = t;
  allocs_[static_cast<const uint8_t*>(b.data)] = std::move(a);
  return b;
}

void GradBackend::free(void* p) {
  allocs_.erase(static_cast<const uint8_t*>(p));
  base_.free(p);
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
    a.grad = ArithBlock(arith_, a.bytes / 4 * 4, true);
  }
  return a.grad.f32() + off / 4;
}

ArithBlock GradBackend::take_grad(const Buf& b, size_t n) {
  float* g = grad(b, false);
  if (!g) return {};
  ArithBlock out(arith_, n * 4, false);
  arith_.copy(out.data(), g, n * 4);
  arith_.zero(g, n);
  return out;
}

void GradBackend::keep(const Kept& k, const float* p, size_t n) {
  *k = ArithBlock(arith_, n * 4, false);
  arith_.copy(k->data(), p, n * 4);
}

void GradBackend::seed_grad(const Buf& b, const float* g, size_t n) {
  float* d = grad(b, true);
  G4_CHECK(d && "GradBackend::seed_grad: not an f32 buffer of this backend");
  arith_.add_from_host(g, n, d);
}

double GradBackend::head_loss(const Buf& x, int M, const WeightView& E, float cap,
                              const std::vector<int32_t>& targets, float weight, bool train) {
  float* dx = train ? grad(x, true) : nullptr;
  G4_CHECK((!train || dx) && "GradBackend::head_loss: not an f32 buffer of this backend");
  return arith_.lm_head_loss(x.f32(), M, E, cap, targets, weight, dx);
}

std::vector<int64_t> GradBackend::cache_slots(const KvBuffer& kv, int pos0, int n) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) out[size_t(t)] = kv_slot(kv, pos0 + t);
  return out;
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
  if (!recording_) return base_.write_bytes(src, bytes, dst);
  // The source is the caller's and gone by the recomputation: the op keeps a copy.
  auto data = std::make_shared<std::vector<uint8_t>>(static_cast<const uint8_t*>(src),
                                                     static_cast<const uint8_t*>(src) + bytes);
  const size_t n = bytes / dst.elem_bytes();
  exec({{}, {region(dst, n)},
        [this, data, dst](bool) { base_.write_bytes(data->data(), data->size(), dst); },
        [this, dst, n] { take_grad(dst, n); }});
}

void GradBackend::copy_bytes(const Buf& src, size_t bytes, const Buf& dst) {
  const size_t n = bytes / src.elem_bytes();
  exec({{region(src, n)}, {region(dst, n)},
        [this, src, dst, bytes](bool) { base_.copy_bytes(src, bytes, dst); },
        [this, src, dst, n] {
          const ArithBlock dy = take_grad(dst, n);
          float* dx = dy.empty() ? nullptr : grad(src, true);
          if (dx) arith_.axpy_acc(1.f, dy.f32(), n, dx);
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
    if (!saved) {
      ArithBlock copy(arith_, r.bytes, false);
      arith_.copy(copy.data(), r.p, r.bytes);
      s.inputs.push_back({r, std::move(copy)});
    }
  }
  op.fwd(false);
  for (const Region& r : op.writes) s.written.push_back(r);
  s.ops.push_back(std::move(op));
}

void GradBackend::backward() {
  recording_ = false;
  armed_ = false;
  for (auto seg = segs_.rbegin(); seg != segs_.rend(); ++seg) {
    for (const Saved& v : seg->inputs) arith_.copy(const_cast<uint8_t*>(v.r.p), v.bytes.data(), v.r.bytes);
    for (Op& op : seg->ops) op.fwd(true);
    for (auto op = seg->ops.rbegin(); op != seg->ops.rend(); ++op) op->bwd();
    seg->ops.clear();
    seg->inputs.clear();
  }
  segs_.clear();
  for (auto& [p, a] : allocs_) a.grad.reset();
}

}  // namespace g4::train
