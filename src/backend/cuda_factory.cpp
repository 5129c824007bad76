// make_cuda_backend, cuda_step_counts, cuda_prefill_on_blas, make_cuda_grad_arith and
// make_nccl_group for builds without CUDA (-DG4_CUDA=OFF, the default): the CUDA build defines them
// in backend/cuda/cuda_backend.cu, cuda_grad_arith.cu and cuda_nccl.cu instead.
#include "backend/backend.h"
#include "backend/grad_arith.h"
#include "parallel/nccl_communicator.h"

#ifndef G4_HAVE_CUDA
namespace g4 {
std::unique_ptr<Backend> make_cuda_backend(std::string* why, const BackendOptions&) {
  if (why) *why = "this build has no CUDA support (configure with -DG4_CUDA=ON and the CUDA toolkit)";
  return nullptr;
}
std::unique_ptr<GradArith> make_cuda_grad_arith(std::string* why, const BackendOptions&) {
  if (why) *why = "this build has no CUDA support (configure with -DG4_CUDA=ON and the CUDA toolkit)";
  return nullptr;
}
bool cuda_step_counts(const Backend&, CudaStepCounts*) { return false; }
bool cuda_prefill_on_blas(const Backend&) { return false; }
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<int>&) {
  return err("NCCL collectives need a CUDA build (configure with -DG4_CUDA=ON and the CUDA toolkit)");
}
}  // namespace g4
#endif
