// One projection of a MoE layer's routed experts as one tensor [count, rows, cols] (spec §2.8),
// the way checkpoints store it (mlx-lm's switch_glu, GGUF's *_exps, HF's experts.*_proj), viewed
// without copying. Backends take a whole stack (Backend::moe_experts) and a device backend places
// it as one allocation (Backend::place_experts).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "quant/weight.h"

namespace g4 {

// Expert e's [rows, cols] matrix is `base` moved by (e - first) strides: its codes `stride` bytes
// after the previous expert's, its MLX scales and biases `scale_stride` bytes after theirs. A rank
// of an expert-parallel group (parallel/tp_source.h) holds experts [first, first + held) only; the
// rest are other ranks'.
struct ExpertStack {
  WeightView base;           // expert `first`'s matrix
  int count = 0;             // the layer's experts
  int first = 0, held = 0;   // the experts held here
  int64_t stride = 0;        // bytes between consecutive experts' codes
  int64_t scale_stride = 0;  // bytes between consecutive experts' scales (and biases); MLX only

  bool holds(int e) const { return e >= first && e < first + held; }
  // Output rows of one expert held here; 0 when none is held.
  int64_t rows() const { return held > 0 ? base.rows : 0; }
  WFormat fmt() const { return base.fmt; }
  // Expert e's matrix when held here, else a 0-row view of its shape and format.
  WeightView expert(int e) const;
  // Bytes of one expert's codes / of its scales (each of scales and biases; 0 unless MLX).
  int64_t expert_bytes() const { return base.rows * base.row_bytes; }
  int64_t expert_scale_bytes() const;
  // Whether held experts lie back to back (codes and scales): then the held part is one
  // [held * rows, cols] matrix, `as_matrix()`.
  bool back_to_back() const;
  WeightView as_matrix() const;

  // `count` experts back to back in one [count * rows, cols] matrix, all held.
  static ExpertStack of_matrix(const WeightView& all, int count);
};

// The stack of per-expert views (`views[e]`: expert e's matrix, or a 0-row view for another
// rank's): one format and shape, the held experts a contiguous range at even strides. `what`
// names the module in errors.
Result<ExpertStack> stack_experts(const std::vector<WeightView>& views, const std::string& what);

}  // namespace g4
