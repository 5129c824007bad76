// DeviceAllocator, GrowBuffer and DeviceTables (cuda_alloc.h).
#include "backend/cuda/cuda_alloc.h"

#include <algorithm>

#include "backend/host_backend.h"
#include "backend/cuda/cuda_check.h"

namespace g4::cuda {

DeviceAllocator::~DeviceAllocator() {
  collect();
  for (auto& [p, n] : owned_) cudaFree(p);
}

void* DeviceAllocator::alloc(size_t bytes) {
  void* p = nullptr;
  G4_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
  std::lock_guard<std::mutex> lock(mu_);
  owned_[p] = bytes;
  bytes_ += bytes;
  return p;
}

void* DeviceAllocator::upload(const void* host, size_t bytes) {
  void* d = alloc(bytes + 16);
  if (bytes) G4_CUDA(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return d;
}

void* DeviceAllocator::upload_blocks(const void* host, size_t bytes, size_t stride, size_t n) {
  if (stride == bytes || n <= 1) return upload(host, bytes * n);
  void* d = alloc(bytes * n + 16);
  if (bytes) G4_CUDA(cudaMemcpy2D(d, bytes, host, stride, bytes, n, cudaMemcpyHostToDevice));
  return d;
}

void DeviceAllocator::free(void* p, bool deferred) {
  if (!p) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = owned_.find(p);
    if (it == owned_.end()) return;
    bytes_ -= it->second;
    owned_.erase(it);
    if (deferred) {
      retired_.push_back(p);
      return;
    }
  }
  G4_CUDA(cudaFree(p));
}

void DeviceAllocator::collect() {
  std::vector<void*> r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r.swap(retired_);
  }
  if (r.empty()) return;
  dev_.sync();  // a step queued before this call may still read them (StepRecorder keeps one in flight)
  for (void* p : r) G4_CUDA(cudaFree(p));
}

size_t DeviceAllocator::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

void* GrowBuffer::get(DeviceAllocator& a, size_t bytes, const Device& dev, bool zero) {
  if (bytes <= n_) return p_;
  if (p_) a.free(p_, /*deferred=*/true);
  p_ = a.alloc(bytes);
  n_ = bytes;
  if (zero) G4_CUDA(cudaMemsetAsync(p_, 0, bytes, dev.stream()));
  return p_;
}

const float* DeviceTables::inv_freq(const std::vector<float>& host) {
  std::lock_guard<std::mutex> lock(mu_);
  RopeCopy& c = rope_[host.data()];
  if (c.dev && c.host == host) return c.dev;
  if (c.dev) a_.free(c.dev, /*deferred=*/true);  // launches logged or in flight may still read it
  c.dev = static_cast<float*>(a_.upload(host.data(), host.size() * 4));
  c.host = host;
  return c.dev;
}

const uint16_t* DeviceTables::gelu_table() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!gelu_) {
    const std::vector<uint16_t>& t = ggml_gelu_f16_table();
    gelu_ = static_cast<const uint16_t*>(a_.upload(t.data(), t.size() * 2));
  }
  return gelu_;
}

}  // namespace g4::cuda
