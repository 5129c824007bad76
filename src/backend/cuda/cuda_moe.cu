// Mixture-of-experts kernels (cuda_kernels.h): the router's top-k on the device, the routed experts'
// GEMVs reading only the chosen experts' rows, and the weighted combine. With these a decode step's
// MoE layers need no host synchronization, so the whole step replays as one CUDA graph.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_moe.h"
#include "backend/cuda/cuda_moe_combine.cuh"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

template <class T>
__global__ void moe_combine_kernel(const T* y, const float* w, int k, int d, T* out) {
  pdl_enter();
  const int r = blockIdx.x;
  for (int i = threadIdx.x; i < d; i += blockDim.x) out[int64_t(r) * d + i] = from_f<T>(moe_combined(y, w, r, k, d, i));
}

// One warp per row of scores [rows, E] (E <= 32 * kPer): k rounds of a warp arg-max by (value,
// index), ties to the higher index (mx.argpartition's order, host_backend.cpp router_topk), NaN
// ranked as -inf; then the softmax over the k chosen in f32 and the per-expert scales. idx / w
// [rows, k] in selection order (descending score).
constexpr int kRouterPer = 8;
__global__ void router_topk_kernel(const void* scores, bool bf, int rows, int E, int k, const float* per_expert_scale,
                                   int32_t* idx, float* w) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // The scales of this lane's experts, before the wait (weights are never written during a step):
  // the chosen experts' scales then come by shuffle, not by loads after the choice.
  float scale[kRouterPer];
#pragma unroll
  for (int j = 0; j < kRouterPer; ++j) scale[j] = lane + kWarp * j < E ? per_expert_scale[lane + kWarp * j] : 0.f;
  pdl_enter();
  if (row >= rows) return;
  float v[kRouterPer];
#pragma unroll
  for (int j = 0; j < kRouterPer; ++j) {
    const int e = lane + kWarp * j;
    const float x = e < E ? ldx(scores, int64_t(row) * E + e, bf) : -INFINITY;
    v[j] = isnan(x) ? -INFINITY : x;
  }
  unsigned taken = 0;  // bit j: this lane's expert lane + 32 j is chosen
  float sum = 0.f, first = 0.f, mine = 0.f, my_scale = 0.f;  // lane r: round r's exp and its expert's scale
  for (int r = 0; r < k; ++r) {
    float bv = -INFINITY;
    int bi = -1;
#pragma unroll
    for (int j = 0; j < kRouterPer; ++j) {
      const int e = lane + kWarp * j;
      if (e < E && !(taken >> j & 1u) && (bi < 0 || v[j] > bv || (v[j] == bv && e > bi))) bv = v[j], bi = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      if (oi >= 0 && (bi < 0 || ov > bv || (ov == bv && oi > bi))) bv = ov, bi = oi;
    }
    if (bi % kWarp == lane) taken |= 1u << (bi / kWarp);
    if (r == 0) first = bv;  // the largest: the softmax's max
    const float e = expf(bv - first);
    sum += e;
    float sc = 0.f;  // expert bi's scale, from the lane that holds it
#pragma unroll
    for (int j = 0; j < kRouterPer; ++j)
      if (j == bi / kWarp) sc = scale[j];
    sc = __shfl_sync(0xffffffffu, sc, bi % kWarp);
    if (lane == r) mine = e, my_scale = sc;
    if (lane == 0) idx[int64_t(row) * k + r] = bi;
  }
  if (lane < k) w[int64_t(row) * k + lane] = mine / sum * my_scale;
}

// Routed expert GEMVs: grid (row blocks, items); warp w of block b computes output row
// r = 8 b + w of expert e = idx[item] on activation row item / a.x_div (x [.., cols], of type
// a.xt): y[item, r] = x·W_e[r] (kAct kPlain) or gelu(x·G_e[r]) * (x·U_e[r]) (kGelu: a.w = gate,
// a.w2 = up experts), stored in a.xt. The experts' DevWeights are device arrays indexed by e.
constexpr int kMoeWarps = 8;
template <WFormat F, int kAct>
__global__ void __launch_bounds__(kMoeWarps * kWarp) moe_matmul_kernel(MoeMatArgs a) {
  pdl_enter_streaming();
  const int item = blockIdx.y, lane = threadIdx.x % kWarp;
  const int e = a.idx[item];
  const DevWeight W = a.w[e];
  const int64_t r = int64_t(blockIdx.x) * kMoeWarps + threadIdx.x / kWarp;
  if (r >= W.rows) return;
  const bool bf = a.xt == DType::BF16;
  const int64_t x0 = int64_t(item / a.x_div) * W.cols;
  const uint8_t* row = W.data + r * W.row_bytes;
  DevWeight U{};
  const uint8_t* row2 = nullptr;
  if constexpr (kAct != 0) {
    U = a.w2[e];
    row2 = U.data + r * U.row_bytes;
  }
  float s1 = 0.f, s2 = 0.f;
  if (W.cols % 32 == 0) {
    for (int64_t u = lane; u < W.cols / 32; u += kWarp) {
      float wv[32], uv[32];
      dequant32<F>(row, W, r, u, wv);
      if constexpr (kAct != 0) dequant32<F>(row2, U, r, u, uv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float4 xv = ld4x(a.x, x0 + 32 * u + 4 * j, bf);
        s1 += xv.x * wv[4 * j] + xv.y * wv[4 * j + 1] + xv.z * wv[4 * j + 2] + xv.w * wv[4 * j + 3];
        if constexpr (kAct != 0)
          s2 += xv.x * uv[4 * j] + xv.y * uv[4 * j + 1] + xv.z * uv[4 * j + 2] + xv.w * uv[4 * j + 3];
      }
    }
  } else {
    for (int64_t c = lane; c < W.cols; c += kWarp) {
      const float xv = ldx(a.x, x0 + c, bf);
      s1 += xv * dequant_at(row, W, r, c);
      if constexpr (kAct != 0) s2 += xv * dequant_at(row2, U, r, c);
    }
  }
  s1 = warp_sum(s1);
  if constexpr (kAct != 0) s2 = warp_sum(s2);
  if (lane == 0) {
    const float v = kAct != 0 ? gelu_tanh_mul(s1, s2) : s1;
    store_out(a.y, int64_t(item) * W.rows + r, v, !bf);
  }
}

}  // namespace

void router_topk(cudaStream_t s, const void* scores, DType st, int rows, int E, int k, const float* per_expert_scale,
                 int32_t* idx, float* w) {
  if (rows <= 0) return;
  constexpr int kRowsPerBlock = 4;
  launch_kernel(router_topk_kernel, blocks_for(rows, kRowsPerBlock), kRowsPerBlock * kWarp, 0, s,
      scores, st == DType::BF16, rows, E, k, per_expert_scale, idx, w);
}
bool router_topk_applies(int E, int k) { return E <= kWarp * kRouterPer && k >= 1 && k <= kWarp && k <= E; }

void moe_matmul(cudaStream_t s, const MoeMatArgs& a, int items, int per_token, int64_t rows, WFormat fmt,
                bool gelu) {
  if (items <= 0) return;
  if (q8_moe_matmul(s, a, items, per_token, rows, gelu)) return;
  const dim3 grid(blocks_for(rows, kMoeWarps), unsigned(items));
  with_format(fmt, [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    if (gelu) launch_kernel(moe_matmul_kernel<F, 1>, grid, kMoeWarps * kWarp, 0, s, a);
    else launch_kernel(moe_matmul_kernel<F, 0>, grid, kMoeWarps * kWarp, 0, s, a);
  });
}

void moe_combine(cudaStream_t s, const void* y, const float* w, int rows, int k, int d, void* out, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(moe_combine_kernel<T>, rows, 256, 0, s, static_cast<const T*>(y), w, k, d, static_cast<T*>(out));
  });
}

}  // namespace g4::cuda
