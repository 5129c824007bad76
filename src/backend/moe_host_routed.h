// MoE experts with the routing read back to the host, over any backend's ops: the rows * k
// (row, slot) items grouped by expert on the host, gathered, one gate / up / down matmul per
// expert, and gathered back. The fallback of a device backend whose own expert kernels do not take
// a launch (f32 activations, mixed formats); the caller combines the outputs (Backend::moe_experts).
#pragma once
#include <vector>

#include "backend/backend.h"

namespace g4 {

class HostRoutedMoe {
 public:
  // y[(r, j)] = down_e(gelu_tanh(gate_e x_r) * up_e x_r) for e = idx[r, j], into a buffer of
  // [rows * k, d] in (row, slot) order, returned (valid until the next run or release). Syncs (the
  // routing is read back), so not inside a recorded step's graph.
  Buf run(Backend& be, const Buf& x, int rows, int d, const Buf& idx, int k, const ExpertStack& gate,
          const ExpertStack& up, const ExpertStack& down, ActPrecision P);
  // Frees the scratch (before the backend goes).
  void release(Backend& be);

 private:
  Buf xs_, g_, u_, ys_, y_, ids_;  // gathered rows, gate / up products, outputs by expert and by item
  size_t cap_ = 0;                 // items the scratch holds
};

}  // namespace g4
