// Checked CUDA calls for the backend's host code: a failing call aborts with the call, the file and
// line, and CUDA's message (a CUDA error leaves the context unusable: there is nothing to resume).
#pragma once
#include <cuda_runtime.h>

namespace g4::cuda {

[[noreturn]] void cuda_failed(cudaError_t e, const char* what, const char* file, int line);
inline void check(cudaError_t e, const char* what, const char* file, int line) {
  if (e != cudaSuccess) cuda_failed(e, what, file, line);
}

}  // namespace g4::cuda

#define G4_CUDA(call) ::g4::cuda::check((call), #call, __FILE__, __LINE__)
// After kernel launches: launch-configuration errors surface here, faults at the next sync.
#define G4_CUDA_LAUNCHED() ::g4::cuda::check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)
