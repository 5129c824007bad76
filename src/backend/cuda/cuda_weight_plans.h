// The kernel plans of the weights a CUDA backend placed, chosen once at placement
// (CudaBackend::place_weight, place_stack): for each group of weights one op launches together (a
// layer's q|k|v of one layout, gate gating up, or one weight alone), how its one-row int8 GEMV
// reads them: the lanes a row takes and the row-fetch bits the weights and the backend's options
// fix. What only a call knows stays with the call: the rows of the launch (one-row GEMV, the
// tensor-core GEMV of a verify forward, cuBLAS at prefill) and whether the L2 has room beside the
// launch before (CudaBackend::plan_row_fetch). A launch whose weights are not one placed group
// (the op tests' hand-made groups, MLX mixed-precision q/k/v, which launch a GEMV per weight)
// gets the same rules at the call.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

struct GemvPlan {
  const void* parts[3] = {};  // the group's weights (device data), in the op's order
  const void* gated = nullptr;  // a gated group (StackUse::Gated): the weight the first part gates
  int n = 0;                    // parts
  int lanes = 0;                // lanes a row (MatArgs::lanes); 0: the int8 GEMVs do not take the group
  uint8_t fetch = 0;            // RowFetch bits but kFetchL2 (MatArgs::row_fetch)
};

// The plans by the device address of a group's first weight (a weight may head several groups:
// gate with its up, and gate alone for an adapted gate's separate launch).
class WeightPlans {
 public:
  void add(const GemvPlan& p) {
    std::vector<GemvPlan>& v = by_first_[p.parts[0]];
    for (GemvPlan& q : v)
      if (same_group(q, p)) return void(q = p);
    v.push_back(p);
  }
  void forget(const void* first) { by_first_.erase(first); }
  // The plan of a's weights (a.w[0 .. a.n), a.w2) when they are one placed group, else null.
  const GemvPlan* find(const MatArgs& a) const {
    const auto it = by_first_.find(a.w[0].data);
    if (it == by_first_.end()) return nullptr;
    GemvPlan key;
    key.n = a.n;
    for (int i = 0; i < a.n && i < 3; ++i) key.parts[i] = a.w[i].data;
    key.gated = a.w2.data;
    for (const GemvPlan& p : it->second)
      if (same_group(p, key)) return &p;
    return nullptr;
  }

 private:
  static bool same_group(const GemvPlan& a, const GemvPlan& b) {
    if (a.n != b.n || a.gated != b.gated) return false;
    for (int i = 0; i < a.n; ++i)
      if (a.parts[i] != b.parts[i]) return false;
    return true;
  }
  std::unordered_map<const void*, std::vector<GemvPlan>> by_first_;
};

}  // namespace g4::cuda
