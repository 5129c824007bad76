// make_cuda_backend, cuda_step_counts and cuda_prefill_on_blas for builds without CUDA (-DG4_CUDA=OFF, the default): the CUDA build defines
// it in backend/cuda/cuda_backend.cu instead.
#include "backend/backend.h"

#ifndef G4_HAVE_CUDA
namespace g4 {
std::unique_ptr<Backend> make_cuda_backend(std::string* why, const BackendOptions&) {
  if (why) *why = "this build has no CUDA support (configure with -DG4_CUDA=ON and the CUDA toolkit)";
  return nullptr;
}
bool cuda_step_counts(const Backend&, CudaStepCounts*) { return false; }
bool cuda_prefill_on_blas(const Backend&) { return false; }
}  // namespace g4
#endif
