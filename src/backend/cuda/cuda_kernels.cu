// The CUDA backend's kernels (cuda_kernels.h): simple, correct f32 versions of every dense op.
// Weights are dequantized per element (cuda_dequant.cuh); each kernel states its thread layout.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.h"

namespace g4::cuda {
namespace {

constexpr int kWarp = 32;

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
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
__device__ inline float block_max(float v, float* sh) { return block_reduce(v, sh, Max{}, -INFINITY); }

// One warp per output row r, up to kMaxM activation rows per launch (the caller splits larger M).
// kUnits (the path the backend runs when cols % 32 == 0): each lane takes whole 32-value units (a
// block or sub-block of every format), decodes the unit once (dequant32) and dots it with the
// activations read as float4. Otherwise lanes stride over single columns (dequant).
constexpr int kMaxM = 8;
template <bool kUnits>
__global__ void matmul_kernel(const float* x, int M, DevWeight w, float* y) {
  const int64_t r = int64_t(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= w.rows) return;
  float acc[kMaxM];
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) acc[m] = 0.f;
  if constexpr (kUnits) {
    for (int64_t u = lane; u < w.cols / 32; u += kWarp) {
      float wv[32];
      dequant32(w, r, u, wv);
#pragma unroll
      for (int m = 0; m < kMaxM; ++m) {
        if (m >= M) break;
        const float4* xm = reinterpret_cast<const float4*>(x + int64_t(m) * w.cols + 32 * u);
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const float4 v = xm[j];
          s += v.x * wv[4 * j] + v.y * wv[4 * j + 1] + v.z * wv[4 * j + 2] + v.w * wv[4 * j + 3];
        }
        acc[m] += s;
      }
    }
  } else {
    for (int64_t c = lane; c < w.cols; c += kWarp) {
      const float wv = dequant(w, r, c);
#pragma unroll
      for (int m = 0; m < kMaxM; ++m)
        if (m < M) acc[m] += x[int64_t(m) * w.cols + c] * wv;
    }
  }
#pragma unroll
  for (int m = 0; m < kMaxM; ++m) {
    if (m >= M) break;
    const float s = warp_sum(acc[m]);
    if (lane == 0) y[int64_t(m) * w.rows + r] = s;
  }
}

// One block per token; threads over the columns.
__global__ void embed_kernel(DevWeight e, const int32_t* ids, float scale, float* out) {
  const int i = blockIdx.x;
  const int64_t id = ids[i];
  for (int64_t c = threadIdx.x; c < e.cols; c += blockDim.x) out[i * e.cols + c] = dequant(e, id, c) * scale;
}

// One block per row.
__global__ void rms_norm_kernel(const float* x, int dim, const float* w, float eps, float* y) {
  __shared__ float sh[32];
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float* yr = y + int64_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss, sh);
  const float inv = 1.0f / sqrtf(ss / float(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] * inv;
    yr[i] = w ? v * w[i] : v;
  }
}

// One block per (row, head); threads over the rotating pairs (half-split layout).
__global__ void rope_kernel(float* x, int heads, int head_dim, int pos0, const float* inv_freq,
                            float position_scale) {
  const int r = blockIdx.x / heads, h = blockIdx.x % heads, half = head_dim / 2;
  float* v = x + (int64_t(r) * heads + h) * head_dim;
  const float pos = float(pos0 + r) * position_scale;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    if (inv_freq[j] == 0.f) continue;
    float s, c;
    sincosf(pos * inv_freq[j], &s, &c);
    const float a = v[j], b = v[j + half];
    v[j] = a * c - b * s;
    v[j + half] = a * s + b * c;
  }
}

// One block per new token; copies its K and V rows into their slots.
__global__ void kv_write_kernel(const float* k, const float* v, int row0, int pos0, int row_len,
                                int capacity, int window, float* kc, float* vc) {
  const int t = blockIdx.x, pos = pos0 + t;
  const int64_t slot = window > 0 ? pos % capacity : pos;
  for (int i = threadIdx.x; i < row_len; i += blockDim.x) {
    kc[slot * row_len + i] = k[int64_t(row0 + t) * row_len + i];
    vc[slot * row_len + i] = v[int64_t(row0 + t) * row_len + i];
  }
}

// One block per (query row, head) of one sequence: scores over the visible positions into
// scratch (one row of max_pos floats per block), softmax, then the weighted sum of V.
__global__ void attention_kernel(const float* q, int H, AttnArgs a, float scale, float* scratch,
                                 int max_pos, float* out) {
  __shared__ float sh[32];
  const int t = blockIdx.x / H, h = blockIdx.x % H;
  const int pos = a.pos0 + t, D = a.head_dim, g = h / (H / a.n_kv_heads);
  const int first = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  const int n = pos - first + 1;
  const int64_t row = int64_t(a.n_kv_heads) * D;
  const float* qh = q + (int64_t(a.row0 + t) * H + h) * D;
  float* sc = scratch + int64_t(blockIdx.x) * max_pos;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const int p = first + j;
    const int64_t slot = a.window > 0 ? p % a.capacity : p;
    const float* kr = a.k + slot * row + int64_t(g) * D;
    float s = 0.f;
    for (int i = 0; i < D; ++i) s += qh[i] * kr[i];
    s *= scale;
    sc[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, sh);
  float sum = 0.f;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float e = expf(sc[j] - mx);
    sc[j] = e;
    sum += e;
  }
  sum = block_sum(sum, sh);  // its barriers also order the sc writes before the reads below
  const float inv = 1.f / sum;
  float* o = out + (int64_t(a.row0 + t) * H + h) * D;
  for (int i = threadIdx.x; i < D; i += blockDim.x) {
    float acc = 0.f;
    for (int j = 0; j < n; ++j) {
      const int p = first + j;
      const int64_t slot = a.window > 0 ? p % a.capacity : p;
      acc += sc[j] * inv * a.v[slot * row + int64_t(g) * D + i];
    }
    o[i] = acc;
  }
}

__global__ void gelu_mul_kernel(const float* gate, const float* up, int64_t n, float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = gate[i];
  const float c = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  out[i] = 0.5f * x * (1.f + tanhf(c)) * up[i];
}

__global__ void gelu_mul_ggml_kernel(const float* gate, const float* up, int64_t n, const uint16_t* table,
                                     float* out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = gate[i];
  if (x <= -10.f) {
    out[i] = 0.f;
  } else if (x >= 10.f) {
    out[i] = x * up[i];
  } else {
    const __half h = __float2half_rn(x);
    const __half gv = __ushort_as_half(table[__half_as_ushort(h)]);
    out[i] = __half2float(gv) * up[i];
  }
}

__global__ void add_kernel(const float* a, const float* b, int64_t n, float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] + b[i];
}
__global__ void scale_kernel(const float* a, float s, int64_t n, float* y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[i] * s;
}
__global__ void softcap_kernel(float* x, int64_t n, float cap) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}
__global__ void gather_rows_kernel(const float* src, const int32_t* idx, int dim, float* dst) {
  const int i = blockIdx.x;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[int64_t(i) * dim + c] = src[int64_t(idx[i]) * dim + c];
}
__global__ void copy_cols_kernel(const float* src, int src_dim, int off, int n, float* dst) {
  const int r = blockIdx.x;
  for (int c = threadIdx.x; c < n; c += blockDim.x) dst[int64_t(r) * n + c] = src[int64_t(r) * src_dim + off + c];
}

inline unsigned blocks_for(int64_t n, int per) { return unsigned((n + per - 1) / per); }

}  // namespace

namespace {
template <bool kUnits>
void matmul_launch(const float* x, int M, const DevWeight& w, float* y) {
  constexpr int kWarpsPerBlock = 8;
  const unsigned grid = blocks_for(w.rows, kWarpsPerBlock);
  for (int m0 = 0; m0 < M; m0 += kMaxM) {
    const int mm = M - m0 < kMaxM ? M - m0 : kMaxM;
    // y rows m0.. hold [mm, rows]: the kernel writes y[m * rows + r] from x[m * cols + c].
    const float* xm = x + int64_t(m0) * w.cols;
    float* ym = y + int64_t(m0) * w.rows;
    matmul_kernel<kUnits><<<grid, kWarpsPerBlock * kWarp>>>(xm, mm, w, ym);
  }
}
}  // namespace

void matmul(const float* x, int M, const DevWeight& w, float* y) {
  if (w.cols % 32 == 0) matmul_launch<true>(x, M, w, y);
  else matmul_launch<false>(x, M, w, y);
}

void embed(const DevWeight& e, const int32_t* ids, int n, float scale, float* out) {
  if (n > 0) embed_kernel<<<n, 256>>>(e, ids, scale, out);
}

void rms_norm(const float* x, int rows, int dim, const float* w, float eps, float* y) {
  if (rows > 0) rms_norm_kernel<<<rows, 256>>>(x, dim, w, eps, y);
}

void rope(float* x, int rows, int heads, int head_dim, int pos0, const float* inv_freq, float position_scale) {
  if (rows > 0) rope_kernel<<<rows * heads, 128>>>(x, heads, head_dim, pos0, inv_freq, position_scale);
}

void kv_write(const float* k, const float* v, int row0, int n, int pos0, int row_len, int capacity, int window,
              float* kc, float* vc) {
  if (n > 0) kv_write_kernel<<<n, 256>>>(k, v, row0, pos0, row_len, capacity, window, kc, vc);
}

void attention(const float* q, int H, const AttnArgs& a, float scale, float* scratch, int max_pos, float* out) {
  if (a.n > 0) attention_kernel<<<a.n * H, 256>>>(q, H, a, scale, scratch, max_pos, out);
}

void gelu_mul(const float* gate, const float* up, size_t n, float* out) {
  if (n) gelu_mul_kernel<<<blocks_for(int64_t(n), 256), 256>>>(gate, up, int64_t(n), out);
}
void gelu_mul_ggml(const float* gate, const float* up, size_t n, const uint16_t* table, float* out) {
  if (n) gelu_mul_ggml_kernel<<<blocks_for(int64_t(n), 256), 256>>>(gate, up, int64_t(n), table, out);
}
void add(const float* a, const float* b, size_t n, float* y) {
  if (n) add_kernel<<<blocks_for(int64_t(n), 256), 256>>>(a, b, int64_t(n), y);
}
void scale(const float* a, float s, size_t n, float* y) {
  if (n) scale_kernel<<<blocks_for(int64_t(n), 256), 256>>>(a, s, int64_t(n), y);
}
void softcap(float* x, size_t n, float cap) {
  if (n) softcap_kernel<<<blocks_for(int64_t(n), 256), 256>>>(x, int64_t(n), cap);
}
void gather_rows(const float* src, const int32_t* idx, int n, int dim, float* dst) {
  if (n > 0) gather_rows_kernel<<<n, 256>>>(src, idx, dim, dst);
}
void copy_cols(const float* src, int rows, int src_dim, int off, int n, float* dst) {
  if (rows > 0) copy_cols_kernel<<<rows, 256>>>(src, src_dim, off, n, dst);
}

}  // namespace g4::cuda
