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

}  // namespace g4::cuda
