// Sampling kernels over f32 logits: argmax and the top-k radix select with the row's log-sum-exp.
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

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
  pdl_enter();
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
void top_k(cudaStream_t s, const float* x, int rows, int n, int k, float* vals, int32_t* idx, float* lse) {
  if (rows > 0 && k > 0) launch_kernel(top_k_kernel, rows, kTopKThreads, 0, s, x, n, k, vals, idx, lse);
}

}  // namespace g4::cuda
