// The CUDA training arithmetic's f32 kernels (cuda_grad_kernels.h). Simple and in a fixed order;
// tests compare each with the host arithmetic (train/dense_ops.h) within f32 rounding.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_grad_kernels.h"
#include "backend/dropout_mask.h"

namespace g4::cuda::grad {
namespace {

constexpr int kThreads = 256;
constexpr float kGeluA = 0.044715f, kGeluS = 0.7978845608028654f;  // MLX's gelu_approx

unsigned blocks_for(size_t n) { return unsigned((n + kThreads - 1) / kThreads); }

__device__ inline float gelu(float x) { return 0.5f * x * (1.f + tanhf(kGeluS * (x + kGeluA * x * x * x))); }
__device__ inline float gelu_grad(float x) {
  const float th = tanhf(kGeluS * (x + kGeluA * x * x * x));
  return 0.5f * (1.f + th) + 0.5f * x * (1.f - th * th) * kGeluS * (1.f + 3.f * kGeluA * x * x);
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
template <class T>
__device__ T block_sum(T v) {
  __shared__ T part[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // part may still be read from an earlier call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T t = 0;
  for (int i = 0; i < warps; ++i) t += part[i];
  return t;
}
__device__ float block_max(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float t = -INFINITY;
  for (int i = 0; i < warps; ++i) t = fmaxf(t, part[i]);
  return t;
}

#define G4_FOR_EACH(i, n) for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += size_t(gridDim.x) * blockDim.x)

__global__ void k_add(const float* a, const float* b, size_t n, float* y) { G4_FOR_EACH(i, n) y[i] = a[i] + b[i]; }
__global__ void k_scale(const float* a, float k, size_t n, float* y) { G4_FOR_EACH(i, n) y[i] = a[i] * k; }
__global__ void k_axpy(float k, const float* x, size_t n, float* y) { G4_FOR_EACH(i, n) y[i] += k * x[i]; }
__global__ void k_softcap_fwd(float* x, size_t n, float cap) { G4_FOR_EACH(i, n) x[i] = tanhf(x[i] / cap) * cap; }
__global__ void k_softcap_bwd(const float* x, size_t n, float cap, float* g) {
  G4_FOR_EACH(i, n) {
    const float t = tanhf(x[i] / cap);
    g[i] *= 1.f - t * t;
  }
}
__global__ void k_dropout_fwd(const float* x, size_t n, float p, uint64_t seed, float* y) {
  const float s = 1.f / (1.f - p);
  G4_FOR_EACH(i, n) y[i] = dropout_mask_keeps(seed, i, p) ? x[i] * s : 0.f;
}
__global__ void k_dropout_bwd(const float* dy, size_t n, float p, uint64_t seed, float* dx) {
  const float s = 1.f / (1.f - p);
  G4_FOR_EACH(i, n) if (dropout_mask_keeps(seed, i, p)) dx[i] += dy[i] * s;
}
__global__ void k_gelu_fwd(const float* g, const float* u, size_t n, float* y) { G4_FOR_EACH(i, n) y[i] = gelu(g[i]) * u[i]; }
__global__ void k_gelu_bwd(const float* g, const float* u, const float* dy, size_t n, float* dg, float* du) {
  G4_FOR_EACH(i, n) {
    dg[i] += dy[i] * u[i] * gelu_grad(g[i]);
    du[i] += dy[i] * gelu(g[i]);
  }
}

// One block per row.
__global__ void k_rms_fwd(const float* x, int dim, const float* w, float eps, float* y, float* inv) {
  const float* xr = x + size_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  const float iv = 1.f / sqrtf(block_sum(ss) / float(dim) + eps);
  if (threadIdx.x == 0) inv[blockIdx.x] = iv;
  float* yr = y + size_t(blockIdx.x) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = w ? xr[i] * iv * w[i] : xr[i] * iv;
}
// dx_i += inv·g_i - x_i·inv³·(Σ_j x_j g_j)/dim, g = w ⊙ dy.
__global__ void k_rms_bwd(const float* x, const float* inv, int dim, const float* w, const float* dy, float* dx) {
  const size_t r0 = size_t(blockIdx.x) * dim;
  double dot = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) dot += double(x[r0 + i]) * (w ? w[i] * dy[r0 + i] : dy[r0 + i]);
  dot = block_sum(dot);
  const float iv = inv[blockIdx.x], c = float(dot / dim) * iv * iv * iv;
  for (int i = threadIdx.x; i < dim; i += blockDim.x)
    dx[r0 + i] += iv * (w ? w[i] * dy[r0 + i] : dy[r0 + i]) - x[r0 + i] * c;
}

// One thread per (row, head, pair).
__global__ void k_rope(float* x, int rows, int heads, int D, int pos0, const float* inv_freq, float pscale, float sign) {
  const int half = D / 2;
  G4_FOR_EACH(t, size_t(rows) * heads * half) {
    const int j = int(t % half);
    const size_t rh = t / half;
    const int r = int(rh / heads);
    if (inv_freq[j] == 0.f) continue;
    const float th = float(pos0 + r) * pscale * inv_freq[j];
    float sn, cs;
    sincosf(th, &sn, &cs);
    sn *= sign;
    float* v = x + rh * D;
    const float a = v[j], b = v[j + half];
    v[j] = a * cs - b * sn;
    v[j + half] = a * sn + b * cs;
  }
}

__global__ void k_gather(const float* src, const int64_t* rows, size_t n, size_t dim, float* dst) {
  G4_FOR_EACH(t, n * dim) dst[t] = src[size_t(rows[t / dim]) * dim + t % dim];
}
// One thread per (group, column): the group's rows in index order (scatter_grouped_acc's plan).
__global__ void k_scatter_grouped(const float* src, const float* w, const int64_t* widx, const int64_t* plan,
                                  size_t groups, size_t dim, float* dst) {
  const int64_t* dst_rows = plan;
  const int64_t* starts = plan + groups;
  const int64_t* order = starts + groups + 1;
  G4_FOR_EACH(t, groups * dim) {
    const size_t u = t / dim, c = t % dim;
    float* d = dst + size_t(dst_rows[u]) * dim + c;
    float acc = *d;
    for (int64_t j = starts[u]; j < starts[u + 1]; ++j) {
      const size_t i = size_t(order[j]);
      acc += w ? w[widx[i]] * src[i * dim + c] : src[i * dim + c];
    }
    *d = acc;
  }
}
__global__ void k_take(float* src, const int64_t* rows, size_t n, size_t dim, float* dst) {
  G4_FOR_EACH(t, n * dim) {
    float* s = src + size_t(rows[t / dim]) * dim + t % dim;
    dst[t] += *s;
    *s = 0.f;
  }
}
__global__ void k_cols(const float* src, int rows, int n, int dst_dim, int off, float* dst) {
  G4_FOR_EACH(t, size_t(rows) * n) dst[(t / n) * dst_dim + off + t % n] += src[t];
}
__global__ void k_gather_scaled(const float* src, const int64_t* rows, const float* w, const int64_t* widx, size_t n,
                                size_t dim, float* dst) {
  G4_FOR_EACH(t, n * dim) dst[t] = w[widx[t / dim]] * src[size_t(rows[t / dim]) * dim + t % dim];
}
// One block per row i.
__global__ void k_row_dots(const float* a, const int64_t* rows, const float* b, const int64_t* widx, size_t dim,
                           float* out) {
  const size_t i = blockIdx.x;
  const float* x = a + size_t(rows[i]) * dim;
  float dot = 0.f;
  for (size_t c = threadIdx.x; c < dim; c += blockDim.x) dot += x[c] * b[i * dim + c];
  dot = block_sum(dot);
  if (threadIdx.x == 0) out[widx[i]] += dot;
}

// Operand views for the tiled product: element (r, c) of a matrix.
struct RowsOf {  // p[r·ld + c]
  const float* p;
  int64_t ld;
  __device__ float operator()(int64_t r, int64_t c) const { return p[r * ld + c]; }
};
struct ColsOf {  // p[c·ld + r]: the transpose of a row-major [.., ld] matrix
  const float* p;
  int64_t ld;
  __device__ float operator()(int64_t r, int64_t c) const { return p[c * ld + r]; }
};
struct WeightOf {  // W[r0 + r, c]
  DevWeight w;
  int64_t r0;
  __device__ float operator()(int64_t r, int64_t c) const { return dequant(w, r0 + r, c); }
};
struct WeightTOf {  // W[r0 + c, r]
  DevWeight w;
  int64_t r0;
  __device__ float operator()(int64_t r, int64_t c) const { return dequant(w, r0 + c, r); }
};

constexpr int kTI = 64, kTJ = 64, kTP = 16;

// C[i, j] = Σ_p A(i, p)·B(p, j) (accumulate: C += it) for i < I, j < J, p < P; a 64x64 tile of C
// per block of 256 threads, 4x4 per thread, p in chunks of 16 in order.
template <class A, class B>
__global__ void k_gemm(int64_t I, int64_t J, int64_t P, A a, B b, float* C, int64_t ldc, bool accumulate) {
  __shared__ float As[kTP][kTI + 1];
  __shared__ float Bs[kTP][kTJ + 1];
  const int64_t i0 = int64_t(blockIdx.y) * kTI, j0 = int64_t(blockIdx.x) * kTJ;
  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
  float acc[4][4] = {};
  for (int64_t p0 = 0; p0 < P; p0 += kTP) {
    for (int e = threadIdx.x; e < kTI * kTP; e += blockDim.x) {
      const int ii = e / kTP, pp = e % kTP;
      const int64_t i = i0 + ii, p = p0 + pp;
      As[pp][ii] = i < I && p < P ? a(i, p) : 0.f;
    }
    for (int e = threadIdx.x; e < kTJ * kTP; e += blockDim.x) {
      const int jj = e / kTP, pp = e % kTP;
      const int64_t j = j0 + jj, p = p0 + pp;
      Bs[pp][jj] = j < J && p < P ? b(p, j) : 0.f;
    }
    __syncthreads();
    for (int pp = 0; pp < kTP; ++pp) {
      float av[4], bv[4];
      for (int r = 0; r < 4; ++r) av[r] = As[pp][ty + 16 * r];
      for (int c = 0; c < 4; ++c) bv[c] = Bs[pp][tx + 16 * c];
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 4; ++c) acc[r][c] += av[r] * bv[c];
    }
    __syncthreads();
  }
  for (int r = 0; r < 4; ++r)
    for (int c = 0; c < 4; ++c) {
      const int64_t i = i0 + ty + 16 * r, j = j0 + tx + 16 * c;
      if (i < I && j < J) {
        float* o = C + i * ldc + j;
        *o = accumulate ? *o + acc[r][c] : acc[r][c];
      }
    }
}

template <class A, class B>
void gemm(cudaStream_t s, int64_t I, int64_t J, int64_t P, A a, B b, float* C, bool accumulate) {
  if (I == 0 || J == 0) return;
  const dim3 grid(unsigned((J + kTJ - 1) / kTJ), unsigned((I + kTI - 1) / kTI));
  k_gemm<<<grid, kThreads, 0, s>>>(I, J, P, a, b, C, J, accumulate);
  G4_CUDA_LAUNCHED();
}

__device__ inline int first_key(int i, int window) { return window > 0 ? max(0, i - window + 1) : 0; }

// One block per (query row i, head h): scores over keys lo..i, softmax into probs' row (zero
// elsewhere), out_i = Σ_j p_j v_j.
__global__ void k_attn_fwd(const float* q, const float* k, const float* v, int T, int H, int Hk, int D, int window,
                           float scale, float* probs, float* out) {
  const int i = blockIdx.x, h = blockIdx.y, g = h / (H / Hk);
  const int lo = first_key(i, window);
  const float* qi = q + (size_t(i) * H + h) * D;
  float* pr = probs + (size_t(h) * T + i) * T;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int j = threadIdx.x; j < T; j += blockDim.x)
    if (j < lo || j > i) pr[j] = 0.f;
  for (int j = lo + warp; j <= i; j += warps) {
    const float* kj = k + (size_t(j) * Hk + g) * D;
    float s = 0.f;
    for (int e = lane; e < D; e += 32) s += qi[e] * kj[e];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) pr[j] = s * scale;
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int j = lo + int(threadIdx.x); j <= i; j += blockDim.x) mx = fmaxf(mx, pr[j]);
  mx = block_max(mx);
  float sum = 0.f;
  for (int j = lo + int(threadIdx.x); j <= i; j += blockDim.x) sum += (pr[j] = expf(pr[j] - mx));
  const float inv = 1.f / block_sum(sum);
  for (int j = lo + int(threadIdx.x); j <= i; j += blockDim.x) pr[j] *= inv;
  __syncthreads();
  float* oi = out + (size_t(i) * H + h) * D;
  for (int e = threadIdx.x; e < D; e += blockDim.x) {
    float acc = 0.f;
    for (int j = lo; j <= i; ++j) acc += pr[j] * v[(size_t(j) * Hk + g) * D + e];
    oi[e] = acc;
  }
}

// Backward, part 1, one block per (i, h): dP_j = dout_i·v_j, dS_j = p_j (dP_j - Σ p dP)·scale
// into dS's row; dq_i += Σ_j dS_j k_j.
__global__ void k_attn_bwd_q(const float* k, const float* v, const float* probs, const float* dout, int T, int H,
                             int Hk, int D, int window, float scale, float* dq, float* dS) {
  const int i = blockIdx.x, h = blockIdx.y, g = h / (H / Hk);
  const int lo = first_key(i, window);
  const float* pr = probs + (size_t(h) * T + i) * T;
  float* ds = dS + (size_t(h) * T + i) * T;
  const float* doi = dout + (size_t(i) * H + h) * D;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int j = lo + warp; j <= i; j += warps) {
    const float* vj = v + (size_t(j) * Hk + g) * D;
    float s = 0.f;
    for (int e = lane; e < D; e += 32) s += doi[e] * vj[e];
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0) ds[j] = s;
  }
  __syncthreads();
  float dot = 0.f;
  for (int j = lo + int(threadIdx.x); j <= i; j += blockDim.x) dot += pr[j] * ds[j];
  dot = block_sum(dot);
  for (int j = lo + int(threadIdx.x); j <= i; j += blockDim.x) ds[j] = pr[j] * (ds[j] - dot) * scale;
  __syncthreads();
  float* dqi = dq + (size_t(i) * H + h) * D;
  for (int e = threadIdx.x; e < D; e += blockDim.x) {
    float acc = 0.f;
    for (int j = lo; j <= i; ++j) acc += ds[j] * k[(size_t(j) * Hk + g) * D + e];
    dqi[e] += acc;
  }
}

// Backward, part 2, one block per (key j, kv head g): over the group's heads and the rows i that
// see key j: dk_j += Σ dS_ij q_i, dv_j += Σ p_ij dout_i.
__global__ void k_attn_bwd_kv(const float* q, const float* probs, const float* dout, const float* dS, int T, int H,
                              int Hk, int D, int window, float* dk, float* dv) {
  const int j = blockIdx.x, g = blockIdx.y, group = H / Hk;
  const int hi = window > 0 ? min(T - 1, j + window - 1) : T - 1;
  for (int e = threadIdx.x; e < D; e += blockDim.x) {
    float ak = 0.f, av = 0.f;
    for (int h = g * group; h < (g + 1) * group; ++h)
      for (int i = j; i <= hi; ++i) {
        const size_t pi = (size_t(h) * T + i) * T + j, qi = (size_t(i) * H + h) * D + e;
        ak += dS[pi] * q[qi];
        av += probs[pi] * dout[qi];
      }
    dk[(size_t(j) * Hk + g) * D + e] += ak;
    dv[(size_t(j) * Hk + g) * D + e] += av;
  }
}

__global__ void k_dequant_f32(DevWeight w, int64_t r0, size_t n, float* out) {
  const size_t K = size_t(w.cols);
  G4_FOR_EACH(i, n * K) out[i] = dequant(w, r0 + int64_t(i / K), int64_t(i % K));
}

__global__ void k_dequant_bf16(DevWeight w, int64_t r0, size_t n, __nv_bfloat16* out) {
  const size_t K = size_t(w.cols);
  G4_FOR_EACH(i, n * K) out[i] = __float2bfloat16_rn(dequant(w, r0 + int64_t(i / K), int64_t(i % K)));
}
__global__ void k_to_bf16(const float* x, size_t n, __nv_bfloat16* y) { G4_FOR_EACH(i, n) y[i] = __float2bfloat16_rn(x[i]); }
// y [H, T, D] = x [T, H, D] rounded to bf16.
__global__ void k_to_bf16_heads(const float* x, int T, int H, int D, __nv_bfloat16* y) {
  G4_FOR_EACH(o, size_t(T) * H * D) {
    const size_t d = o % D, t = (o / D) % T, h = o / (size_t(D) * T);
    y[o] = __float2bfloat16_rn(x[(t * H + h) * D + d]);
  }
}

// One block per row m of a chunk's logits z [M, n].
__global__ void k_head_lse(float* z, int n, int64_t r0, float cap, const int32_t* tgt, float* mx, double* sm,
                           float* zt) {
  const int m = blockIdx.x;
  float* zr = z + size_t(m) * n;
  float cmax = -INFINITY;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float v = zr[j];
    if (cap > 0.f) v = tanhf(v / cap) * cap;
    zr[j] = v;
    cmax = fmaxf(cmax, v);
  }
  const float old = mx[m], top = fmaxf(old, block_max(cmax));
  double acc = 0.0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) acc += exp(double(zr[j]) - double(top));
  acc = block_sum(acc);
  if (threadIdx.x == 0) {
    sm[m] = (old == -INFINITY ? 0.0 : sm[m] * exp(double(old) - double(top))) + acc;
    mx[m] = top;
    const int64_t t = int64_t(tgt[m]) - r0;
    if (t >= 0 && t < n) zt[m] = zr[t];
  }
}
__global__ void k_head_finish(int M, const float* mx, const double* sm, const float* zt, double* lse, double* term) {
  G4_FOR_EACH(m, size_t(M)) {
    lse[m] = double(mx[m]) + log(sm[m]);
    term[m] = lse[m] - double(zt[m]);
  }
}
__global__ void k_head_grad(float* z, int n, int64_t r0, float cap, const int32_t* tgt, const double* lse,
                            float weight) {
  const int m = blockIdx.x;
  float* zr = z + size_t(m) * n;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    float v = zr[j];
    if (cap > 0.f) v = tanhf(v / cap) * cap;
    float g = float(exp(double(v) - lse[m])) - (r0 + j == tgt[m] ? 1.f : 0.f);
    if (cap > 0.f) {
      const float c = v / cap;
      g *= 1.f - c * c;
    }
    zr[j] = g * weight;
  }
}

// One block per (row i, head h) of [H, T, T].
__global__ void k_attn_softmax(float* P, int T, int window, float scale, __nv_bfloat16* copy) {
  const int i = blockIdx.x, h = blockIdx.y, lo = first_key(i, window);
  float* pr = P + (size_t(h) * T + i) * T;
  float mx = -INFINITY;
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    if (j < lo || j > i) continue;
    pr[j] *= scale;
    mx = fmaxf(mx, pr[j]);
  }
  mx = block_max(mx);
  float sum = 0.f;
  for (int j = threadIdx.x; j < T; j += blockDim.x) sum += (pr[j] = j < lo || j > i ? 0.f : expf(pr[j] - mx));
  const float inv = 1.f / block_sum(sum);
  __nv_bfloat16* cr = copy ? copy + (size_t(h) * T + i) * T : nullptr;
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    pr[j] *= inv;
    if (cr) cr[j] = __float2bfloat16_rn(pr[j]);
  }
}
__global__ void k_attn_score_grad(const float* P, float* dP, int T, int window, float scale, __nv_bfloat16* ds_copy,
                                  __nv_bfloat16* p_copy) {
  const int i = blockIdx.x, h = blockIdx.y, lo = first_key(i, window);
  const size_t at = (size_t(h) * T + i) * T;
  const float* pr = P + at;
  float* d = dP + at;
  float dot = 0.f;
  for (int j = lo + int(threadIdx.x); j <= i; j += blockDim.x) dot += pr[j] * d[j];
  dot = block_sum(dot);
  for (int j = threadIdx.x; j < T; j += blockDim.x) {
    d[j] = j < lo || j > i ? 0.f : pr[j] * (d[j] - dot) * scale;
    if (ds_copy) ds_copy[at + j] = __float2bfloat16_rn(d[j]);
    if (p_copy) p_copy[at + j] = __float2bfloat16_rn(pr[j]);
  }
}

__global__ void k_router_bwd(const float* scores, const int32_t* idx, const float* dw, int rows, int E, int k,
                             const float* per_expert_scale, float* ds) {
  G4_FOR_EACH(r, size_t(rows)) {
    float pr[32], dp[32];
    const float* s = scores + r * E;
    const int32_t* e = idx + r * k;
    float mx = -INFINITY, sum = 0.f, dot = 0.f;
    for (int j = 0; j < k; ++j) mx = fmaxf(mx, s[e[j]]);
    for (int j = 0; j < k; ++j) sum += (pr[j] = expf(s[e[j]] - mx));
    for (int j = 0; j < k; ++j) {
      pr[j] /= sum;
      dp[j] = dw[r * k + j] * per_expert_scale[e[j]];
      dot += pr[j] * dp[j];
    }
    for (int j = 0; j < k; ++j) ds[r * E + e[j]] += pr[j] * (dp[j] - dot);
  }
}

}  // namespace

#define G4_LAUNCH_N(kernel, n, ...)                                        \
  do {                                                                     \
    if ((n) == 0) return;                                                  \
    kernel<<<std::min(blocks_for(n), 65535u), kThreads, 0, s>>>(__VA_ARGS__); \
    G4_CUDA_LAUNCHED();                                                    \
  } while (0)

void add(cudaStream_t s, const float* a, const float* b, size_t n, float* y) { G4_LAUNCH_N(k_add, n, a, b, n, y); }
void scale(cudaStream_t s, const float* a, float k, size_t n, float* y) { G4_LAUNCH_N(k_scale, n, a, k, n, y); }
void axpy_acc(cudaStream_t s, float k, const float* x, size_t n, float* y) { G4_LAUNCH_N(k_axpy, n, k, x, n, y); }
void softcap_fwd(cudaStream_t s, float* x, size_t n, float cap) { G4_LAUNCH_N(k_softcap_fwd, n, x, n, cap); }
void softcap_bwd(cudaStream_t s, const float* x, size_t n, float cap, float* g) {
  G4_LAUNCH_N(k_softcap_bwd, n, x, n, cap, g);
}
void dropout_fwd(cudaStream_t s, const float* x, size_t n, float p, uint64_t seed, float* y) {
  G4_LAUNCH_N(k_dropout_fwd, n, x, n, p, seed, y);
}
void dropout_bwd(cudaStream_t s, const float* dy, size_t n, float p, uint64_t seed, float* dx) {
  G4_LAUNCH_N(k_dropout_bwd, n, dy, n, p, seed, dx);
}
void gelu_mul_fwd(cudaStream_t s, const float* g, const float* u, size_t n, float* y) {
  G4_LAUNCH_N(k_gelu_fwd, n, g, u, n, y);
}
void gelu_mul_bwd(cudaStream_t s, const float* g, const float* u, const float* dy, size_t n, float* dg, float* du) {
  G4_LAUNCH_N(k_gelu_bwd, n, g, u, dy, n, dg, du);
}

void rms_norm_fwd(cudaStream_t s, const float* x, int rows, int dim, const float* w, float eps, float* y, float* inv) {
  if (rows == 0) return;
  k_rms_fwd<<<rows, kThreads, 0, s>>>(x, dim, w, eps, y, inv);
  G4_CUDA_LAUNCHED();
}
void rms_norm_bwd(cudaStream_t s, const float* x, const float* inv, int rows, int dim, const float* w, const float* dy,
                  float* dx) {
  if (rows == 0) return;
  k_rms_bwd<<<rows, kThreads, 0, s>>>(x, inv, dim, w, dy, dx);
  G4_CUDA_LAUNCHED();
}
void rope(cudaStream_t s, float* x, int rows, int heads, int D, int pos0, const float* inv_freq, float position_scale,
          float sign) {
  G4_LAUNCH_N(k_rope, size_t(rows) * heads * (D / 2), x, rows, heads, D, pos0, inv_freq, position_scale, sign);
}
void gather_rows(cudaStream_t s, const float* src, const int64_t* rows, size_t n, size_t dim, float* dst) {
  G4_LAUNCH_N(k_gather, n * dim, src, rows, n, dim, dst);
}
void scatter_grouped_acc(cudaStream_t s, const float* src, const float* w, const int64_t* widx, const int64_t* plan,
                         size_t groups, size_t dim, float* dst) {
  G4_LAUNCH_N(k_scatter_grouped, groups * dim, src, w, widx, plan, groups, dim, dst);
}
void take_rows_acc(cudaStream_t s, float* src, const int64_t* rows, size_t n, size_t dim, float* dst) {
  G4_LAUNCH_N(k_take, n * dim, src, rows, n, dim, dst);
}
void cols_acc(cudaStream_t s, const float* src, int rows, int n, int dst_dim, int off, float* dst) {
  G4_LAUNCH_N(k_cols, size_t(rows) * n, src, rows, n, dst_dim, off, dst);
}
void gather_scaled(cudaStream_t s, const float* src, const int64_t* rows, const float* w, const int64_t* widx,
                   size_t n, size_t dim, float* dst) {
  G4_LAUNCH_N(k_gather_scaled, n * dim, src, rows, w, widx, n, dim, dst);
}
void row_dots_acc(cudaStream_t s, const float* a, const int64_t* rows, const float* b, const int64_t* widx, size_t n,
                  size_t dim, float* out) {
  if (n == 0) return;
  k_row_dots<<<unsigned(n), kThreads, 0, s>>>(a, rows, b, widx, dim, out);
  G4_CUDA_LAUNCHED();
}

void dequant_rows_f32(cudaStream_t s, const DevWeight& W, int64_t r0, int64_t n, float* out) {
  G4_LAUNCH_N(k_dequant_f32, size_t(n) * size_t(W.cols), W, r0, size_t(n), out);
}

void dequant_rows_bf16(cudaStream_t s, const DevWeight& W, int64_t r0, int64_t n, __nv_bfloat16* out) {
  G4_LAUNCH_N(k_dequant_bf16, size_t(n) * size_t(W.cols), W, r0, size_t(n), out);
}
void to_bf16(cudaStream_t s, const float* x, size_t n, __nv_bfloat16* y) { G4_LAUNCH_N(k_to_bf16, n, x, n, y); }
void to_bf16_heads(cudaStream_t s, const float* x, int T, int H, int D, __nv_bfloat16* y) {
  G4_LAUNCH_N(k_to_bf16_heads, size_t(T) * H * D, x, T, H, D, y);
}

void matmul_wt(cudaStream_t s, const float* x, int M, const DevWeight& W, float* y) {
  gemm(s, M, W.rows, W.cols, RowsOf{x, W.cols}, WeightTOf{W, 0}, y, false);
}
void matmul_w_acc(cudaStream_t s, const float* dy, int M, const DevWeight& W, float* dx) {
  gemm(s, M, W.cols, W.rows, RowsOf{dy, W.rows}, WeightOf{W, 0}, dx, true);
}
void gemm_tn_acc(cudaStream_t s, const float* a, const float* b, float* c, int M, int K, int N) {
  gemm(s, K, N, M, ColsOf{a, K}, RowsOf{b, N}, c, true);
}

void head_logits(cudaStream_t s, const float* X, int M, const DevWeight& E, int64_t r0, int n, float* z) {
  gemm(s, M, n, E.cols, RowsOf{X, E.cols}, WeightTOf{E, r0}, z, false);
}
void head_lse(cudaStream_t s, float* z, int M, int n, int64_t r0, float cap, const int32_t* tgt, float* mx, double* sm,
              float* zt) {
  if (M == 0) return;
  k_head_lse<<<M, kThreads, 0, s>>>(z, n, r0, cap, tgt, mx, sm, zt);
  G4_CUDA_LAUNCHED();
}
void head_finish(cudaStream_t s, int M, const float* mx, const double* sm, const float* zt, double* lse, double* term) {
  G4_LAUNCH_N(k_head_finish, size_t(M), M, mx, sm, zt, lse, term);
}
void head_grad(cudaStream_t s, float* z, int M, int n, int64_t r0, float cap, const int32_t* tgt, const double* lse,
               float weight) {
  if (M == 0) return;
  k_head_grad<<<M, kThreads, 0, s>>>(z, n, r0, cap, tgt, lse, weight);
  G4_CUDA_LAUNCHED();
}
void head_back(cudaStream_t s, const float* z, int M, int n, const DevWeight& E, int64_t r0, float* dX) {
  gemm(s, M, E.cols, n, RowsOf{z, n}, WeightOf{E, r0}, dX, true);
}

void attention_fwd(cudaStream_t s, const float* q, const float* k, const float* v, int T, int H, int Hk, int D,
                   int window, float scale, float* probs, float* out) {
  if (T == 0 || H == 0) return;
  k_attn_fwd<<<dim3(unsigned(T), unsigned(H)), kThreads, 0, s>>>(q, k, v, T, H, Hk, D, window, scale, probs, out);
  G4_CUDA_LAUNCHED();
}
void attention_bwd(cudaStream_t s, const float* q, const float* k, const float* v, const float* probs,
                   const float* dout, int T, int H, int Hk, int D, int window, float scale, float* dq, float* dk,
                   float* dv, float* scratch) {
  if (T == 0 || H == 0) return;
  k_attn_bwd_q<<<dim3(unsigned(T), unsigned(H)), kThreads, 0, s>>>(k, v, probs, dout, T, H, Hk, D, window, scale, dq,
                                                                    scratch);
  G4_CUDA_LAUNCHED();
  k_attn_bwd_kv<<<dim3(unsigned(T), unsigned(Hk)), kThreads, 0, s>>>(q, probs, dout, scratch, T, H, Hk, D, window, dk,
                                                                     dv);
  G4_CUDA_LAUNCHED();
}

void attn_softmax(cudaStream_t s, float* scores, int T, int H, int window, float scale, __nv_bfloat16* copy) {
  if (T == 0 || H == 0) return;
  k_attn_softmax<<<dim3(unsigned(T), unsigned(H)), kThreads, 0, s>>>(scores, T, window, scale, copy);
  G4_CUDA_LAUNCHED();
}
void attn_score_grad(cudaStream_t s, const float* probs, float* dP, int T, int H, int window, float scale,
                     __nv_bfloat16* ds_copy, __nv_bfloat16* p_copy) {
  if (T == 0 || H == 0) return;
  k_attn_score_grad<<<dim3(unsigned(T), unsigned(H)), kThreads, 0, s>>>(probs, dP, T, window, scale, ds_copy, p_copy);
  G4_CUDA_LAUNCHED();
}

void router_bwd(cudaStream_t s, const float* scores, const int32_t* idx, const float* dw, int rows, int E, int k,
                const float* per_expert_scale, float* ds) {
  G4_LAUNCH_N(k_router_bwd, size_t(rows), scores, idx, dw, rows, E, k, per_expert_scale, ds);
}

}  // namespace g4::cuda::grad
