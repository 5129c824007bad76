// The f32 host operations LoRA training differentiates, each as a forward and a backward
// (vector-Jacobian product). Plain f32 arithmetic throughout: training follows the model's
// definition (mlx-lm's gemma4_text run in float32), not the inference kernels' activation
// rounding, so gradients are those of the function the loss sees.
//
// Shapes are row-major; "rows" are token positions of one sequence. Backward functions ADD
// their input gradients into the given buffers (callers zero them), so branches that share an
// input accumulate.
#pragma once
#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "quant/weight.h"

namespace g4::train {

// y[M, W.rows] = x[M, W.cols] · Wᵀ for a packed weight (any WFormat), exact dequantized rows, f32.
void matmul_wt(const float* x, int M, const WeightView& W, float* y);
// dx[M, W.cols] += dy[M, W.rows] · W: the input gradient of matmul_wt.
void matmul_w_acc(const float* dy, int M, const WeightView& W, float* dx);

// Dense f32 products for the adapters' small matrices (A [K, N] row-major):
// c[M, N] (+)= a[M, K] · b[K, N]
void gemm_nn(const float* a, const float* b, float* c, int M, int K, int N, bool accumulate);
// c[M, N] (+)= a[M, K] · bᵀ, b [N, K]
void gemm_nt(const float* a, const float* b, float* c, int M, int K, int N, bool accumulate);
// c[K, N] += aᵀ · b, a [M, K], b [M, N] (a weight gradient: sum over rows)
void gemm_tn_acc(const float* a, const float* b, float* c, int M, int K, int N);

// RMSNorm over rows of x [rows, dim]: y = x · inv · w, inv = 1/sqrt(mean(x²) + eps) (w null: 1).
// inv_out [rows] keeps inv for the backward.
void rms_norm_fwd(const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv_out);
void rms_norm_bwd(const float* x, const float* inv, int rows, int dim, const float* w, const float* dy, float* dx);

// Half-split RoPE in place on x [rows, heads, head_dim], row r at position pos0 + r (the table of
// backend.h: inv_freq 0 pairs do not rotate); rope_bwd applies the inverse rotation to gradients.
void rope_fwd(float* x, int rows, int heads, int head_dim, int pos0, const RopeTable& t);
void rope_bwd(float* dx, int rows, int heads, int head_dim, int pos0, const RopeTable& t);

// gelu_tanh(g) * u (MLX's gelu_approx) and its gradients: dg += dy·u·gelu'(g), du += dy·gelu(g).
void gelu_mul_fwd(const float* g, const float* u, size_t n, float* y);
void gelu_mul_bwd(const float* g, const float* u, const float* dy, size_t n, float* dg, float* du);

// Causal (windowed when window > 0) attention of one sequence of T rows at positions 0..T-1,
// GQA with H query heads over Hk key/value heads: q [T, H, D], k / v [T, Hk, D] -> out [T, H, D].
// probs (forward output, [H, T, T], row i's weights over keys 0..i; zero elsewhere) feeds the
// backward, which adds into dq, dk, dv.
void attention_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                   float scale, float* probs, float* out);
void attention_bwd(const float* q, const float* k, const float* v, const float* probs, const float* dout, int T,
                   int H, int Hk, int D, int window, float scale, float* dq, float* dk, float* dv);

// Final logits of rows x [M, d] (final-normed): z = x · Eᵀ, softcapped when cap > 0; the loss of
// each row with a target (targets[i] >= 0) is logsumexp(z) - z[target]. Adds d(Σ loss · weight)/dx
// into dx [M, d] and returns Σ loss over the rows with targets. Works in row chunks so that
// [M, vocab] logits are never held at once. dx null: the loss only.
double lm_head_loss(const float* x, int M, const WeightView& E, float cap, const int32_t* targets, float weight,
                    float* dx);

}  // namespace g4::train
