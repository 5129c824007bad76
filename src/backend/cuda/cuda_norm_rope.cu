// RMSNorm, the fused norm + residual add, RoPE, and the attention inputs (per-head norm and RoPE
// of q and k, then the KV-cache write, plain or quantized): one block per row or (row, head).
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_head_norm.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_moe_combine.cuh"

namespace g4::cuda {
namespace {

// One element of rms_norm: x · inv (· w when weighted), rounded once.
template <class T>
__device__ inline T rms_normed(T x, float inv, bool weighted, float w) {
  const float v = to_f(x) * inv;
  return from_f<T>(weighted ? v * w : v);
}

// One block per row.
template <class T>
__global__ void rms_norm_kernel(const T* x, int dim, const float* w, float eps, T* y) {
  pdl_enter();
  __shared__ float sh[32];
  const T* xr = x + int64_t(blockIdx.x) * dim;
  T* yr = y + int64_t(blockIdx.x) * dim;
  const float inv = inv_rms(xr, dim, eps, sh);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = rms_normed(xr[i], inv, w != nullptr, w ? w[i] : 1.f);
}

// One element of norm_add: x + rms_norm(o)·w, rounded once.
template <class T>
__device__ inline T norm_added(T x, T o, float inv, float w) {
  return from_f<T>(to_f(x) + to_f(o) * inv * w);
}

// x[row] += rms_norm(o[row]) * w: one block per row (rms_norm_kernel's rounding, then the add).
template <class T>
__global__ void norm_add_kernel(T* x, const T* o, int dim, const float* w, float eps) {
  pdl_enter();
  __shared__ float sh[32];
  const T* orow = o + int64_t(blockIdx.x) * dim;
  T* xr = x + int64_t(blockIdx.x) * dim;
  const float inv = inv_rms(orow, dim, eps, sh);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = norm_added(xr[i], orow[i], inv, w[i]);
}

// A row's elements i = thread + 256 j (j < kPer) of the 256-thread block, into registers.
template <class T, int kPer>
__device__ inline void load_row(const T* row, int dim, T (&v)[kPer]) {
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (threadIdx.x + 256 * j < dim) v[j] = row[threadIdx.x + 256 * j];
}
// A norm weight's elements i = thread + 256 j (1 where w is null), into registers: the kernels
// below load them before their PDL wait (weights are never written during a step), so that their
// memory latency overlaps the kernel before instead of following a reduction.
template <int kPer>
__device__ inline void load_weights(const float* w, int dim, float (&v)[kPer]) {
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + 256 * j;
    v[j] = w && i < dim ? w[i] : 1.f;
  }
}
// rms_inv of a row held by load_row (the sum in inv_rms's order: the same bits).
template <class T, int kPer>
__device__ inline float row_rms_inv(const T (&v)[kPer], int dim, float eps, float* sh) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (threadIdx.x + 256 * j < dim) ss += to_f(v[j]) * to_f(v[j]);
  return rms_inv(ss, dim, eps, sh);
}

// norm_add, then scale (when s != 1), then rms_norm into xn, one block of 256 threads per row, each
// step rounded as its own kernel rounds. The row's elements (i = thread + 256 j, j < kPer) are read
// once into registers, all loads in flight together: the separate kernels' chain of dependent
// reads is what a row of a batched-decode step waits on. The sums of squares run in inv_rms's
// order, so the bits are the separate kernels'.
template <class T, int kPer>
__global__ void __launch_bounds__(256) norm_add_norm_kernel(T* x, const T* o, int dim, const float* w, float eps,
                                                            float s, const float* w2, float eps2, T* xn) {
  float wv[kPer], w2v[kPer];
  load_weights(w, dim, wv);
  load_weights(w2, dim, w2v);
  pdl_enter();
  __shared__ float sh[32];
  const T* orow = o + int64_t(blockIdx.x) * dim;
  T* xr = x + int64_t(blockIdx.x) * dim;
  T* yr = xn + int64_t(blockIdx.x) * dim;
  T ov[kPer], xv[kPer];
  load_row(orow, dim, ov);
  load_row(static_cast<const T*>(xr), dim, xv);
  const float inv = row_rms_inv(ov, dim, eps, sh);
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + 256 * j;
    if (i >= dim) continue;
    T v = norm_added(xv[j], ov[j], inv, wv[j]);
    if (s != 1.f) v = from_f<T>(to_f(v) * s);  // scale_kernel's rounding
    xr[i] = xv[j] = v;
    ss += to_f(v) * to_f(v);
  }
  const float inv2 = rms_inv(ss, dim, eps2, sh);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + 256 * j;
    if (i >= dim) continue;
    yr[i] = rms_normed(xv[j], inv2, w2 != nullptr, w2v[j]);  // rms_norm_kernel's rounding
  }
}

// moe_norms: one block of 256 threads per row, f and x read once.
template <class T, int kPer>
__global__ void __launch_bounds__(256) moe_norms_kernel(const T* f, const T* x, int dim, const float* w_f,
                                                        const float* w_r, const float* w_x, float eps, T* h1, T* xr,
                                                        T* xn) {
  float wf[kPer], wr[kPer], wx[kPer];
  load_weights(w_f, dim, wf);
  load_weights(w_r, dim, wr);
  load_weights(w_x, dim, wx);
  pdl_enter();
  __shared__ float sh[32];
  const int64_t off = int64_t(blockIdx.x) * dim;
  T fv[kPer], xv[kPer];
  load_row(f + off, dim, fv);
  load_row(x + off, dim, xv);
  const float inv_f = row_rms_inv(fv, dim, eps, sh), inv_x = row_rms_inv(xv, dim, eps, sh);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + 256 * j;
    if (i >= dim) continue;
    h1[off + i] = rms_normed(fv[j], inv_f, w_f != nullptr, wf[j]);
    xr[off + i] = rms_normed(xv[j], inv_x, w_r != nullptr, wr[j]);
    xn[off + i] = rms_normed(xv[j], inv_x, w_x != nullptr, wx[j]);
  }
}

// moe_exit: one block of 256 threads per row; the row's h2, h1 and x read once. With y (the
// routed experts' outputs [rows, k, dim] and their weights cw [rows, k]), h2 is their combination,
// computed here (moe_combined_row: as moe_combine_kernel computes it) instead of read.
template <class T, int kPer>
__global__ void __launch_bounds__(256) moe_exit_kernel(T* x, const T* h1, const T* h2, const T* y, const float* cw,
                                                       int k, int dim, const float* w2, const float* w, float eps,
                                                       float s) {
  float w2v[kPer], wv[kPer];
  load_weights(w2, dim, w2v);
  load_weights(w, dim, wv);
  pdl_enter();
  __shared__ float sh[32];
  const int64_t off = int64_t(blockIdx.x) * dim;
  T hv[kPer], fv[kPer], xv[kPer];
  if (y) {
    float acc[kPer];
    moe_combined_row<kPer, 256>(y, cw, blockIdx.x, k, dim, acc);
#pragma unroll
    for (int j = 0; j < kPer; ++j) hv[j] = from_f<T>(acc[j]);
  } else {
    load_row(h2 + off, dim, hv);
  }
  load_row(h1 + off, dim, fv);
  load_row(static_cast<const T*>(x) + off, dim, xv);
  const float inv2 = row_rms_inv(hv, dim, eps, sh);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + 256 * j;
    if (i >= dim) continue;
    const T hn = rms_normed(hv[j], inv2, w2 != nullptr, w2v[j]);  // rms_norm_kernel's rounding
    fv[j] = from_f<T>(to_f(fv[j]) + to_f(hn));                     // add_kernel's
  }
  const float inv = row_rms_inv(fv, dim, eps, sh);
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int i = threadIdx.x + 256 * j;
    if (i >= dim) continue;
    T v = norm_added(xv[j], fv[j], inv, wv[j]);  // norm_add_kernel's
    if (s != 1.f) v = from_f<T>(to_f(v) * s);   // scale_kernel's
    x[off + i] = v;
  }
}

// Per-head RMSNorm (weight w) then RoPE, one block per (row, head).
template <class T>
__global__ void norm_rope_kernel(T* x, int heads, int head_dim, const float* w, float eps, Dyn pos0,
                                 const float* inv_freq, float position_scale) {
  pdl_enter();
  __shared__ float sh[32];
  const int r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float pos = float(load(pos0) + r) * position_scale;
  norm_rope_head(x + (int64_t(r) * heads + h) * head_dim, head_dim, w, eps, pos, inv_freq, static_cast<T*>(nullptr), sh);
}

// A layer's attention inputs for a batch of sequences in one launch (attn_prep): blocks (launch
// row of a.tab, h) for
// h < H norm and rope query head h; blocks (row, H + g) norm and rope key head g and write it,
// with value head g (unweighted RMSNorm when v_norm), into the cache slot of the row's position.
template <class T>
__global__ void attn_prep_kernel(AttnPrepArgs a) {
  const int heads = a.H + a.Hk, lr = blockIdx.x / heads, h = blockIdx.x % heads, D = a.head_dim;
  if (threadIdx.x == 0) {  // the head's norm weight and RoPE frequencies into L2 before the wait (never written during a step)
    const float* w = h < a.H ? a.q_norm_w : a.k_norm_w;
    if (w) prefetch_l2(w, size_t(D) * 4);
    prefetch_l2(a.inv_freq, size_t(D / 2) * 4);
  }
  const SeqKv sq = a.tab.seqs[a.tab.row_seq[lr]];  // before the wait: never written by a kernel (cuda_attention.cu)
  pdl_enter();
  __shared__ float sh[32];
  const int t = lr - sq.first, r = sq.row0 + t, p = sq.pos0 + t;
  const float pos = float(p) * a.position_scale;
  T* const q = static_cast<T*>(a.q);
  if (h < a.H) {
    norm_rope_head(q + (int64_t(r) * a.H + h) * D, D, a.q_norm_w, a.eps, pos, a.inv_freq, static_cast<T*>(nullptr), sh);
    return;
  }
  T *const k = static_cast<T*>(a.k), *const vv = static_cast<T*>(a.v);
  T *const kc = static_cast<T*>(sq.k), *const vc = static_cast<T*>(sq.v);
  const int g = h - a.H;
  const int64_t slot = kv_slot(sq.table, sq.block_shift, sq.capacity, sq.window, p);
  const int64_t at = (slot * a.Hk + g) * D, row = (int64_t(r) * a.Hk + g) * D;
  const KvQuantArgs qa = sq.quant;
  norm_rope_head(k + row, D, a.k_norm_w, a.eps, pos, a.inv_freq, qa.bits ? static_cast<T*>(nullptr) : kc + at, sh);
  T* v = vv + row;
  norm_v_head(v, D, a.v_norm, a.eps, qa.bits ? static_cast<T*>(nullptr) : vc + at, sh);
  if (qa.bits) {  // the normed, roped K head and the V head (in place above) into the cache's codes
    __shared__ uint8_t codes[512];
    __syncthreads();
    const int64_t hr = slot * a.Hk + g;
    kv_quantize_head(k + row, D, qa.bits, qa.group, qa.bf16_params, hr, qa.kq, qa.ks, qa.kb, codes);
    kv_quantize_head(v, D, qa.bits, qa.group, qa.bf16_params, hr, qa.vq, qa.vs, qa.vb, codes);
  }
}

// One block per (row, head): RoPE alone (norm_rope_head without a weight).
template <class T>
__global__ void rope_kernel(T* x, int heads, int head_dim, Dyn pos0, const float* inv_freq, float position_scale) {
  pdl_enter();
  __shared__ float sh[32];
  const int r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float pos = float(load(pos0) + r) * position_scale;
  norm_rope_head(x + (int64_t(r) * heads + h) * head_dim, head_dim, nullptr, 0.f, pos, inv_freq,
                 static_cast<T*>(nullptr), sh);
}

// One block per new token; copies its K and V rows into their slots (or quantizes them there).
template <class T>
__global__ void kv_write_kernel(const T* k, const T* v, int row0, Dyn pos0, int n_kv_heads, int head_dim,
                                int capacity, int window, const int32_t* table, int block_shift, T* kc, T* vc,
                                KvQuantArgs qa) {
  pdl_enter();
  const int t = blockIdx.x, pos = load(pos0) + t, row_len = n_kv_heads * head_dim;
  const int64_t slot = kv_slot(table, block_shift, capacity, window, pos);
  const T* kr = k + int64_t(row0 + t) * row_len;
  const T* vr = v + int64_t(row0 + t) * row_len;
  if (qa.bits) {
    __shared__ uint8_t codes[512];
    for (int g = 0; g < n_kv_heads; ++g) {
      const int64_t hr = slot * n_kv_heads + g;
      kv_quantize_head(kr + g * head_dim, head_dim, qa.bits, qa.group, qa.bf16_params, hr, qa.kq, qa.ks, qa.kb, codes);
      kv_quantize_head(vr + g * head_dim, head_dim, qa.bits, qa.group, qa.bf16_params, hr, qa.vq, qa.vs, qa.vb, codes);
    }
    return;
  }
  for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
    kc[slot * row_len + i] = kr[i];
    vc[slot * row_len + i] = vr[i];
  }
}

// The row kernels that hold a row in registers (load_row: 256 threads x kPer values) take rows
// up to kRegRowMax wide; row_per(dim, fn) calls fn with the kPer (12 or 24) that holds dim.
constexpr int kRegRowMax = 256 * 24;
template <class Fn>
void row_per(int dim, Fn&& fn) {
  if (dim <= 256 * 12) fn(std::integral_constant<int, 12>{});
  else fn(std::integral_constant<int, 24>{});
}

}  // namespace

void rms_norm(cudaStream_t s, const void* x, int rows, int dim, const float* w, float eps, void* y, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(rms_norm_kernel<T>, rows, 256, 0, s, static_cast<const T*>(x), dim, w, eps, static_cast<T*>(y));
  });
}

void norm_add(cudaStream_t s, void* x, const void* o, int rows, int dim, const float* w, float eps, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(norm_add_kernel<T>, rows, 256, 0, s, static_cast<T*>(x), static_cast<const T*>(o), dim, w, eps);
  });
}

void norm_add_norm(cudaStream_t s, void* x, const void* o, int rows, int dim, const float* w, float eps, float scale,
                   const float* w2, float eps2, void* xn, DType t) {
  if (rows <= 0) return;
  if (dim > kRegRowMax) {  // wider than the kernel's registers hold: the three kernels
    norm_add(s, x, o, rows, dim, w, eps, t);
    if (scale != 1.f) cuda::scale(s, x, scale, size_t(rows) * size_t(dim), x, t);
    rms_norm(s, x, rows, dim, w2, eps2, xn, t);
    return;
  }
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    row_per(dim, [&](auto per) {
      launch_kernel(norm_add_norm_kernel<T, decltype(per)::value>, rows, 256, 0, s, static_cast<T*>(x),
                    static_cast<const T*>(o), dim, w, eps, scale, w2, eps2, static_cast<T*>(xn));
    });
  });
}

void moe_norms(cudaStream_t s, const void* f, const void* x, int rows, int dim, const float* w_f, const float* w_r,
               const float* w_x, float eps, void* h1, void* xr, void* xn, DType t) {
  if (rows <= 0) return;
  if (dim > kRegRowMax) {  // wider than the kernel's registers hold: the three kernels
    rms_norm(s, f, rows, dim, w_f, eps, h1, t);
    rms_norm(s, x, rows, dim, w_r, eps, xr, t);
    rms_norm(s, x, rows, dim, w_x, eps, xn, t);
    return;
  }
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    row_per(dim, [&](auto per) {
      launch_kernel(moe_norms_kernel<T, decltype(per)::value>, rows, 256, 0, s, static_cast<const T*>(f),
                    static_cast<const T*>(x), dim, w_f, w_r, w_x, eps, static_cast<T*>(h1), static_cast<T*>(xr),
                    static_cast<T*>(xn));
    });
  });
}

void moe_exit(cudaStream_t s, void* x, const void* h1, const void* h2, const MoeCombine& c, int rows, int dim,
              const float* w2, const float* w, float eps, float scale, DType t) {
  if (rows <= 0) return;
  if (dim > kRegRowMax) {  // the separate kernels (h2 is scratch: normed in place)
    if (c.y) moe_combine(s, c.y, c.w, rows, c.k, dim, const_cast<void*>(h2), t);
    rms_norm(s, h2, rows, dim, w2, eps, const_cast<void*>(h2), t);
    add(s, h1, h2, size_t(rows) * size_t(dim), const_cast<void*>(h2), t);
    norm_add(s, x, h2, rows, dim, w, eps, t);
    if (scale != 1.f) cuda::scale(s, x, scale, size_t(rows) * size_t(dim), x, t);
    return;
  }
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    row_per(dim, [&](auto per) {
      launch_kernel(moe_exit_kernel<T, decltype(per)::value>, rows, 256, 0, s, static_cast<T*>(x),
                    static_cast<const T*>(h1), static_cast<const T*>(h2), static_cast<const T*>(c.y), c.w, c.k, dim,
                    w2, w, eps, scale);
    });
  });
}

void attn_prep(cudaStream_t s, const AttnPrepArgs& a, int rows) {
  if (rows <= 0) return;
  with_act(a.t, [&](auto tag) { launch_kernel(attn_prep_kernel<decltype(tag)>, rows * (a.H + a.Hk), kAttnPrepThreads, 0, s, a); });
}

void norm_rope(cudaStream_t s, void* x, int rows, int heads, int head_dim, const float* w, float eps, Dyn pos0,
               const float* inv_freq, float position_scale, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(norm_rope_kernel<T>, rows * heads, 128, 0, s, static_cast<T*>(x), heads, head_dim, w, eps, pos0, inv_freq,
                                                     position_scale);
  });
}

void rope(cudaStream_t s, void* x, int rows, int heads, int head_dim, Dyn pos0, const float* inv_freq,
          float position_scale, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(rope_kernel<T>, rows * heads, 128, 0, s, static_cast<T*>(x), heads, head_dim, pos0, inv_freq, position_scale);
  });
}

void kv_write(cudaStream_t s, const void* k, const void* v, int row0, int n, Dyn pos0, int n_kv_heads, int head_dim,
              int capacity, int window, const int32_t* table, int block_shift, void* kc, void* vc,
              const KvQuantArgs& quant, DType t) {
  if (n <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(kv_write_kernel<T>, n, 256, 0, s, static_cast<const T*>(k), static_cast<const T*>(v), row0, pos0, n_kv_heads,
                                         head_dim, capacity, window, table, block_shift, static_cast<T*>(kc),
                  static_cast<T*>(vc), quant);
  });
}

}  // namespace g4::cuda
