// Device (cuda_device.h), the checked-call failure path (cuda_check.h) and the PDL switch
// (cuda_launch.cuh).
#include "backend/cuda/cuda_device.h"

#include <cstdio>
#include <cstdlib>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {

namespace {
thread_local bool g_pdl = true;  // per thread: each backend's launches run on its own thread
}  // namespace
void set_pdl_launches(bool on) { g_pdl = on; }
bool pdl_launches() { return g_pdl; }

void cuda_failed(cudaError_t e, const char* what, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: CUDA error in %s: %s\n", file, line, what, cudaGetErrorString(e));
  std::abort();
}

Device::Device(int id) : id_(id) {
  G4_CUDA(cudaSetDevice(id));
  cudaDeviceProp p{};
  G4_CUDA(cudaGetDeviceProperties(&p, id));
  sm_count_ = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
  l2_bytes_ = size_t(p.l2CacheSize);
  smem_optin_ = p.sharedMemPerBlockOptin;
  name_ = p.name;
  G4_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Device::~Device() {
  cudaSetDevice(id_);
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

void Device::make_current() const { G4_CUDA(cudaSetDevice(id_)); }

void Device::sync() const { G4_CUDA(cudaStreamSynchronize(stream_)); }

bool device_usable(int id, std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    if (why) *why = std::string("no usable CUDA device (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") + ")";
    return false;
  }
  if (id < 0 || id >= n) {
    if (why)
      *why = "--cuda-device " + std::to_string(id) + ": this machine has " + std::to_string(n) + " CUDA device" +
             (n == 1 ? "" : "s") + " (0.." + std::to_string(n - 1) + ")";
    return false;
  }
  return true;
}

}  // namespace g4::cuda
