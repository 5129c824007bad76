// The device arrays of the routed experts' DevWeights (one per projection of a MoE layer) that the
// device MoE kernels index by expert (cuda_moe.h MoeMatArgs::w), made once per placed stack
// (CudaBackend::place_experts).
//
// Expert parallelism (parallel/tp_source.h): another rank's expert is not held. Its slot gets
// a zero expert shaped like the first held expert: all-zero bytes decode to 0 in every format (GGUF
// blocks with zero scales, MLX affine with zero scales and biases, bf16 / f16 zeros), so the GEMVs
// and grouped GEMMs compute exactly 0 for its items without a branch, reading one shared block of
// zeros per size.
#pragma once
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "quant/expert_stack.h"

#include "backend/cuda/cuda_alloc.h"
#include "backend/cuda/cuda_dequant.cuh"
#include "quant/weight.h"

namespace g4::cuda {

class ExpertTables {
 public:
  ExpertTables(DeviceAllocator& mem, const Device& dev) : mem_(mem), dev_(dev) {}
  // The table of one projection's placed experts (which live as long as the backend; keyed by the
  // first held expert's device address).
  const DevWeight* table(const ExpertStack& experts);

 private:
  const void* zeros(size_t bytes);

  DeviceAllocator& mem_;
  const Device& dev_;
  std::unordered_map<const void*, const DevWeight*> tables_;
  std::unordered_map<size_t, void*> zero_blocks_;  // size -> device zeros
};

}  // namespace g4::cuda
