// Epilogues the CUDA backend (cuda_backend.h) leaves out of a launch for the op that follows, so
// that the next kernel runs them inside its own launch instead of as launches of their own. Each
// is taken by the op that can fuse it, or launched alone before any other launch, host copy, sync
// or step end (CudaBackend::flush_pending), so every op sees memory exactly where plain order has
// it.
#pragma once
#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {

// A matmul_norm_add's post-norm and residual add, resid[rows, n] += rms_norm(y)·w, then
// resid *= scale (a scale of the residual that came next joins it).
// - Left by the int8 GEMVs (q8: one row, or the rows of a row-exact launch; MatArgs::defer_post):
//   fused into the next op's prepare when that is an int8 launch of the same rows on the same
//   residual (take_into: the next layer's q/k/v, gate/up, a plain matmul of the residual); else
//   launched as post_norm_add (one block per row).
// - Left by batched rows on the few-row kernel or cuBLAS (2-64 rows): the next input norm of the
//   residual launches it with its own norm as one kernel (norm_add_norm); else launched as norm_add.
struct PendingPost {
  const void* y = nullptr;
  void* resid = nullptr;
  DType t = DType::F32;
  int n = 0;
  const float* w = nullptr;
  float eps = 0.f;
  int rows = 1;
  float scale = 1.f;
  bool q8 = false;

  explicit operator bool() const { return y != nullptr; }
  // Moves this epilogue into a's prepare (MatArgs::pre_y) when a (M rows; gelu: gate_up_gelu)
  // can fuse it; otherwise leaves both unchanged.
  void take_into(MatArgs& a, int M, bool gelu) {
    if (!y || !q8 || rows != M || !a.q8.q || a.x != resid || a.w[0].cols != n || a.xt != t ||
        !q8_prepare_fusable(a, gelu))
      return;
    a.pre_y = y;
    a.pre_w = w;
    a.pre_eps = eps;
    a.pre_scale = scale;
    *this = PendingPost{};
  }
};

// The device MoE path's last step, out[rows, d] = Σ_j w[r, j]·y[r, j] (moe_combine), left for the
// MoE exit that reads out next (moe_exit computes it in its kernel).
struct PendingCombine {
  const void* y = nullptr;
  const float* w = nullptr;
  void* out = nullptr;
  int rows = 0, k = 0, d = 0;
  DType t = DType::F32;

  explicit operator bool() const { return y != nullptr; }
  // The combination as moe_exit's argument when moe_exit reads its output (h2 of rows x d, type
  // t), emptying this; else an empty MoeCombine (moe_exit then reads h2 as it is).
  MoeCombine take_for(const void* h2, int rows_, int d_, DType t_) {
    MoeCombine c{};
    if (!y || out != h2 || rows != rows_ || d != d_ || t != t_) return c;
    c.y = y;
    c.w = w;
    c.k = k;
    *this = PendingCombine{};
    return c;
  }
};

// A decode attention launch (cuda::attention over every row of the forward, int8 decode path)
// held back for the op after it: when that is a matmul of its output with no input norm (the
// output projection), the attention also writes that output's int8 form (its q8_out argument)
// and the matmul skips its own prepare launch (MatArgs::prepared; CudaBackend::take_prepared).
// Launched as is before any other launch, host copy, sync or step end (flush_pending).
struct PendingAttention {
  const void* q = nullptr;
  int H = 0;
  int splits = 0;
  AttnBatch a{};
  float scale = 0.f;
  int rows = 0;  // rows of out the launch writes (all of the forward's)
  float* partial = nullptr;
  unsigned* counters = nullptr;
  void* out = nullptr;
  AttnPrepArgs prep{};  // attn_prep folded into this launch (cuda::attention), or all zero

  explicit operator bool() const { return out != nullptr; }
};

// A gelu_mul (or its ggml-table form: table set) held back for the op after it: when that is an
// int8 GEMV of its output with no input norm (the per-layer input's projection after its gate),
// the launch also writes the output's int8 form (cuda::gelu_mul_q8 into q8_out) and the GEMV skips
// its prepare launch (MatArgs::prepared; CudaBackend::take_prepared).
// Launched as is before any other launch, host copy, sync or step end (flush_pending).
struct PendingGeluMul {
  const void* gate = nullptr;
  const void* up = nullptr;
  size_t n = 0;
  const uint16_t* table = nullptr;
  void* out = nullptr;
  DType t = DType::F32;

  explicit operator bool() const { return out != nullptr; }
};

// An attn_prep launch (BackendOptions::fold_attn_prep: decode rows, one per sequence, unquantized
// caches, no image blocks) held back for the attention after it, which then does its work
// (cuda::attention's prep argument) instead of a launch of its own.
// Launched as is before any other launch, host copy, sync or step end (flush_pending).
struct PendingAttnPrep {
  AttnPrepArgs a{};
  int rows = 0;

  explicit operator bool() const { return rows > 0; }
};

}  // namespace g4::cuda
