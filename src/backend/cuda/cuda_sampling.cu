// Sampling kernels over f32 logits: argmax, and the draw from the candidates top_k left
// (cuda_top_k.cu).
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

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
  pdl_enter();
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

// Backend::draw_top, one block of kDrawThreads per row: sampling/top_draw.cpp's draw_top, the
// same float and double operations in the same order. Each thread ranks its candidate among the
// row's k (descending logprob, lowest id among ties: distinct ids, so the ranks are a permutation)
// and writes it to its place; the weights of the top_p and draw sums are computed a thread each
// (each is independent of the order), and thread 0 makes the sequential sums, cuts and the draw.
constexpr int kDrawThreads = 256;
__global__ void __launch_bounds__(kDrawThreads) draw_top_kernel(const float* vals, const int32_t* idx,
                                                                const float* lse, int k, const float* fp,
                                                                const int32_t* ip, int32_t* out) {
  pdl_enter();
  __shared__ float lp[kDrawThreads], e[kDrawThreads];
  __shared__ int id[kDrawThreads];
  __shared__ int n_keep;
  __shared__ float max_lp;
  const int r = blockIdx.x, t = threadIdx.x;
  const float top_p = fp[r * 4], min_p_log = fp[r * 4 + 1], temperature = fp[r * 4 + 2];
  const int top_k = ip[r * 4], min_keep = ip[r * 4 + 1];
  const uint64_t bits = (uint64_t(uint32_t(ip[r * 4 + 2])) << 32) | uint64_t(uint32_t(ip[r * 4 + 3]));
  float v = -INFINITY;
  int my_id = 0x7fffffff;
  if (t < k) {
    v = __fsub_rn(vals[int64_t(r) * k + t], lse[r]);
    if (isnan(v)) v = -INFINITY;
    my_id = idx[int64_t(r) * k + t];
  }
  lp[t] = v;
  id[t] = my_id;
  __syncthreads();
  int rank = 0;
  for (int j = 0; j < k; ++j) rank += lp[j] > v || (lp[j] == v && id[j] < my_id);
  __syncthreads();
  if (t < k) {
    lp[rank] = v;
    id[rank] = my_id;
  }
  __syncthreads();
  int n = min(k, max(1, top_k));
  if (t == 0) {
    max_lp = lp[0];
    n_keep = n;
  }
  __syncthreads();
  if (!(temperature > 0) || !isfinite(max_lp)) {
    if (t == 0) out[r] = id[0];
    return;
  }
  if (top_p > 0 && top_p < 1) {  // top_p_head (the whole row's mass is 1)
    if (t < n) e[t] = expf(lp[t]);
    __syncthreads();
    if (t == 0) {
      float acc = 0.f;
      int h = n;
      for (int j = 0; j < n; ++j) {
        if (acc >= top_p) {
          h = j;
          break;
        }
        acc = __fadd_rn(acc, e[j]);
      }
      h = max(h, 1);
      const float thr = lp[h - 1];
      while (h < n && lp[h] >= thr) ++h;
      n_keep = h;
    }
    __syncthreads();
    n = n_keep;
  }
  if (min_keep > 0 && t == 0) {  // cut_min_p_sorted: the survivors are a prefix of the sorted list
    const float thr = __fadd_rn(max_lp, min_p_log);
    int keep = 0;
    for (int j = 0; j < n; ++j) keep += lp[j] >= thr;
    n_keep = keep >= min_keep || keep == n ? keep : min(min_keep, n);
  }
  __syncthreads();
  n = n_keep;
  float m = -INFINITY;  // draw_index
  for (int j = 0; j < n; ++j) m = m < lp[j] ? lp[j] : m;
  const float inv_t = __fdiv_rn(1.0f, temperature);
  if (t < n) e[t] = expf(__fmul_rn(__fsub_rn(lp[t], m), inv_t));
  __syncthreads();
  if (t != 0) return;
  double sum = 0;
  for (int j = 0; j < n; ++j) sum = __dadd_rn(sum, double(e[j]));
  const double u = __dmul_rn(__dmul_rn(double(bits), 0x1.0p-53), sum);
  double acc = 0;
  int last = -1;
  for (int j = 0; j < n; ++j) {
    if (e[j] <= 0) continue;
    last = j;
    acc = __dadd_rn(acc, double(e[j]));
    if (u < acc) {
      out[r] = id[j];
      return;
    }
  }
  out[r] = id[last < 0 ? 0 : last];
}

}  // namespace

void draw_top(cudaStream_t s, const float* vals, const int32_t* idx, const float* lse, int rows, int k,
              const float* fparams, const int32_t* iparams, int32_t* out) {
  if (rows > 0) launch_kernel(draw_top_kernel, rows, kDrawThreads, 0, s, vals, idx, lse, k, fparams, iparams, out);
}
void argmax(cudaStream_t s, const float* x, int rows, int n, unsigned long long* slots, unsigned* counters,
            int32_t* out) {
  if (rows > 0) launch_kernel(argmax_kernel, dim3(kArgmaxBlocks, unsigned(rows)), 256, 0, s, x, n, slots, counters, out);
}

}  // namespace g4::cuda
