// The f32 kernels of the CUDA training arithmetic (backend/grad_arith.h's contracts; the
// arithmetic object is cuda_grad_arith.cu). Correctness first: every kernel sums in a fixed order
// (no atomics where two additions could meet), products are tiled f32 GEMMs that dequantize
// weight elements as they load them (cuda_dequant.cuh, any placed format), attention keeps its
// [H, T, T] weights. Each is launched on the given stream; pointers are device memory, index
// lists device arrays of n entries.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_dequant.cuh"

namespace g4::cuda::grad {

// Elementwise over n values.
void add(cudaStream_t s, const float* a, const float* b, size_t n, float* y);
void scale(cudaStream_t s, const float* a, float k, size_t n, float* y);
void axpy_acc(cudaStream_t s, float k, const float* x, size_t n, float* y);
void softcap_fwd(cudaStream_t s, float* x, size_t n, float cap);
void softcap_bwd(cudaStream_t s, const float* x, size_t n, float cap, float* g);
void dropout_fwd(cudaStream_t s, const float* x, size_t n, float p, uint64_t seed, float* y);
void dropout_bwd(cudaStream_t s, const float* dy, size_t n, float p, uint64_t seed, float* dx);
void gelu_mul_fwd(cudaStream_t s, const float* g, const float* u, size_t n, float* y);
void gelu_mul_bwd(cudaStream_t s, const float* g, const float* u, const float* dy, size_t n, float* dg, float* du);

// Rows.
void rms_norm_fwd(cudaStream_t s, const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv);
void rms_norm_bwd(cudaStream_t s, const float* x, const float* inv, int rows, int dim, const float* w, const float* dy,
                  float* dx);
// RoPE of [rows, heads, D] at positions pos0 + r by half-split pairs j < D/2 of inv_freq (device,
// D/2 values; 0: the pair does not turn); sign -1 turns back (the backward).
void rope(cudaStream_t s, float* x, int rows, int heads, int D, int pos0, const float* inv_freq, float position_scale,
          float sign);
void gather_rows(cudaStream_t s, const float* src, const int64_t* rows, size_t n, size_t dim, float* dst);
// dst[rows[i]] += (w ? w[widx[i]] : 1)·src[i] for i < n, rows in index order, by a plan of
// 2·groups + 1 + n entries (grouped_scatter_plan): dst_rows [groups] (distinct), starts [groups + 1]
// and order [n], group u's sources order[starts[u] .. starts[u + 1] - 1] ascending. Groups run in
// parallel; each adds its rows in index order, as a serial pass over i would.
void scatter_grouped_acc(cudaStream_t s, const float* src, const float* w, const int64_t* widx, const int64_t* plan,
                         size_t groups, size_t dim, float* dst);
// dst[i] += src[rows[i]], src[rows[i]] = 0; rows distinct.
void take_rows_acc(cudaStream_t s, float* src, const int64_t* rows, size_t n, size_t dim, float* dst);
void cols_acc(cudaStream_t s, const float* src, int rows, int n, int dst_dim, int off, float* dst);
void gather_scaled(cudaStream_t s, const float* src, const int64_t* rows, const float* w, const int64_t* widx,
                   size_t n, size_t dim, float* dst);
// out[widx[i]] += src_a[rows[i]] · b[i]; widx distinct.
void row_dots_acc(cudaStream_t s, const float* a, const int64_t* rows, const float* b, const int64_t* widx, size_t n,
                  size_t dim, float* out);

// out [n, W.cols] = rows r0 .. r0 + n - 1 of W in f32 / rounded to bf16 (cuBLAS's operands).
void dequant_rows_f32(cudaStream_t s, const DevWeight& W, int64_t r0, int64_t n, float* out);
void dequant_rows_bf16(cudaStream_t s, const DevWeight& W, int64_t r0, int64_t n, __nv_bfloat16* out);
// y = x rounded to bf16 (round to nearest even), n values.
void to_bf16(cudaStream_t s, const float* x, size_t n, __nv_bfloat16* y);
// y [H, T, D] = x [T, H, D] rounded to bf16 (each head's rows contiguous: the attention's operands).
void to_bf16_heads(cudaStream_t s, const float* x, int T, int H, int D, __nv_bfloat16* y);

// Products (the reference kernels; the arithmetic runs them on cuBLAS where it can). y[M, W.rows] = x·Wᵀ; dx[M, W.cols] += dy·W; c[K, N] += aᵀ·b (a [M, K], b [M, N]).
void matmul_wt(cudaStream_t s, const float* x, int M, const DevWeight& W, float* y);
void matmul_w_acc(cudaStream_t s, const float* dy, int M, const DevWeight& W, float* dx);
void gemm_tn_acc(cudaStream_t s, const float* a, const float* b, float* c, int M, int K, int N);

// Causal (windowed) GQA attention of one sequence: q [T, H, D], k / v [T, Hk, D]; probs [H, T, T].
// The backward takes a scratch of H·T·T floats (the score gradients).
void attention_fwd(cudaStream_t s, const float* q, const float* k, const float* v, int T, int H, int Hk, int D,
                   int window, float scale, float* probs, float* out);
void attention_bwd(cudaStream_t s, const float* q, const float* k, const float* v, const float* probs,
                   const float* dout, int T, int H, int Hk, int D, int window, float scale, float* dq, float* dk,
                   float* dv, float* scratch);

// The attention's row steps for its products on cuBLAS (the arithmetic's products compute every
// score of [H, T, T], the masked ones too): attn_softmax turns the scores s [H, T, T] (q·k, not yet
// scaled) into probs in place, causal and windowed like attention_fwd (masked entries 0);
// attn_score_grad turns dP [H, T, T] (dout·v) into dS = P (dP - Σ_j P dP)·scale in place (masked 0).
// A non-null copy / ds_copy / p_copy [H, T, T] also gets the probs / dS / probs rounded to bf16.
void attn_softmax(cudaStream_t s, float* scores, int T, int H, int window, float scale,
                  __nv_bfloat16* copy = nullptr);
void attn_score_grad(cudaStream_t s, const float* probs, float* dP, int T, int H, int window, float scale,
                     __nv_bfloat16* ds_copy = nullptr, __nv_bfloat16* p_copy = nullptr);

// The LM head's loss over rows X [M, K] (gathered: those with targets), one vocabulary chunk of
// rows r0 .. r0 + n - 1 of E at a time (the arithmetic's lm_head_loss strings them together):
// head_logits: z [M, n] = X·E[r0 : r0 + n]ᵀ;
// head_lse: z softcapped in place (cap > 0), merged into each row's running max mx [M] and
// Σ exp(z - mx) sm [M] (start: -inf and 0), zt [M] = z[target] where the target (tgt, device) is
// in the chunk;
// head_finish: lse [M] = mx + log(sm), term [M] = lse - zt;
// head_grad: z (recomputed, not softcapped yet) becomes weight · dloss/dlogit: (softmax - onehot)
// times the softcap's derivative;
// head_back: dX [M, K] += z·E[r0 : r0 + n].
void head_logits(cudaStream_t s, const float* X, int M, const DevWeight& E, int64_t r0, int n, float* z);
void head_lse(cudaStream_t s, float* z, int M, int n, int64_t r0, float cap, const int32_t* tgt, float* mx, double* sm,
              float* zt);
void head_finish(cudaStream_t s, int M, const float* mx, const double* sm, const float* zt, double* lse, double* term);
void head_grad(cudaStream_t s, float* z, int M, int n, int64_t r0, float cap, const int32_t* tgt, const double* lse,
               float weight);
void head_back(cudaStream_t s, const float* z, int M, int n, const DevWeight& E, int64_t r0, float* dX);

// The router's backward (grad_arith.h router_bwd); idx [rows, k] device, k <= 32.
void router_bwd(cudaStream_t s, const float* scores, const int32_t* idx, const float* dw, int rows, int E, int k,
                const float* per_expert_scale, float* ds);

}  // namespace g4::cuda::grad
