// Launchers of the CUDA backend's kernels (cuda_kernels.cu). Every pointer is device memory and
// every shape is as in backend/backend.h; all launches go to the default stream, in order.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cuda/cuda_dequant.cuh"

namespace g4::cuda {

// One sequence's attention arguments (AttnSeq with device K/V pointers).
struct AttnArgs {
  int row0, n, pos0;
  const float* k;
  const float* v;
  int capacity, n_kv_heads, head_dim, window;
};

// y[M, w.rows] = x[M, w.cols] · Wᵀ: 32-value units per lane when w.cols % 32 == 0, else one
// element at a time (tests compare both with the reference backend).
void matmul(const float* x, int M, const DevWeight& w, float* y);
void embed(const DevWeight& e, const int32_t* ids, int n, float scale, float* out);
void rms_norm(const float* x, int rows, int dim, const float* w, float eps, float* y);
void rope(float* x, int rows, int heads, int head_dim, int pos0, const float* inv_freq, float position_scale);
void kv_write(const float* k, const float* v, int row0, int n, int pos0, int row_len, int capacity, int window,
              float* kc, float* vc);
// scratch: at least a.n * H * max_pos floats, max_pos >= the number of visible positions.
void attention(const float* q, int H, const AttnArgs& a, float scale, float* scratch, int max_pos, float* out);
void gelu_mul(const float* gate, const float* up, size_t n, float* out);
void gelu_mul_ggml(const float* gate, const float* up, size_t n, const uint16_t* table, float* out);
void add(const float* a, const float* b, size_t n, float* y);
void scale(const float* a, float s, size_t n, float* y);
void softcap(float* x, size_t n, float cap);
void gather_rows(const float* src, const int32_t* idx, int n, int dim, float* dst);
void copy_cols(const float* src, int rows, int src_dim, int off, int n, float* dst);

}  // namespace g4::cuda
