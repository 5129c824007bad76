// The device arrays of the routed experts' DevWeights (one per projection of a MoE layer) that the
// device MoE kernels index by expert (cuda_moe.h MoeMatArgs::w), uploaded once per projection.
//
// Expert parallelism (parallel/tp_source.h): another rank's expert is a 0-row view. Its slot gets
// a zero expert shaped like the first held expert: all-zero bytes decode to 0 in every format (GGUF
// blocks with zero scales, MLX affine with zero scales and biases, bf16 / f16 zeros), so the GEMVs
// and grouped GEMMs compute exactly 0 for its items without a branch, reading one shared block of
// zeros per size.
#pragma once
#include <cstddef>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_alloc.h"
#include "backend/cuda/cuda_dequant.cuh"
#include "quant/weight.h"

namespace g4::cuda {

class ExpertTables {
 public:
  ExpertTables(DeviceAllocator& mem, const Device& dev) : mem_(mem), dev_(dev) {}
  // The table of one projection's experts (placed weights, which live as long as the backend; keyed
  // by the first held expert's device address).
  const DevWeight* table(const std::vector<WeightView>& experts);
  // The first expert with rows (this rank's, under expert parallelism), else the first.
  static const WeightView& first_held(const std::vector<WeightView>& experts);

 private:
  const void* zeros(size_t bytes);

  DeviceAllocator& mem_;
  const Device& dev_;
  std::unordered_map<const void*, const DevWeight*> tables_;
  std::unordered_map<size_t, void*> zero_blocks_;  // size -> device zeros
};

}  // namespace g4::cuda
