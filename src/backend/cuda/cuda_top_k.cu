// Backend::top_k on the device: each row's k largest logits and its log-sum-exp, in two launches
// over many blocks. A row read by one block (the former kernel) was bound by that block's memory
// latency: about 0.3 ms for a 262144-entry vocabulary, a tenth of a sampled decode step.
//
// Launch 1, grid (C chunks, rows): block c takes positions [c L, c L + L) of its row, reduces their
// max m_c and sum of exp(x - m_c), and selects the chunk's k first entries (below). Launch 2, one
// block per row, selects the row's k first among the C k candidates and combines the chunks' sums
// into the log-sum-exp. A row of one chunk (n <= L) is done by launch 1 alone.
//
// The order is (value descending, NaN last; index ascending among equal values), a total order on
// distinct indices: a row's first k are, chunk by chunk, a prefix of that chunk's first k, so the
// two-step select gives the entries one select over the row would.
//
// The select (block_select) is a radix select on order-keeping 32-bit keys: four passes of 8-bit
// digits (a shared histogram each, its bins summed from the top by a block scan) find the k-th
// key T and how many entries equal to T belong to the first k. Where fewer than all of them do (a
// tie across the k-th value), a second radix select over ~index among the entries equal to T
// finds the lowest indices. A last pass writes the chosen entries (slots by a shared counter).
#include <cstdint>

#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

constexpr int kChunkThreads = 256;   // launch 1 (at least 256: the bin scan takes a thread a bin)
constexpr int kMergeThreads = 1024;  // launch 2
constexpr int kMinChunk = 2048;      // positions a chunk takes at least (one load round of launch 1)
constexpr int kMergeList = 16384;    // candidates launch 2 should see at most (sets L for large k)
constexpr int kUnroll = 8;           // loads a thread issues before using any (latency)

__device__ inline uint32_t order_key(float x) {
  if (isnan(x)) return 0u;
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

struct SelectShared {
  unsigned hist[256];
  unsigned warp_total[kMergeThreads / 32];
  uint32_t prefix;
  int left, eq_total;
  unsigned taken;
};

// One pass of the block over a list of n entries: f(v, id, ok) for entry i = threadIdx.x + j *
// blockDim.x, kUnroll loads issued before any is used. get(i, v, id) loads entry i < n and says
// whether it exists. Every thread makes the same calls (ok false past the end or for a missing
// entry), so warp intrinsics in f see whole warps.
template <class Get, class F>
__device__ inline void list_pass(const Get& get, int n, F f) {
  const int B = blockDim.x;
  for (int base = 0; base < n; base += kUnroll * B) {
    float v[kUnroll];
    int id[kUnroll];
    bool ok[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int i = base + u * B + int(threadIdx.x);
      v[u] = 0.f;
      id[u] = 0;
      ok[u] = i < n && get(i, v[u], id[u]);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) f(v[u], id[u], ok[u]);
  }
}

// Among the entries for which key(v, id, &key) holds, the s.left-th largest key T (s.left >= 1
// on entry). Afterwards s.left = how many entries equal to T it takes to reach that rank, and
// s.eq_total = how many equal T in all. Block-wide; blockDim.x >= 256.
template <class Get, class Key>
__device__ uint32_t radix_select(const Get& get, int n, Key key, SelectShared& s) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  if (threadIdx.x == 0) s.prefix = 0u;
  uint32_t mask = 0u;
  for (int shift = 24; shift >= 0; shift -= 8) {
    if (threadIdx.x < 256) s.hist[threadIdx.x] = 0u;
    __syncthreads();
    const uint32_t prefix = s.prefix;
    const int left = s.left;
    // Keys crowd into a few bins: lanes of a warp that share a bin add once, through their leader.
    list_pass(get, n, [&](float v, int id, bool ok) {
      unsigned bin = 256u;  // none
      uint32_t k;
      if (ok && key(v, id, k) && (k & mask) == prefix) bin = (k >> shift) & 255u;
      const unsigned peers = __match_any_sync(0xffffffffu, bin);
      if (bin != 256u && lane == __ffs(peers) - 1) atomicAdd(&s.hist[bin], unsigned(__popc(peers)));
    });
    __syncthreads();
    // Bin b's suffix count (entries in bins >= b): a scan from the top, a thread a bin.
    unsigned c = 0, suffix = 0;
    if (threadIdx.x < 256) {
      c = s.hist[threadIdx.x];
      suffix = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned t = __shfl_down_sync(0xffffffffu, suffix, o);
        if (lane + o < 32) suffix += t;
      }
      if (lane == 0) s.warp_total[w] = suffix;
    }
    __syncthreads();
    if (threadIdx.x < 256) {
      for (int j = w + 1; j < 8; ++j) suffix += s.warp_total[j];
      // The bin holding the left-th largest: its suffix reaches left, the one above it does not
      // (bin 0 when the entries run out: cannot happen for left <= the eligible count).
      const int above = int(suffix - c);
      if ((int(suffix) >= left || threadIdx.x == 0) && above < left) {
        s.prefix = prefix | (uint32_t(threadIdx.x) << shift);
        s.left = left - above;
        s.eq_total = int(c);
      }
    }
    mask |= 255u << shift;
    __syncthreads();
  }
  return s.prefix;
}

// The k first entries of a list (the order above; ids distinct, k <= the entries that exist)
// into vo / io [k], in no particular order. Block-wide; blockDim.x >= 256.
template <class Get>
__device__ void block_select(const Get& get, int n, int k, float* vo, int32_t* io, SelectShared& s) {
  if (threadIdx.x == 0) s.left = k;
  __syncthreads();
  const uint32_t T = radix_select(get, n, [](float v, int, uint32_t& key) { key = order_key(v); return true; }, s);
  const bool all_eq = s.eq_total == s.left;
  uint32_t T2 = 0u;  // with a tie across the k-th value: the entries equal to T with ~id >= T2
  if (!all_eq) {
    __syncthreads();
    T2 = radix_select(get, n, [T](float v, int id, uint32_t& key) {
      key = ~uint32_t(id);
      return order_key(v) == T;
    }, s);
  }
  if (threadIdx.x == 0) s.taken = 0u;
  __syncthreads();
  list_pass(get, n, [&](float v, int id, bool ok) {
    if (!ok) return;
    const uint32_t key = order_key(v);
    if (key > T || (key == T && (all_eq || ~uint32_t(id) >= T2))) {
      const unsigned slot = atomicAdd(&s.taken, 1u);
      vo[slot] = v;
      io[slot] = id;
    }
  });
}

// Launch 1. Grid (C, rows). C == 1: the row's result into vals / idx / lse. Otherwise chunk c's
// first min(k, len) entries into cv / ci [rows, C, k] and its (m_c, sum exp(x - m_c)) into part
// [rows, C, 2].
__global__ void __launch_bounds__(kChunkThreads) top_k_chunk_kernel(const float* x, int n, int k, int L, float* vals,
                                                                     int32_t* idx, float* lse, float* cv, int32_t* ci,
                                                                     float* part) {
  pdl_enter();
  __shared__ SelectShared s;
  __shared__ float sh[32];
  const int C = gridDim.x, c = blockIdx.x, r = blockIdx.y;
  const int begin = c * L, len = min(L, n - begin);
  const float* row = x + int64_t(r) * n + begin;
  auto get = [row, begin](int i, float& v, int& id) {
    v = row[i];
    id = begin + i;
    return true;
  };
  float m = -INFINITY;
  list_pass(get, len, [&](float v, int, bool ok) {
    if (ok && !isnan(v)) m = fmaxf(m, v);
  });
  m = block_reduce(m, sh, Max{}, -INFINITY);
  float e = 0.f;
  if (m > -INFINITY)
    list_pass(get, len, [&](float v, int, bool ok) {
      if (ok && !isnan(v)) e += expf(v - m);
    });
  e = block_sum(e, sh);
  const int64_t at = int64_t(r) * C + c;
  float* vo = C == 1 ? vals + int64_t(r) * k : cv + at * k;
  int32_t* io = C == 1 ? idx + int64_t(r) * k : ci + at * k;
  if (threadIdx.x == 0) {
    if (C == 1) lse[r] = m > -INFINITY ? m + logf(e) : m;
    else part[2 * at] = m, part[2 * at + 1] = e;
  }
  if (len <= k) {  // the whole chunk
    for (int i = threadIdx.x; i < len; i += blockDim.x) vo[i] = row[i], io[i] = begin + i;
    return;
  }
  block_select(get, len, k, vo, io, s);
}

// Launch 2. One block per row: the row's first k among its chunks' candidates, and its lse.
__global__ void __launch_bounds__(kMergeThreads) top_k_merge_kernel(int n, int k, int L, int C, const float* cv,
                                                                     const int32_t* ci, const float* part,
                                                                     float* vals, int32_t* idx, float* lse) {
  pdl_enter();
  __shared__ SelectShared s;
  __shared__ float sh[32];
  const int r = blockIdx.x;
  const float* pr = part + int64_t(r) * C * 2;
  float M = -INFINITY;
  for (int c = threadIdx.x; c < C; c += blockDim.x) M = fmaxf(M, pr[2 * c]);
  M = block_reduce(M, sh, Max{}, -INFINITY);
  float S = 0.f;
  for (int c = threadIdx.x; c < C; c += blockDim.x)
    if (pr[2 * c] > -INFINITY) S += pr[2 * c + 1] * expf(pr[2 * c] - M);
  S = block_sum(S, sh);
  if (threadIdx.x == 0) lse[r] = M > -INFINITY ? M + logf(S) : M;
  const float* rv = cv + int64_t(r) * C * k;
  const int32_t* ri = ci + int64_t(r) * C * k;
  // Entry i: chunk i / k's candidate i % k, present when the chunk had that many positions.
  auto get = [rv, ri, k, L, n](int i, float& v, int& id) {
    const int c = i / k, j = i - c * k;
    if (j >= min(k, n - c * L)) return false;
    v = rv[i];
    id = ri[i];
    return true;
  };
  block_select(get, C * k, k, vals + int64_t(r) * k, idx + int64_t(r) * k, s);
}

// How launch 1 splits a row of n: chunks of len positions (at least kMinChunk, and enough that
// count k stays near kMergeList), count of them.
struct ChunkPlan {
  int len, count;
};
ChunkPlan chunk_plan(int n, int k) {
  const int64_t want = (int64_t(k) * n + kMergeList - 1) / kMergeList;
  const int len = int(want > kMinChunk ? want : kMinChunk);
  return {len, (n + len - 1) / len};
}

}  // namespace

size_t top_k_scratch_bytes(int rows, int n, int k) {
  const int C = chunk_plan(n, k).count;
  if (C <= 1) return 0;
  return size_t(rows) * C * (size_t(k) * 8 + 8);
}

void top_k(cudaStream_t s, const float* x, int rows, int n, int k, float* vals, int32_t* idx, float* lse,
           void* scratch) {
  if (rows <= 0 || k <= 0) return;
  const auto [L, C] = chunk_plan(n, k);
  float* cv = static_cast<float*>(scratch);
  int32_t* ci = C > 1 ? reinterpret_cast<int32_t*>(cv + size_t(rows) * C * k) : nullptr;
  float* part = C > 1 ? reinterpret_cast<float*>(ci + size_t(rows) * C * k) : nullptr;
  launch_kernel(top_k_chunk_kernel, dim3(unsigned(C), unsigned(rows)), kChunkThreads, 0, s, x, n, k, L, vals, idx, lse,
                cv, ci, part);
  if (C > 1)
    launch_kernel(top_k_merge_kernel, rows, kMergeThreads, 0, s, n, k, L, C, static_cast<const float*>(cv),
                  static_cast<const int32_t*>(ci), static_cast<const float*>(part), vals, idx, lse);
}

}  // namespace g4::cuda
