// ExpertTables (cuda_expert_tables.h).
#include "backend/cuda/cuda_expert_tables.h"

#include <algorithm>

#include "backend/cuda/cuda_backend_args.h"
#include "backend/cuda/cuda_check.h"

namespace g4::cuda {

const DevWeight* ExpertTables::table(const ExpertStack& experts) {
  const WeightView& held = experts.base;
  const DevWeight*& t = tables_[held.data];
  if (t) return t;
  std::vector<DevWeight> h;
  for (int e = 0; e < experts.count; ++e) {
    if (experts.holds(e)) {
      h.push_back(cuda_args::dev(experts.expert(e)));
      continue;
    }
    WeightView z = held;  // another rank's expert: zeros of the held expert's shape and format
    z.data = zeros(cuda_args::view_data_bytes(held));
    const size_t sb = cuda_args::view_scale_bytes(held);
    z.scales = held.scales ? zeros(sb) : nullptr;
    z.biases = held.biases ? zeros(sb) : nullptr;
    h.push_back(cuda_args::dev(z));
  }
  t = static_cast<const DevWeight*>(mem_.upload(h.data(), h.size() * sizeof(DevWeight)));
  return t;
}

const void* ExpertTables::zeros(size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  void*& p = zero_blocks_[bytes];
  if (!p) {
    p = mem_.alloc(bytes);
    G4_CUDA(cudaMemsetAsync(p, 0, bytes, dev_.stream()));  // ahead of every launch that reads it
  }
  return p;
}

}  // namespace g4::cuda
