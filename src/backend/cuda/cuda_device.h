// The GPU a CUDA backend runs on: its id, the backend's own stream, and the properties launches
// size themselves by. One Device per backend; every call on it first makes its GPU current, so
// backends of different GPUs (tensor parallelism, one thread per GPU) can live in one process.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

namespace g4::cuda {

class Device {
 public:
  // Selects GPU `id` and creates a non-blocking stream on it; aborts if either fails.
  explicit Device(int id = 0);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int id() const { return id_; }
  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }
  size_t l2_bytes() const { return l2_bytes_; }
  // Shared memory one block may take once its kernel opts in (cudaFuncSetAttribute).
  size_t smem_optin() const { return smem_optin_; }
  const std::string& name() const { return name_; }
  // Makes this GPU the calling thread's current device.
  void make_current() const;
  // Waits for everything queued on the stream.
  void sync() const;

 private:
  int id_ = 0;
  cudaStream_t stream_ = nullptr;
  int sm_count_ = 1;
  size_t l2_bytes_ = 0, smem_optin_ = 0;
  std::string name_;
};

// Whether GPU `id` exists on this machine; false with *why (naming the devices there) if not.
bool device_usable(int id, std::string* why);

}  // namespace g4::cuda
