// Device memory of one CUDA backend. Every allocation is tracked, so a free of a pointer the
// allocator does not own (a host backend's, or one freed before) does nothing. A free while a
// step is being recorded is deferred (retire), since the step's logged launches may still use the
// memory; collect() waits for the stream's work, then frees what was retired.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_device.h"

namespace g4::cuda {

class DeviceAllocator {
 public:
  explicit DeviceAllocator(const Device& dev) : dev_(dev) {}
  ~DeviceAllocator();  // frees everything still held (the caller has synced the stream)
  DeviceAllocator(const DeviceAllocator&) = delete;
  DeviceAllocator& operator=(const DeviceAllocator&) = delete;

  void* alloc(size_t bytes);
  // A copy of `bytes` host bytes, with 16 bytes of slack after them (the staged matmuls copy
  // whole 16-byte words, cuda_matmul.cu stage_rows).
  void* upload(const void* host, size_t bytes);
  // n blocks of `bytes` host bytes that lie `stride` bytes apart, copied back to back (one upload
  // of n * bytes, with the same slack).
  void* upload_blocks(const void* host, size_t bytes, size_t stride, size_t n);
  // Frees p now, or at the next collect() when `deferred`. Unknown pointers are ignored.
  void free(void* p, bool deferred);
  // Frees the deferred pointers once the stream's queued work is done (call outside a step).
  void collect();
  // Device bytes held.
  size_t bytes() const;

 private:
  const Device& dev_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> owned_;
  std::vector<void*> retired_;
  size_t bytes_ = 0;
};

// A scratch buffer that only grows. A replaced buffer is freed deferred (launches logged in the
// current step may point at it). With `zero`, new memory is zeroed on the stream, ahead of any
// launch queued after get().
class GrowBuffer {
 public:
  void* get(DeviceAllocator& a, size_t bytes, const Device& dev, bool zero = false);
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

// Device copies of the small host tables kernels read: RoPE inverse frequencies (one copy per host
// table; a table whose address is reused with other values is uploaded again) and ggml's GELU
// table. Thread-safe.
class DeviceTables {
 public:
  explicit DeviceTables(DeviceAllocator& a) : a_(a) {}
  const float* inv_freq(const std::vector<float>& host);
  const uint16_t* gelu_table();

 private:
  struct RopeCopy {
    std::vector<float> host;
    float* dev = nullptr;
  };
  DeviceAllocator& a_;
  std::mutex mu_;
  std::unordered_map<const float*, RopeCopy> rope_;
  const uint16_t* gelu_ = nullptr;
};

}  // namespace g4::cuda
