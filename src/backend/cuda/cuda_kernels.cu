// The CUDA backend's kernels (cuda_kernels.h): every dense op, templated on the activation storage
// type T (float or bf16, cuda_act.cuh; f32 arithmetic inside). Weights are dequantized per element
// or per 32-value unit (cuda_dequant.cuh); each kernel states its thread layout.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kquant_dot.cuh"

namespace g4::cuda {
namespace {

constexpr int kWarp = 32;

// An L2 load (bypassing L1: written by other blocks of this launch) of a run-time-typed activation.
__device__ inline float ld_cg(const void* p, int64_t i, bool bf) {
  if (bf) return __bfloat162float(__ldcg(static_cast<const bf16*>(p) + i));
  return __ldcg(static_cast<const float*>(p) + i);
}

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
template <class Op>
__device__ inline float warp_reduce(float v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float warp_sum(float v) { return warp_reduce(v, Sum{}); }
// Reduction over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread
// gets the result. sh: 32 floats of shared memory, free again when this returns.
template <class Op>
__device__ inline float block_reduce(float v, float* sh, Op op, float identity) {
  v = warp_reduce(v, op);
  const int w = threadIdx.x / kWarp, l = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  __syncthreads();
  if (l == 0) sh[w] = v;
  __syncthreads();
  v = threadIdx.x < nw ? sh[threadIdx.x] : identity;
  if (w == 0) v = warp_reduce(v, op);
  if (threadIdx.x == 0) sh[0] = v;
  __syncthreads();
  return sh[0];
}
__device__ inline float block_sum(float v, float* sh) { return block_reduce(v, sh, Sum{}, 0.f); }

// Row r of w (its bytes at `row`: global memory or a shared-memory copy) dotted with up to kMaxM
// activation rows, this lane's share (acc[m], summed over the warp by the caller). kUnits
// (cols % 32 == 0): each lane takes whole 32-value units (a block or sub-block of every format),
// decodes the unit once (dequant32) and dots it with the activations read as float4. Otherwise
// lanes stride over single columns (dequant_at). kM: the most activation rows this instance handles
// (1 for decode keeps the accumulators, and so the registers, few).
constexpr int kMaxM = 8;
// x: f32 (x_bf false: also the normed rows in shared memory) or bf16 activations.
template <WFormat F, bool kUnits, int kM>
__device__ inline void row_dot(const void* x, bool x_bf, int M, const DevWeight& w, const uint8_t* row, int64_t r,
                               int lane, float* acc) {
#pragma unroll
  for (int m = 0; m < kM; ++m) acc[m] = 0.f;
  if constexpr (kUnits) {
    for (int64_t u = lane; u < w.cols / 32; u += kWarp) {
      float wv[32];
      dequant32<F>(row, w, r, u, wv);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m >= M) break;
        const int64_t xm = int64_t(m) * w.cols + 32 * u;
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 v = ld4x(x, xm + 4 * j, x_bf);
          s += v.x * wv[4 * j] + v.y * wv[4 * j + 1] + v.z * wv[4 * j + 2] + v.w * wv[4 * j + 3];
        }
        acc[m] += s;
      }
    }
  } else {
    for (int64_t c = lane; c < w.cols; c += kWarp) {
      const float wv = dequant_at(row, w, r, c);
#pragma unroll
      for (int m = 0; m < kM; ++m)
        if (m < M) acc[m] += ldx(x, int64_t(m) * w.cols + c, x_bf) * wv;
    }
  }
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory
// with the whole block, 16 bytes per thread and step (coalesced).
// Four loads are issued before their stores, so they are in flight together.
__device__ inline void stage_rows(const uint8_t* src, uint8_t* dst, int64_t bytes) {
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  const int64_t n = bytes / 16;
  for (int64_t i0 = threadIdx.x; i0 < n; i0 += 4 * int64_t(blockDim.x)) {
    uint4 v[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i0 + k * blockDim.x < n) v[k] = s[i0 + k * blockDim.x];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (i0 + k * blockDim.x < n) d[i0 + k * blockDim.x] = v[k];
  }
}

// Warps per matmul block, and the activation a matmul applies (kGelu / kGeluGgml: with a second
// weight w2, gelu(x·wᵀ) * (x·w2ᵀ), tanh form or ggml's table).
constexpr int kMatWarps = 8;
enum Act { kPlain = 0, kGelu = 1, kGeluGgml = 2 };

// matmul_norm_add's epilogue, run by every block after its rows: the last block to finish adds
// rms_norm(y)·post_w to resid, row by row with the whole block; each thread's loads are issued
// together (kPerT at a time), not one L2 round trip after another. y and resid of type a.xt.
__device__ void residual_epilogue(const MatArgs& a, const void* y, int64_t n) {
  const bool bf = a.xt == DType::BF16;
  __shared__ bool last;
  __shared__ float red[32];
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(a.counter, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  constexpr int kPerT = 4;
  const int64_t step = int64_t(kPerT) * blockDim.x;
  for (int m = 0; m < a.M; ++m) {
    const int64_t row = int64_t(m) * n;
    float ss = 0.f;
    for (int64_t c0 = threadIdx.x; c0 < n; c0 += step) {
      float v[kPerT];
#pragma unroll
      for (int k = 0; k < kPerT; ++k) v[k] = c0 + k * blockDim.x < n ? ld_cg(y, row + c0 + k * blockDim.x, bf) : 0.f;
#pragma unroll
      for (int k = 0; k < kPerT; ++k) ss += v[k] * v[k];
    }
    ss = block_sum(ss, red);
    const float inv = 1.0f / sqrtf(ss / float(n) + a.post_eps);
    for (int64_t c0 = threadIdx.x; c0 < n; c0 += step) {
      float v[kPerT], r[kPerT], g[kPerT];
#pragma unroll
      for (int k = 0; k < kPerT; ++k) {
        const int64_t c = c0 + k * blockDim.x;
        v[k] = c < n ? ld_cg(y, row + c, bf) : 0.f;
        r[k] = c < n ? ldx(a.resid, row + c, bf) : 0.f;
        g[k] = c < n ? a.post_w[c] : 0.f;
      }
#pragma unroll
      for (int k = 0; k < kPerT; ++k)
        if (c0 + k * blockDim.x < n) store_out(a.resid, row + c0 + k * blockDim.x, r[k] + v[k] * inv * g[k], !bf);
    }
  }
  if (threadIdx.x == 0) *a.counter = 0u;
}

// Block-wide rms_norm of one row (M = 1) into shared memory xn: xn[c] = x[c] * inv_rms(x) * w[c].
__device__ void norm_row_to_shared(const void* x, bool bf, int64_t cols, const float* w, float eps, float* xn) {
  __shared__ float red[32];
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) ss += ldx(x, c, bf) * ldx(x, c, bf);
  ss = block_sum(ss, red);
  const float inv = 1.0f / sqrtf(ss / float(cols) + eps);
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) xn[c] = ldx(x, c, bf) * inv * w[c];
  __syncthreads();
}

// K-quant decode (M = 1; cuda_kquant_dot.cuh): the MatArgs contract of matmul_kernel, with
// `split` warps per row and a persistent grid: each block walks virtual blocks of kMatWarps /
// split rows (vb = blockIdx.x, + gridDim.x, ...), so that a few resident blocks per SM keep loads
// in flight instead of thousands of short blocks paying their start and drain.
template <WFormat F, int kAct>
__device__ void kquant_decode_rows(const MatArgs& a, const void* x, bool x_bf) {
  __shared__ float partial[2][kMatWarps];
  const int split = a.split, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, part = warp % split;
  const bool y_f32 = a.yt == DType::F32;
  const unsigned total = a.first[a.n];
  for (unsigned vb = blockIdx.x; vb < total; vb += gridDim.x) {
    int i = 0;
    while (i + 1 < a.n && vb >= a.first[i + 1]) ++i;
    const DevWeight& w = a.w[i];
    const int64_t r = int64_t(vb - a.first[i]) * (kMatWarps / split) + warp / split;
    float s1 = 0.f, s2 = 0.f;
    if (r < w.rows) {
      if constexpr (kAct != kPlain) {  // gate and up rows in one pass over x
        const uint8_t* rr[2] = {w.data + r * w.row_bytes, a.w2.data + r * a.w2.row_bytes};
        float acc[2];
        kquant_rows_dot<F, 2>(rr, x, x_bf, w.cols, lane, part, split, acc);
        s1 = warp_sum(acc[0]);
        s2 = warp_sum(acc[1]);
      } else {
        s1 = warp_sum(kquant_row_dot<F>(w.data + r * w.row_bytes, x, x_bf, w.cols, lane, part, split));
      }
    }
    if (split > 1) {
      if (lane == 0) partial[0][warp] = s1, partial[1][warp] = s2;
      __syncthreads();
      s1 = s2 = 0.f;
      for (int k = 0; k < split; ++k) s1 += partial[0][warp - part + k], s2 += partial[1][warp - part + k];
      __syncthreads();  // partial is rewritten by the next virtual block
    }
    if (r < w.rows && part == 0 && lane == 0) {
      float v = s1;
      if constexpr (kAct == kGelu) v = gelu_tanh_mul(s1, s2);
      if constexpr (kAct == kGeluGgml) v = gelu_ggml_mul(s1, s2, a.table);
      store_out(a.y[i], r, v, y_f32);
    }
  }
}

// K-quant decode (M = 1; cuda_kquant_dot.cuh): the MatArgs contract of matmul_kernel, with
// `split` warps per row and a persistent grid: each block walks virtual blocks of kMatWarps /
// split rows (vb = blockIdx.x, + gridDim.x, ...), so that a few resident blocks per SM keep loads
// in flight instead of thousands of short blocks paying their start and drain.
template <WFormat F, int kAct>
__global__ void __launch_bounds__(kMatWarps * kWarp) kquant_decode_kernel(MatArgs a) {
  extern __shared__ uint4 smem[];
  const bool bf = a.xt == DType::BF16;
  if (a.norm_w) {  // one row, normed once per block into shared memory
    float* xn = reinterpret_cast<float*>(smem);
    norm_row_to_shared(a.x, bf, a.w[0].cols, a.norm_w, a.eps, xn);
    kquant_decode_rows<F, kAct>(a, xn, false);
  } else {
    kquant_decode_rows<F, kAct>(a, a.x, bf);
  }
  if (a.resid) residual_epilogue(a, a.y[0], a.w[0].rows);
}

// One warp per output row (kMatWarps rows per block), up to kMaxM activation rows per launch (the
// caller splits larger M). The launch covers a.n weights of one format and width (the attention's
// q/k/v projections in one launch): blocks [first[i], first[i+1]) compute y[i] = x·w[i]ᵀ.
// kAct: kPlain as just said; kGelu / kGeluGgml (a.n == 1) also dot row r of a.w2 (same format and
// shape) and write gelu(x·wᵀ) * (x·w2ᵀ) (the gated MLP's first half in one launch).
// a.norm_w: x is first RMS-normalized with that weight (every block normalizes the rows into
// shared memory itself; a.norm_w == nullptr reads x as is).
// kStaged: the block first copies its rows' bytes (of w and w2) into shared memory with wide
// coalesced loads, then each warp decodes from there: the lanes' own reads, one 32-value unit
// each, would hit every cache line many times.
template <WFormat F, bool kUnits, int kAct, bool kStaged, int kM>
__global__ void __launch_bounds__(kMatWarps * kWarp) matmul_kernel(MatArgs a) {
  const bool bf = a.xt == DType::BF16;
  extern __shared__ uint4 smem[];
  int i = 0;
  while (i + 1 < a.n && blockIdx.x >= a.first[i + 1]) ++i;
  const DevWeight& w = a.w[i];
  const int warp = threadIdx.x / kWarp;
  const int64_t r0 = int64_t(blockIdx.x - a.first[i]) * kMatWarps;
  const int64_t r = r0 + warp;
  const int lane = threadIdx.x % kWarp;
  const uint8_t* row = w.data + r * w.row_bytes;
  const uint8_t* row2 = a.w2.data + r * a.w2.row_bytes;
  uint8_t* sm = reinterpret_cast<uint8_t*>(smem);
  if constexpr (kStaged) {
    const int64_t nrows = w.rows - r0 < kMatWarps ? w.rows - r0 : kMatWarps;
    const int64_t chunk = int64_t(kMatWarps) * w.row_bytes;
    stage_rows(w.data + r0 * w.row_bytes, sm, (nrows * w.row_bytes + 15) / 16 * 16);
    if constexpr (kAct != kPlain)
      stage_rows(a.w2.data + r0 * a.w2.row_bytes, sm + chunk, (nrows * a.w2.row_bytes + 15) / 16 * 16);
    row = sm + (r - r0) * w.row_bytes;
    row2 = sm + chunk + (r - r0) * a.w2.row_bytes;
    sm += chunk * (kAct != kPlain ? 2 : 1);
  }
  // The activation rows in chunks of kM: the staged weight rows serve every chunk.
  void* y = a.y[i];
  const bool y_f32 = a.yt == DType::F32;
  for (int m0 = 0; m0 < a.M; m0 += kM) {
    const int mc = a.M - m0 < kM ? a.M - m0 : kM;
    const int64_t x0 = int64_t(m0) * w.cols;  // this chunk's first element of a.x
    const float* xn = nullptr;  // the normed rows (shared memory), when the launch has an input norm
    if (a.norm_w) {  // xn[m, c] = x[m, c] * inv_rms(x[m]) * norm_w[c] into shared memory (16-byte aligned)
      float* xs = reinterpret_cast<float*>(sm);
      __shared__ float inv[kMaxM];
      __shared__ float red[32];
      __syncthreads();  // the previous chunk's warps are done reading xn
      if (w.cols % 4 == 0) {
        // Every thread of the block on each row, float4 loads: at decode each of the thousands of
        // blocks norms the same row, and a warp walking it serially cost more than the matmul.
        const int64_t c4n = w.cols / 4;
        for (int m = 0; m < mc; ++m) {
          const int64_t xr = x0 + int64_t(m) * w.cols;
          float ss = 0.f;
          for (int64_t c = threadIdx.x; c < c4n; c += blockDim.x) {
            const float4 v = ld4x(a.x, xr + 4 * c, bf);
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
          }
          ss = block_sum(ss, red);
          if (threadIdx.x == 0) inv[m] = 1.0f / sqrtf(ss / float(w.cols) + a.eps);
        }
      } else {
        for (int m = warp; m < mc; m += kMatWarps) {
          float ss = 0.f;
          for (int64_t c = lane; c < w.cols; c += kWarp) {
            const float v = ldx(a.x, x0 + m * w.cols + c, bf);
            ss += v * v;
          }
          ss = warp_sum(ss);
          if (lane == 0) inv[m] = 1.0f / sqrtf(ss / float(w.cols) + a.eps);
        }
      }
      __syncthreads();
      for (int64_t e = threadIdx.x; e < int64_t(mc) * w.cols; e += blockDim.x)
        xs[e] = ldx(a.x, x0 + e, bf) * inv[e / w.cols] * a.norm_w[e % w.cols];
      xn = xs;
    }
    __syncthreads();
    if (r < w.rows) {
      float acc[kM], acc2[kM];
      const void* xp = xn ? static_cast<const void*>(xn)
                          : static_cast<const void*>(static_cast<const uint8_t*>(a.x) + x0 * (bf ? 2 : 4));
      const bool xbf = !xn && bf;
      row_dot<F, kUnits, kM>(xp, xbf, mc, w, row, r, lane, acc);
      if constexpr (kAct != kPlain) row_dot<F, kUnits, kM>(xp, xbf, mc, a.w2, row2, r, lane, acc2);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m >= mc) break;
        const float s = warp_sum(acc[m]);
        float v = s;
        if constexpr (kAct == kGelu) v = gelu_tanh_mul(s, warp_sum(acc2[m]));
        if constexpr (kAct == kGeluGgml) v = gelu_ggml_mul(s, warp_sum(acc2[m]), a.table);
        if (lane == 0) store_out(y, int64_t(m0 + m) * w.rows + r, v, y_f32);
      }
    }
  }
  if (a.resid) residual_epilogue(a, y, w.rows);
}

// Grid (tokens, column chunks). kUnits (cols % 32 == 0): a thread per 32-value unit (one block
// header read, dequant32); else a thread per column. Many blocks per row: the per-layer-input
// table's rows are 8960 wide, and one block walking a row serially took 225 us.
constexpr int kEmbedThreads = 128;
template <WFormat F, bool kUnits, class T>
__global__ void __launch_bounds__(kEmbedThreads) embed_kernel(DevWeight e, const int32_t* ids, float scale, T* out) {
  const int i = blockIdx.x;
  const int64_t id = ids[i];
  const uint8_t* row = e.data + id * e.row_bytes;
  T* o = out + int64_t(i) * e.cols;
  const int64_t k = int64_t(blockIdx.y) * kEmbedThreads + threadIdx.x;
  if constexpr (kUnits) {
    if (k >= e.cols / 32) return;
    float v[32];
    dequant32<F>(row, e, id, k, v);
#pragma unroll
    for (int j = 0; j < 32; j += 4)
      st4(o + 32 * k + j, make_float4(v[j] * scale, v[j + 1] * scale, v[j + 2] * scale, v[j + 3] * scale));
  } else {
    if (k < e.cols) o[k] = from_f<T>(dequant_at(row, e, id, k) * scale);
  }
}

// 1 / sqrt(mean(x²) + eps) over x[dim], by the whole block (every thread gets it). Its barriers
// order the block's reads of x before any write that follows. sh: 32 floats of shared memory.
template <class T>
__device__ inline float inv_rms(const T* x, int dim, float eps, float* sh) {
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += to_f(x[i]) * to_f(x[i]);
  ss = block_sum(ss, sh);
  return 1.0f / sqrtf(ss / float(dim) + eps);
}

// One block per row.
template <class T>
__global__ void rms_norm_kernel(const T* x, int dim, const float* w, float eps, T* y) {
  __shared__ float sh[32];
  const T* xr = x + int64_t(blockIdx.x) * dim;
  T* yr = y + int64_t(blockIdx.x) * dim;
  const float inv = inv_rms(xr, dim, eps, sh);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_f(xr[i]) * inv;
    yr[i] = from_f<T>(w ? v * w[i] : v);
  }
}

// x[row] += rms_norm(o[row]) * w: one block per row (rms_norm_kernel's rounding, then the add).
template <class T>
__global__ void norm_add_kernel(T* x, const T* o, int dim, const float* w, float eps) {
  __shared__ float sh[32];
  const T* orow = o + int64_t(blockIdx.x) * dim;
  T* xr = x + int64_t(blockIdx.x) * dim;
  const float inv = inv_rms(orow, dim, eps, sh);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] = from_f<T>(to_f(xr[i]) + to_f(orow[i]) * inv * w[i]);
}

// One head of x [head_dim] in place, by the whole block: RMSNorm with weight w (none when w is
// null), then half-split RoPE at position `pos` (pairs with inv_freq 0 are only normalized); the
// result is also written to `copy` when set (a KV-cache slot). Same rounding as rms_norm_kernel
// followed by rope_kernel. sh: 32 floats of shared memory.
template <class T>
__device__ inline void norm_rope_head(T* v, int head_dim, const float* w, float eps, float pos,
                                      const float* inv_freq, T* copy, float* sh) {
  const int half = head_dim / 2;
  const float inv = w ? inv_rms(v, head_dim, eps, sh) : 1.f;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float a = to_f(v[j]), b = to_f(v[j + half]);
    if (w) {
      a = a * inv * w[j];
      b = b * inv * w[j + half];
    }
    if (inv_freq[j] != 0.f) {
      float sn, cs;
      sincosf(pos * inv_freq[j], &sn, &cs);
      const float ra = a * cs - b * sn, rb = a * sn + b * cs;
      a = ra;
      b = rb;
    }
    v[j] = from_f<T>(a);
    v[j + half] = from_f<T>(b);
    if (copy) {
      copy[j] = from_f<T>(a);
      copy[j + half] = from_f<T>(b);
    }
  }
}

// Per-head RMSNorm (weight w) then RoPE, one block per (row, head).
template <class T>
__global__ void norm_rope_kernel(T* x, int heads, int head_dim, const float* w, float eps, Dyn pos0,
                                 const float* inv_freq, float position_scale) {
  __shared__ float sh[32];
  const int r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float pos = float(load(pos0) + r) * position_scale;
  norm_rope_head(x + (int64_t(r) * heads + h) * head_dim, head_dim, w, eps, pos, inv_freq, static_cast<T*>(nullptr), sh);
}

// A layer's attention inputs for one sequence in one launch (attn_prep): blocks (row, h) for
// h < H norm and rope query head h; blocks (row, H + g) norm and rope key head g and write it,
// with value head g (unweighted RMSNorm when v_norm), into the cache slot of the row's position.
template <class T>
__global__ void attn_prep_kernel(AttnPrepArgs a) {
  __shared__ float sh[32];
  const int heads = a.H + a.Hk, r = blockIdx.x / heads, h = blockIdx.x % heads, D = a.head_dim;
  const int p = load(a.pos0) + r;
  const float pos = float(p) * a.position_scale;
  T* const q = static_cast<T*>(a.q);
  if (h < a.H) {
    norm_rope_head(q + (int64_t(r) * a.H + h) * D, D, a.q_norm_w, a.eps, pos, a.inv_freq, static_cast<T*>(nullptr), sh);
    return;
  }
  T *const k = static_cast<T*>(a.k), *const vv = static_cast<T*>(a.v);
  T *const kc = static_cast<T*>(a.kc), *const vc = static_cast<T*>(a.vc);
  const int g = h - a.H;
  const int64_t slot = a.window > 0 ? p % a.capacity : p;
  const int64_t at = (slot * a.Hk + g) * D, row = (int64_t(r) * a.Hk + g) * D;
  const KvQuantArgs& qa = a.quant;
  norm_rope_head(k + row, D, a.k_norm_w, a.eps, pos, a.inv_freq, qa.bits ? static_cast<T*>(nullptr) : kc + at, sh);
  T* v = vv + row;
  const float inv = a.v_norm ? inv_rms(v, D, a.eps, sh) : 1.f;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    const T x = from_f<T>(a.v_norm ? to_f(v[i]) * inv : to_f(v[i]));
    v[i] = x;
    if (!qa.bits) vc[at + i] = x;
  }
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
  __shared__ float sh[32];
  const int r = blockIdx.x / heads, h = blockIdx.x % heads;
  const float pos = float(load(pos0) + r) * position_scale;
  norm_rope_head(x + (int64_t(r) * heads + h) * head_dim, head_dim, nullptr, 0.f, pos, inv_freq,
                 static_cast<T*>(nullptr), sh);
}

// One block per new token; copies its K and V rows into their slots (or quantizes them there).
template <class T>
__global__ void kv_write_kernel(const T* k, const T* v, int row0, Dyn pos0, int n_kv_heads, int head_dim,
                                int capacity, int window, T* kc, T* vc, KvQuantArgs qa) {
  const int t = blockIdx.x, pos = load(pos0) + t, row_len = n_kv_heads * head_dim;
  const int64_t slot = window > 0 ? pos % capacity : pos;
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

// Flash-decoding attention. Grid (a.n * H, splits), kAttnWarps warps per block: block (row t,
// head h, split) takes its share of the visible positions; warp w of it every kAttnWarps-th
// position; lane l holds dims l, l + 32, ... (kPer of them, coalesced loads; a quantized cache:
// dims l*kPer .. l*kPer+kPer-1, whose codes are contiguous words of one group). Each warp keeps an
// online softmax (running max m, sum l, weighted V sum); the warps merge through shared memory.
// One split writes the normalized output; several write (acc[D], m, l) partials, and the last
// block of each (row, head) to finish merges them.
constexpr int kAttnWarps = 4;
template <int kPer, bool kQuant, class T>
__global__ void __launch_bounds__(kAttnWarps * kWarp) attention_kernel(const T* q, int H, AttnArgs a, float scale,
                                                                       float* partial, unsigned* counters, T* out) {
  __shared__ float sh_m[kAttnWarps], sh_l[kAttnWarps];
  __shared__ float sh_acc[kAttnWarps][kPer * kWarp];
  const int t = blockIdx.x / H, h = blockIdx.x % H, split = blockIdx.y, S = gridDim.y;
  const int pos = load(a.pos0) + t, D = a.head_dim, g = h / (H / a.n_kv_heads);
  int first = a.window > 0 ? max(0, pos - a.window + 1) : 0, last_pos = pos;
  if (a.blocks && a.blocks[2 * t + 1] > 0) {  // the row's image block (visible_keys)
    first = min(first, a.blocks[2 * t]);
    last_pos = max(last_pos, a.blocks[2 * t + 1] - 1);
  }
  const int n = last_pos - first + 1, per = (n + S - 1) / S;
  const int j0 = split * per, j1 = min(n, j0 + per);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(a.n_kv_heads) * D;
  const T* qh = q + (int64_t(a.row0 + t) * H + h) * D;
  auto dim = [lane](int i) { return kQuant ? lane * kPer + i : lane + kWarp * i; };
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int d = dim(i);
    qv[i] = d < D ? to_f(qh[d]) : 0.f;
    acc[i] = 0.f;
  }
  // kBatch positions per warp and iteration: their K and V rows are loaded into registers first,
  // so every load of the iteration is in flight at once (one memory latency per iteration).
  constexpr int kBatch = kPer <= 8 ? 4 : 2;
  float m = -INFINITY, l = 0.f;
  for (int j = j0 + warp; j < j1; j += kAttnWarps * kBatch) {
    float kk[kBatch][kPer], vv[kBatch][kPer];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int jj = min(j + b * kAttnWarps, j1 - 1);  // past the end: a valid row, masked below
      const int p = first + jj;
      const int slot = a.window > 0 ? p % a.capacity : p;
      if constexpr (kQuant) {  // a quantized cache: this lane's kPer contiguous values of the row
        const int64_t hr = int64_t(slot) * a.n_kv_heads + g;
        kv_dequant_run<kPer>(a.quant.kq, a.quant.ks, a.quant.kb, a.quant, hr, D, lane * kPer, kk[b]);
        kv_dequant_run<kPer>(a.quant.vq, a.quant.vs, a.quant.vb, a.quant, hr, D, lane * kPer, vv[b]);
      } else {
        const T* kr = static_cast<const T*>(a.k) + int64_t(slot) * row + int64_t(g) * D;
        const T* vr = static_cast<const T*>(a.v) + int64_t(slot) * row + int64_t(g) * D;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          const int d = lane + kWarp * i;
          kk[b][i] = d < D ? to_f(kr[d]) : 0.f;
          vv[b][i] = d < D ? to_f(vr[d]) : 0.f;
        }
      }
    }
    float sc[kBatch], mn = m;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      float d = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) d += qv[i] * kk[b][i];
      sc[b] = d;
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      sc[b] = j + b * kAttnWarps < j1 ? warp_sum(sc[b]) * scale : -INFINITY;
      mn = fmaxf(mn, sc[b]);
    }
    const float c = expf(m - mn);
    l *= c;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= c;
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const float e = expf(sc[b] - mn);  // 0 for masked positions
      l += e;
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] += e * vv[b][i];
    }
    m = mn;
  }
  if (lane == 0) {
    sh_m[warp] = m;
    sh_l[warp] = l;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) sh_acc[warp][dim(i)] = acc[i];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, sh_m[w]);
  float f[kAttnWarps], L = 0.f;
  for (int w = 0; w < kAttnWarps; ++w) {
    f[w] = sh_m[w] == -INFINITY ? 0.f : expf(sh_m[w] - M);
    L += sh_l[w] * f[w];
  }
  const int64_t rh = int64_t(a.row0 + t) * H + h;
  if (S == 1) {
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
      float v = 0.f;
      for (int w = 0; w < kAttnWarps; ++w) v += sh_acc[w][d] * f[w];
      out[rh * D + d] = from_f<T>(v / L);
    }
    return;
  }
  float* pp = partial + ((int64_t(blockIdx.x) * S) + split) * (D + 2);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.f;
    for (int w = 0; w < kAttnWarps; ++w) v += sh_acc[w][d] * f[w];
    pp[d] = v;
  }
  if (threadIdx.x == 0) {
    pp[D] = M;
    pp[D + 1] = L;
  }
  // The last split block of this (row, head) to finish merges all partials (no second launch):
  // publish this block's partial, count it, and let the block that completes the count merge.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&counters[blockIdx.x], 1u) == unsigned(S - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // Each split's weight exp(m_s - M) / L, from the headers read in parallel (one thread each).
  const float* p0 = partial + int64_t(blockIdx.x) * S * (D + 2);
  __shared__ float sh_ms[32], sh_ls[32];
  if (threadIdx.x < S) {
    sh_ms[threadIdx.x] = __ldcg(p0 + threadIdx.x * (D + 2) + D);
    sh_ls[threadIdx.x] = __ldcg(p0 + threadIdx.x * (D + 2) + D + 1);
  }
  __syncthreads();
  float Mg = -INFINITY;
  for (int sp = 0; sp < S; ++sp) Mg = fmaxf(Mg, sh_ms[sp]);
  float Lg = 0.f;
  for (int sp = 0; sp < S; ++sp)
    if (sh_ms[sp] != -INFINITY) Lg += sh_ls[sp] * expf(sh_ms[sp] - Mg);
  __syncthreads();
  if (threadIdx.x < S) sh_ls[threadIdx.x] = sh_ms[threadIdx.x] == -INFINITY ? 0.f : expf(sh_ms[threadIdx.x] - Mg) / Lg;
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = 0.f;
#pragma unroll 8
    for (int sp = 0; sp < S; ++sp) v += __ldcg(p0 + sp * (D + 2) + d) * sh_ls[sp];
    out[rh * D + d] = from_f<T>(v);
  }
  if (threadIdx.x == 0) counters[blockIdx.x] = 0u;  // ready for the next launch (graph replays too)
}

// Backend::top_k, one block of kTopKThreads per row; every pass reads the row with coalesced
// strided loads (blockDim.x a multiple of 32: the histogram passes use whole-warp intrinsics). Values become order-keeping 32-bit keys (NaN the smallest); a radix select (four
// passes of 8-bit digits, a shared histogram each) finds the k-th largest key T, how many entries
// equal to T belong to the top k, and how many equal T in all. A last pass writes every entry above
// T (slots by an atomic counter) and the entries equal to T: all of them when all are needed (the
// usual case: no tie at the k-th value), else the lowest-indexed ones, ranked chunk by chunk in
// index order (ballots within a warp, warp offsets through shared memory). The row's log-sum-exp
// comes from a max and a sum reduction.
constexpr int kTopKThreads = 1024;
__device__ inline uint32_t order_key(float x) {
  if (isnan(x)) return 0u;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
// One pass of this thread over the row: f(i, x[i], valid) for i = threadIdx.x + j * blockDim.x with
// kRowUnroll loads issued before any is used (one block per row is latency-bound otherwise). Every
// thread makes the same calls, valid == false past the end, so warp intrinsics in f see whole warps.
constexpr int kRowUnroll = 8;
template <class F>
__device__ inline void row_pass(const float* row, int n, F f) {
  const int B = blockDim.x;
  for (int base = 0; base < n; base += kRowUnroll * B) {
    float v[kRowUnroll];
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int i = base + u * B + int(threadIdx.x);
      v[u] = i < n ? row[i] : 0.f;
    }
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u) {
      const int i = base + u * B + int(threadIdx.x);
      f(i, v[u], i < n);
    }
  }
}
__global__ void __launch_bounds__(kTopKThreads) top_k_kernel(const float* x, int n, int k, float* vals,
                                                              int32_t* idx, float* lse) {
  __shared__ unsigned hist[256];
  __shared__ unsigned sh_warp[kTopKThreads / 32];
  __shared__ float sh[32];
  __shared__ uint32_t sh_prefix;
  __shared__ int sh_left, sh_eq_total;
  __shared__ unsigned sh_above, sh_eq;
  const float* row = x + int64_t(blockIdx.x) * n;
  const int B = blockDim.x;
  // log-sum-exp (NaN as -inf)
  float m = -INFINITY;
  row_pass(row, n, [&](int, float v, bool ok) {
    if (ok && !isnan(v)) m = fmaxf(m, v);
  });
  m = block_reduce(m, sh, Max{}, -INFINITY);
  float e = 0.f;
  if (m > -INFINITY)
    row_pass(row, n, [&](int, float v, bool ok) {
      if (ok && !isnan(v)) e += expf(v - m);
    });
  e = block_sum(e, sh);
  if (threadIdx.x == 0) {
    lse[blockIdx.x] = m > -INFINITY ? m + logf(e) : m;
    sh_prefix = 0u;
    sh_left = k;  // entries still to take at or below the current prefix
    sh_above = 0u;
    sh_eq = 0u;
  }
  uint32_t mask = 0u;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += B) hist[b] = 0u;
    __syncthreads();
    const uint32_t prefix = sh_prefix;
    // Logits crowd into a few bins: lanes of a warp that share a bin add once, through their leader
    // (one shared atomic per bin and warp instead of one per entry).
    row_pass(row, n, [&](int, float v, bool ok) {
      unsigned bin = 256u;  // none
      if (ok) {
        const uint32_t key = order_key(v);
        if ((key & mask) == prefix) bin = (key >> shift) & 255u;
      }
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (bin != 256u && int(threadIdx.x % 32) == __ffs(peers) - 1) atomicAdd(&hist[bin], unsigned(__popc(peers)));
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      int left = sh_left, d = 255;
      for (; d > 0; --d) {
        if (int(hist[d]) >= left) break;
        left -= int(hist[d]);
      }
      sh_prefix = prefix | (uint32_t(d) << shift);
      sh_left = left;
      sh_eq_total = int(hist[d]);  // after the last pass: the entries equal to T
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  const uint32_t T = sh_prefix;
  const int need_eq = sh_left, above_total = k - need_eq;
  const bool all_eq = sh_eq_total == need_eq;
  float* vo = vals + int64_t(blockIdx.x) * k;
  int32_t* io = idx + int64_t(blockIdx.x) * k;
  row_pass(row, n, [&](int i, float v, bool ok) {
    if (!ok) return;
    const uint32_t key = order_key(v);
    unsigned slot = 0xffffffffu;
    if (key > T) slot = atomicAdd(&sh_above, 1u);
    else if (key == T && all_eq) slot = unsigned(above_total) + atomicAdd(&sh_eq, 1u);
    if (slot != 0xffffffffu) {
      vo[slot] = v;
      io[slot] = i;
    }
  });
  if (all_eq) return;
  // More entries equal T than the top k holds: the lowest indices, chunk by chunk in index order.
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = B / 32;
  int taken = 0;  // uniform across the block
  for (int c0 = 0; c0 < n && taken < need_eq; c0 += B) {
    const int i = c0 + threadIdx.x;
    const bool eq = i < n && order_key(row[i]) == T;
    const unsigned ballot = __ballot_sync(0xffffffffu, eq);
    if (lane == 0) sh_warp[w] = __popc(ballot);
    __syncthreads();
    int before = 0, total = 0;
    for (int j = 0; j < nw; ++j) {
      before += j < w ? int(sh_warp[j]) : 0;
      total += int(sh_warp[j]);
    }
    const int rank = taken + before + __popc(ballot & ((1u << lane) - 1u));
    if (eq && rank < need_eq) {
      vo[above_total + rank] = row[i];
      io[above_total + rank] = i;
    }
    taken += total;
    __syncthreads();
  }
}

// First index of each row's largest non-NaN value. Grid (kArgmaxBlocks, rows): each block scans a
// strided share of its row (a thread's own earliest index wins its ties), reduces (value, index)
// over the block, and folds it into the row's slot with one 64-bit atomicMax of an order-keeping
// key (value bits made monotonic, high; ~index, low: equal values keep the lower index). The last
// block of the row writes the index and clears the slot and the counter for the next launch.
constexpr int kArgmaxBlocks = 64;
__device__ inline void argmax_merge(float& v, int& i, float v2, int i2) {
  if (i2 >= 0 && (i < 0 || v2 > v || (v2 == v && i2 < i))) {
    v = v2;
    i = i2;
  }
}
__global__ void argmax_kernel(const float* x, int n, unsigned long long* slots, unsigned* counters, int32_t* out) {
  __shared__ float sv[32];
  __shared__ int si[32];
  __shared__ bool last;
  const int rowi = blockIdx.y;
  const float* row = x + int64_t(rowi) * n;
  float v = -INFINITY;
  int idx = -1;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
    const float e = row[j];
    if (!isnan(e) && (idx < 0 || e > v)) {
      v = e;
      idx = j;
    }
  }
  for (int o = 16; o > 0; o >>= 1) argmax_merge(v, idx, __shfl_xor_sync(0xffffffffu, v, o), __shfl_xor_sync(0xffffffffu, idx, o));
  const int w = threadIdx.x / kWarp, l = threadIdx.x % kWarp, nw = blockDim.x / kWarp;
  if (l == 0) {
    sv[w] = v;
    si[w] = idx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < nw; ++k) argmax_merge(v, idx, sv[k], si[k]);
    if (idx >= 0) {
      const unsigned bits = __float_as_uint(v);
      const unsigned key = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
      atomicMax(slots + rowi, (static_cast<unsigned long long>(key) << 32) | unsigned(~unsigned(idx)));
    }
    __threadfence();
    last = atomicAdd(counters + rowi, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (last && threadIdx.x == 0) {
    const unsigned long long k = atomicExch(slots + rowi, 0ull);
    out[rowi] = k == 0ull ? 0 : int32_t(~unsigned(k & 0xffffffffull));
    counters[rowi] = 0u;
  }
}

template <class T>
__global__ void gelu_mul_kernel(const T* gate, const T* up, int64_t n, T* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_f<T>(gelu_tanh_mul(to_f(gate[i]), to_f(up[i])));
}

template <class T>
__global__ void gelu_mul_ggml_kernel(const T* gate, const T* up, int64_t n, const uint16_t* table, T* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_f<T>(gelu_ggml_mul(to_f(gate[i]), to_f(up[i]), table));
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, int64_t n, T* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}
template <class T>
__global__ void scale_kernel(const T* a, float s, int64_t n, T* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = from_f<T>(to_f(a[i]) * s);
}
template <class T>
__global__ void softcap_kernel(T* x, int64_t n, float cap) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = from_f<T>(tanhf(to_f(x[i]) / cap) * cap);
}
template <class T>
__global__ void gather_rows_kernel(const T* src, const int32_t* idx, int dim, T* dst) {
  const int i = blockIdx.x;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[int64_t(i) * dim + c] = src[int64_t(idx[i]) * dim + c];
}
template <class T>
__global__ void copy_cols_kernel(const T* src, int src_dim, int off, int n, T* dst) {
  const int r = blockIdx.x;
  for (int c = threadIdx.x; c < n; c += blockDim.x) dst[int64_t(r) * n + c] = src[int64_t(r) * src_dim + off + c];
}

inline unsigned blocks_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }

}  // namespace

namespace {
// y[r] = x · w[r] for one activation row and a tall matrix (the LM head): a warp per row, lane l
// on columns l, l + 32, ... (a 32-value unit's bytes in one coalesced load per step), four steps
// in flight; no staging, few registers, so many warps hide the memory latency.
constexpr int kLanesMinRows = 32768;
constexpr int kGemvWarps = 8;
template <WFormat F>
__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_lanes_kernel(const void* x, bool bf, DevWeight w, void* y,
                                                                        bool y_f32) {
  const int64_t r = int64_t(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= w.rows) return;
  const uint8_t* row = w.data + r * w.row_bytes;
  float acc = 0.f;
  if constexpr (F == WFormat::GgufQ8_0) {
    // Four columns per lane and step (a warp covers four 34-byte blocks): the block scale and two
    // 16-bit loads of quants (blocks are 2-byte aligned) against one float4 of x. Six steps per
    // iteration (768 columns: a whole 640-wide row) put all of a row's loads in flight at once.
    constexpr int kSteps = 6;
    for (int64_t c0 = 4 * lane; c0 < w.cols; c0 += kSteps * 4 * kWarp) {
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        const int64_t c = c0 + k * 4 * kWarp;
        if (c < w.cols) {
          const uint8_t* b = row + (c >> 5) * 34;
          const int j = int(c & 31);
          const float d = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(b)));
          const unsigned q01 = *reinterpret_cast<const unsigned short*>(b + 2 + j);
          const unsigned q23 = *reinterpret_cast<const unsigned short*>(b + 4 + j);
          const float4 xv = ld4x(x, c, bf);
          acc += d * (xv.x * float(int8_t(q01 & 0xffu)) + xv.y * float(int8_t(q01 >> 8)) +
                      xv.z * float(int8_t(q23 & 0xffu)) + xv.w * float(int8_t(q23 >> 8)));
        }
      }
    }
  } else if constexpr (kKquantDot<F>) {
    acc = kquant_row_dot<F>(row, x, bf, w.cols, lane);
  } else {
    for (int64_t c0 = lane; c0 < w.cols; c0 += 4 * kWarp) {
      float xv[4], wv[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * kWarp;
        xv[k] = c < w.cols ? ldx(x, c, bf) : 0.f;
        wv[k] = c < w.cols ? dequant_at(row, w, r, c) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) acc += xv[k] * wv[k];
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) store_out(y, r, acc, y_f32);
}

// Shared memory for a launch: staged weight rows (when `staged`) then the normed input.
size_t matmul_smem(const MatArgs& a, int act, bool staged, int M) {
  size_t n = 0;
  if (staged) {
    size_t rb = 0;
    for (int i = 0; i < a.n; ++i) rb = rb > size_t(a.w[i].row_bytes) ? rb : size_t(a.w[i].row_bytes);
    n += size_t(kMatWarps) * rb * (act != kPlain ? 2 : 1);
  }
  if (a.norm_w) n += size_t(M) * size_t(a.w[0].cols) * 4;
  return n;
}

// Warps per output row for K-quant rows at M = 1: about four super-blocks per warp (one unrolled
// round of loads), at most the block's 8 warps.
int kquant_split(int64_t cols) {
  const int64_t nsb = cols / 256;
  return nsb <= 4 ? 1 : nsb <= 8 ? 2 : nsb <= 16 ? 4 : 8;
}

// One launch of kquant_decode_kernel: virtual blocks of kMatWarps / split rows per weight, a grid
// of as many blocks as fit on the GPU at once (or fewer when there is less work).
template <WFormat F, int kAct>
void kquant_decode_launch(cudaStream_t s, MatArgs a) {
  a.split = kquant_split(a.w[0].cols);
  a.M = 1;
  unsigned blocks = 0;
  for (int i = 0; i < a.n; ++i) {
    a.first[i] = blocks;
    blocks += blocks_for(a.w[i].rows, kMatWarps / a.split);
  }
  a.first[a.n] = blocks;
  const size_t smem = a.norm_w ? size_t(a.w[0].cols) * 4 : 0;
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kquant_decode_kernel<F, kAct>, kMatWarps * kWarp, smem);
  const unsigned resident = unsigned((per_sm > 0 ? per_sm : 1) * sm_count());
  kquant_decode_kernel<F, kAct><<<blocks < resident ? blocks : resident, kMatWarps * kWarp, smem, s>>>(a);
}

template <WFormat F, bool kUnits, int kAct>
void matmul_launch(cudaStream_t s, MatArgs a, int M) {
  unsigned blocks = 0;
  bool aligned = true;
  for (int i = 0; i < a.n; ++i) {
    a.first[i] = blocks;
    blocks += blocks_for(a.w[i].rows, kMatWarps);
    aligned = aligned && (int64_t(kMatWarps) * a.w[i].row_bytes) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(a.w[i].data) % 16 == 0;
  }
  a.first[a.n] = blocks;
  if (kAct != kPlain)
    aligned = aligned && (int64_t(kMatWarps) * a.w2.row_bytes) % 16 == 0 &&
              reinterpret_cast<uintptr_t>(a.w2.data) % 16 == 0;
  // Staging needs 16-byte aligned block chunks (kMatWarps rows; cudaMalloc'd bases) that fit the
  // default 48 KiB of shared memory beside the normed input.
  const int m_launch = M < kMaxM ? M : kMaxM;
  const bool staged = kUnits && aligned && matmul_smem(a, kAct, true, m_launch) <= 48 * 1024;
  const size_t smem = matmul_smem(a, kAct, staged, m_launch);
  // One launch for all M rows (the kernel walks them in chunks of 8 over its staged weights).
  a.M = M;
  {
    const dim3 grid(blocks), block(kMatWarps * kWarp);
    if constexpr (!kUnits) {
      matmul_kernel<F, false, kAct, false, kMaxM><<<grid, block, smem, s>>>(a);
    } else if (a.M == 1) {
      if (staged) matmul_kernel<F, true, kAct, true, 1><<<grid, block, smem, s>>>(a);
      else matmul_kernel<F, true, kAct, false, 1><<<grid, block, smem, s>>>(a);
    } else {
      if (staged) matmul_kernel<F, true, kAct, true, kMaxM><<<grid, block, smem, s>>>(a);
      else matmul_kernel<F, true, kAct, false, kMaxM><<<grid, block, smem, s>>>(a);
    }
  }
}

template <WFormat F, int kAct>
void matmul_fmt(cudaStream_t s, const MatArgs& a, int M) {
  if (tc_matmul_applies(a, M)) {  // prefill: tensor cores
    tc_matmul(s, a, M, kAct);
    return;
  }
  if constexpr (kAct == kPlain) {
    if (M == 1 && a.n == 1 && !a.norm_w && !a.resid && a.w[0].rows >= kLanesMinRows) {
      gemv_lanes_kernel<F><<<blocks_for(a.w[0].rows, kGemvWarps), kGemvWarps * kWarp, 0, s>>>(
          a.x, a.xt == DType::BF16, a.w[0], a.y[0], a.yt == DType::F32);
      return;
    }
  }
  if constexpr (kKquantDot<F>) {
    if (M == 1) {  // decode: coalesced K-quant rows on a persistent grid
      kquant_decode_launch<F, kAct>(s, a);
      return;
    }
  }
  if (a.w[0].cols % 32 == 0) matmul_launch<F, true, kAct>(s, a, M);
  else matmul_launch<F, false, kAct>(s, a, M);
}

template <int kAct>
void matmul_any(cudaStream_t s, const MatArgs& a, int M) {
  with_format(a.w[0].fmt, [&](auto f) { matmul_fmt<decltype(f)::value, kAct>(s, a, M); });
}

template <int kPer, class T>
void attention_launch(cudaStream_t s, const T* q, int H, const AttnArgs& a, float scale, int splits,
                      float* partial, unsigned* counters, T* out) {
  const dim3 grid(unsigned(a.n * H), unsigned(splits));
  if (a.quant.bits)
    attention_kernel<kPer, true, T><<<grid, kAttnWarps * kWarp, 0, s>>>(q, H, a, scale, partial, counters, out);
  else attention_kernel<kPer, false, T><<<grid, kAttnWarps * kWarp, 0, s>>>(q, H, a, scale, partial, counters, out);
}
}  // namespace

void matmul(cudaStream_t s, const void* x, DType xt, int M, const DevWeight& w, void* y, DType yt) {
  MatArgs a{};
  a.x = x;
  a.xt = xt;
  a.yt = yt;
  a.n = 1;
  a.w[0] = w;
  a.y[0] = y;
  a.w2 = w;
  matmul_any<kPlain>(s, a, M);
}

void matmuls(cudaStream_t s, MatArgs a, int M) {
  a.w2 = a.w[0];
  matmul_any<kPlain>(s, a, M);
}

void gate_up_gelu(cudaStream_t s, MatArgs a, int M) {
  a.n = 1;
  if (a.table) matmul_any<kGeluGgml>(s, a, M);
  else matmul_any<kGelu>(s, a, M);
}

size_t matmul_norm_smem(int M, int64_t cols) { return size_t(M < kMaxM ? M : kMaxM) * size_t(cols) * 4; }

void embed(cudaStream_t s, const DevWeight& e, const int32_t* ids, int n, float scale, void* out, DType t) {
  if (n <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    with_format(e.fmt, [&](auto f) {
      constexpr WFormat F = decltype(f)::value;
      if (e.cols % 32 == 0)
        embed_kernel<F, true, T><<<dim3(n, blocks_for(e.cols / 32, kEmbedThreads)), kEmbedThreads, 0, s>>>(e, ids, scale, o);
      else
        embed_kernel<F, false, T><<<dim3(n, blocks_for(e.cols, kEmbedThreads)), kEmbedThreads, 0, s>>>(e, ids, scale, o);
    });
  });
}

void rms_norm(cudaStream_t s, const void* x, int rows, int dim, const float* w, float eps, void* y, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    rms_norm_kernel<T><<<rows, 256, 0, s>>>(static_cast<const T*>(x), dim, w, eps, static_cast<T*>(y));
  });
}

void norm_add(cudaStream_t s, void* x, const void* o, int rows, int dim, const float* w, float eps, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    norm_add_kernel<T><<<rows, 256, 0, s>>>(static_cast<T*>(x), static_cast<const T*>(o), dim, w, eps);
  });
}

void attn_prep(cudaStream_t s, const AttnPrepArgs& a, int rows) {
  if (rows <= 0) return;
  with_act(a.t, [&](auto tag) { attn_prep_kernel<decltype(tag)><<<rows * (a.H + a.Hk), 128, 0, s>>>(a); });
}

void norm_rope(cudaStream_t s, void* x, int rows, int heads, int head_dim, const float* w, float eps, Dyn pos0,
               const float* inv_freq, float position_scale, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    norm_rope_kernel<T><<<rows * heads, 128, 0, s>>>(static_cast<T*>(x), heads, head_dim, w, eps, pos0, inv_freq,
                                                     position_scale);
  });
}

void rope(cudaStream_t s, void* x, int rows, int heads, int head_dim, Dyn pos0, const float* inv_freq,
          float position_scale, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<T><<<rows * heads, 128, 0, s>>>(static_cast<T*>(x), heads, head_dim, pos0, inv_freq, position_scale);
  });
}

void kv_write(cudaStream_t s, const void* k, const void* v, int row0, int n, Dyn pos0, int n_kv_heads, int head_dim,
              int capacity, int window, void* kc, void* vc, const KvQuantArgs& quant, DType t) {
  if (n <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    kv_write_kernel<T><<<n, 256, 0, s>>>(static_cast<const T*>(k), static_cast<const T*>(v), row0, pos0, n_kv_heads,
                                         head_dim, capacity, window, static_cast<T*>(kc), static_cast<T*>(vc), quant);
  });
}

int attention_splits(int n, int H, int max_visible) {
  if (n * H >= 128) return 1;  // enough blocks already
  const int s = (max_visible + 31) / 32;
  return s < 1 ? 1 : (s > 32 ? 32 : s);
}

void attention(cudaStream_t s, const void* q_in, int H, const AttnArgs& a, float scale, int splits, float* partial,
               unsigned* counters, void* out_in) {
  if (a.n <= 0) return;
  const int per = (a.head_dim + kWarp - 1) / kWarp;  // dims per lane
  with_act(a.t, [&](auto tag) {
    using T = decltype(tag);
    const T* q = static_cast<const T*>(q_in);
    T* out = static_cast<T*>(out_in);
    if (per <= 1) attention_launch<1>(s, q, H, a, scale, splits, partial, counters, out);
    else if (per <= 2) attention_launch<2>(s, q, H, a, scale, splits, partial, counters, out);
    else if (per <= 4) attention_launch<4>(s, q, H, a, scale, splits, partial, counters, out);
    else if (per <= 8) attention_launch<8>(s, q, H, a, scale, splits, partial, counters, out);
    else attention_launch<16>(s, q, H, a, scale, splits, partial, counters, out);  // head_dim <= 512 (spec)
  });
}

void argmax(cudaStream_t s, const float* x, int rows, int n, unsigned long long* slots, unsigned* counters,
            int32_t* out) {
  if (rows > 0) argmax_kernel<<<dim3(kArgmaxBlocks, unsigned(rows)), 256, 0, s>>>(x, n, slots, counters, out);
}
void top_k(cudaStream_t s, const float* x, int rows, int n, int k, float* vals, int32_t* idx, float* lse) {
  if (rows > 0 && k > 0) top_k_kernel<<<rows, kTopKThreads, 0, s>>>(x, n, k, vals, idx, lse);
}
// Elementwise launches: one thread per element, T from the buffers' dtype.
#define G4_ELEMENTWISE(kernel, ...)                                                     \
  with_act(t, [&](auto tag) {                                                           \
    using T = decltype(tag);                                                            \
    kernel<T><<<blocks_for(int64_t(n), 256), 256, 0, s>>>(__VA_ARGS__);                 \
  })
void gelu_mul(cudaStream_t s, const void* gate, const void* up, size_t n, void* out, DType t) {
  if (n)
    G4_ELEMENTWISE(gelu_mul_kernel, static_cast<const T*>(gate), static_cast<const T*>(up), int64_t(n),
                   static_cast<T*>(out));
}
void gelu_mul_ggml(cudaStream_t s, const void* gate, const void* up, size_t n, const uint16_t* table, void* out,
                   DType t) {
  if (n)
    G4_ELEMENTWISE(gelu_mul_ggml_kernel, static_cast<const T*>(gate), static_cast<const T*>(up), int64_t(n), table,
                   static_cast<T*>(out));
}
void add(cudaStream_t s, const void* a, const void* b, size_t n, void* y, DType t) {
  if (n) G4_ELEMENTWISE(add_kernel, static_cast<const T*>(a), static_cast<const T*>(b), int64_t(n), static_cast<T*>(y));
}
void scale(cudaStream_t s, const void* a, float f, size_t n, void* y, DType t) {
  if (n) G4_ELEMENTWISE(scale_kernel, static_cast<const T*>(a), f, int64_t(n), static_cast<T*>(y));
}
void softcap(cudaStream_t s, void* x, size_t n, float cap, DType t) {
  if (n) G4_ELEMENTWISE(softcap_kernel, static_cast<T*>(x), int64_t(n), cap);
}
#undef G4_ELEMENTWISE
namespace {
template <class T>
__global__ void moe_combine_kernel(const T* y, const float* w, int k, int d, T* out) {
  const int r = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < k; ++j) acc += w[r * k + j] * to_f(y[(int64_t(r) * k + j) * d + i]);
    out[int64_t(r) * d + i] = from_f<T>(acc);
  }
}
}  // namespace

void moe_combine(cudaStream_t s, const void* y, const float* w, int rows, int k, int d, void* out, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    moe_combine_kernel<T><<<rows, 256, 0, s>>>(static_cast<const T*>(y), w, k, d, static_cast<T*>(out));
  });
}

void gather_rows(cudaStream_t s, const void* src, const int32_t* idx, int n, int dim, void* dst, DType t) {
  if (n <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    gather_rows_kernel<T><<<n, 256, 0, s>>>(static_cast<const T*>(src), idx, dim, static_cast<T*>(dst));
  });
}
void copy_cols(cudaStream_t s, const void* src, int rows, int src_dim, int off, int n, void* dst, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    copy_cols_kernel<T><<<rows, 256, 0, s>>>(static_cast<const T*>(src), src_dim, off, n, static_cast<T*>(dst));
  });
}

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev);
    return v > 0 ? v : 1;
  }();
  return n;
}

}  // namespace g4::cuda
