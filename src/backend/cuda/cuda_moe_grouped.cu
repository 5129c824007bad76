// Prefill MoE on tensor cores (cuda_moe.h): the routed (row, slot) items grouped by expert on the
// device, then one grouped GEMM launch per projection whose blocks each take kGM items of one
// expert. Nothing comes back to the host, so a prefill chunk's MoE layers queue without a sync.
//
// Grouping (moe_group_kernel, one block): count the items per expert, give each expert
// ceil(count / kGM) blocks of kGM slots (the tail slots -1), and scatter the item numbers into
// their expert's slots. The order of items inside an expert is whatever the atomics give: each
// item's output row depends on its own inputs only (every MMA output element is one row's dot
// product over the same column order), so the results are the same for any order and any batch.
//
// GEMM (moe_grouped_kernel): block (column tile, slot block) computes kGM items × kGN output
// columns of its expert, 4 warps of 32 × 32 as m16n8k16 bf16 MMAs with f32 accumulators. Per kBK
// step the items' activation rows (bf16, gathered by item / x_div) and the expert's weight rows
// (Q4_K units by one thread each, q4k_pairs; other formats by four threads a unit, load8 /
// decode8; rounded to bf16) are staged in shared memory, their global loads issued a step ahead.
// Outputs are rounded once to bf16. The gate/up
// form multiplies both weights' tiles by the same activations and stores gelu_tanh(gate) · up.
#include <cuda_bf16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_dequant8.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma_bf16.cuh"
#include "backend/cuda/cuda_moe.h"

namespace g4::cuda {
namespace {

constexpr int kGM = 64, kGN = 64, kGThreads = 128, kGPad = 8, kMaxExperts = 256;
// Shared-memory row stride (bf16) of a kBK-column tile: 8 extra values put the 8 rows a fragment
// load touches on distinct banks.
template <int kBK>
__host__ __device__ constexpr int g_ld() { return kBK + kGPad; }


// A warp's 32 × 32 tile += As[32 rows] · Bs[32 rows]ᵀ over kBK columns (row strides g_ld), the
// fragments read by ldmatrix: A as 16 × 16 tiles (rows lane % 16, columns + 8 for lanes 16-31),
// B as pairs of 8-row tiles (rows lane % 8 of tile lane / 16, columns + 8 for lanes 8-15, 24-31).
template <int kBK>
__device__ inline void warp_mma(const bf16* As, const bf16* Bs, int lane, float (*acc)[4][4]) {
  constexpr int L = g_ld<kBK>();
#pragma unroll
  for (int k0 = 0; k0 < kBK; k0 += 16) {
    uint32_t a[2][4], b[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) ldmatrix_x4(As + (16 * mi + (lane & 15)) * L + k0 + 8 * (lane >> 4), a[mi]);
#pragma unroll
    for (int nh = 0; nh < 2; ++nh)
      ldmatrix_x4(Bs + (16 * nh + 8 * (lane >> 4) + (lane & 7)) * L + k0 + 8 * ((lane >> 3) & 1), b[nh]);
#pragma unroll
    for (int nj = 0; nj < 4; ++nj)
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) mma_bf16(acc[mi][nj], a[mi], &b[nj >> 1][2 * (nj & 1)]);
  }
}

// Weight-tile stagers of one step (kBK columns of kGN rows, of W and with kGelu of U): load(u)
// issues step u's global loads into registers, nothing waiting on them; store() decodes them into
// the bf16 tiles Bs / B2s (row stride g_ld), rows past a matrix as zeros.
//
// Q4_K rows 16-byte aligned: one thread a 32-value unit, two 16-byte words and the block header
// (q4k_pairs: bf16 arithmetic, the unit's scale and min rounded to bf16, the few-row kernel's
// contract).
template <int kBK, bool kGelu>
struct Q4kWordsStage {
  static constexpr int kUnits = kGN * (kBK / 32);  // j < kUnits: row j % kGN's unit j / kGN of the step
  static constexpr int kPer = (kUnits + kGThreads - 1) / kGThreads;
  Q4kRaw w[kPer], w2[kGelu ? kPer : 1];
  __device__ void load(const DevWeight& W, const DevWeight& U, int64_t n0, int64_t u, int tid) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = tid + i * kGThreads;
      const int64_t r = n0 + j % kGN, unit = u * (kBK / 32) + j / kGN;
      const bool ok = j < kUnits && r < W.rows;
      const Q4kRaw zero{};
      w[i] = ok ? load_q4k(W.data + r * W.row_bytes + (unit / 8) * 144, int(unit % 8)) : zero;
      if constexpr (kGelu) w2[i] = ok ? load_q4k(U.data + r * U.row_bytes + (unit / 8) * 144, int(unit % 8)) : zero;
    }
  }
  __device__ void store(int64_t u, int tid, bf16* Bs, bf16* B2s) const {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = tid + i * kGThreads;
      if (j >= kUnits) continue;
      const int s = int((u * (kBK / 32) + j / kGN) % 8);
      const int off = (j % kGN) * g_ld<kBK>() + 32 * (j / kGN);
      put(w[i], s, Bs + off);
      if constexpr (kGelu) put(w2[i], s, B2s + off);
    }
  }
  static __device__ void put(const Q4kRaw& x, int s, bf16* dst) {
    uint32_t a[16];
    q4k_pairs(x, s, a);
    uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
    for (int q = 0; q < 4; ++q) d[q] = make_uint4(a[4 * q], a[4 * q + 1], a[4 * q + 2], a[4 * q + 3]);
  }
};

// Any format: four adjacent threads a unit (load8 / decode8: a warp's loads cover 8 rows'
// contiguous bytes), 8 values rounded to bf16 in one 16-byte store; Q8_0, Q5_0 and Q4_0 decoded in
// bf16 arithmetic (quarter_pairs: the block scale rounded to bf16, q4k_pairs' contract).
template <WFormat F, int kBK, bool kGelu>
struct QuarterStage {
  static constexpr int kParts = 4 * kGN * (kBK / 32);  // j: quarter j % 4 of row (j / 4) % kGN's unit
  static constexpr int kPer = kParts / kGThreads;
  Raw8 w[kPer], w2[kGelu ? kPer : 1];
  __device__ void load(const DevWeight& W, const DevWeight& U, int64_t n0, int64_t u, int tid) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = tid + i * kGThreads, q = j >> 2;
      const int64_t r = n0 + q % kGN, unit = u * (kBK / 32) + q / kGN;
      const bool ok = r < W.rows;
      w[i] = load8<F>(W.data + r * W.row_bytes, W, r, unit, j & 3, ok);
      if constexpr (kGelu) w2[i] = load8<F>(U.data + r * U.row_bytes, U, r, unit, j & 3, ok);
    }
  }
  static __device__ void put(const Raw8& x, const DevWeight& w, int64_t unit, int p, bf16* dst) {
    if constexpr (F == WFormat::GgufQ8_0 || F == WFormat::GgufQ5_0 || F == WFormat::GgufQ4_0) {
      uint32_t a[4];
      quarter_pairs<F>(x, p, a);
      *reinterpret_cast<uint4*>(dst) = make_uint4(a[0], a[1], a[2], a[3]);
    } else {
      float v[8];
      decode8<F>(x, w, unit, p, v);
      store_bf16x8(v, dst);
    }
  }
  __device__ void store(int64_t u, int tid, bf16* Bs, bf16* B2s, const DevWeight& W, const DevWeight& U) const {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int j = tid + i * kGThreads, q = j >> 2, p = j & 3;
      const int64_t unit = u * (kBK / 32) + q / kGN;
      const int off = (q % kGN) * g_ld<kBK>() + 32 * (q / kGN) + 8 * p;
      put(w[i], W, unit, p, Bs + off);
      if constexpr (kGelu) put(w2[i], U, unit, p, B2s + off);
    }
  }
};

__global__ void moe_group_kernel(const int32_t* idx, int items, int E, MoeGroups g) {
  pdl_enter();
  __shared__ int count[kMaxExperts], cursor[kMaxExperts], n_blocks;
  const int tid = threadIdx.x, nt = blockDim.x;
  for (int e = tid; e < E; e += nt) count[e] = 0;
  __syncthreads();
  for (int i = tid; i < items; i += nt) {
    const int e = idx[i];
    if (e >= 0 && e < E) atomicAdd(&count[e], 1);
  }
  __syncthreads();
  if (tid == 0) {
    int b = 0;
    for (int e = 0; e < E; ++e) {
      cursor[e] = b * kGM;
      b += (count[e] + kGM - 1) / kGM;
    }
    n_blocks = b;
    *g.n_blocks = b;
  }
  __syncthreads();
  for (int p = tid; p < n_blocks * kGM; p += nt) g.slots[p] = -1;
  for (int e = tid; e < E; e += nt)
    for (int b = cursor[e] / kGM; b < (cursor[e] + count[e] + kGM - 1) / kGM; ++b) g.block_expert[b] = e;
  __syncthreads();  // the -1 fills land before the items overwrite their slots
  for (int i = tid; i < items; i += nt) {
    const int e = idx[i];
    if (e >= 0 && e < E) g.slots[atomicAdd(&cursor[e], 1)] = i;
  }
}

// The k loop of one block: step u's activation rows (bf16, gathered by item / x_div) and weight
// tiles are loaded into registers during step u - 1's MMAs, then stored to shared memory.
template <int kBK, bool kGelu, class Stage, class Store>
__device__ inline void grouped_k_loop(const MoeMatArgs& a, const DevWeight& W, const DevWeight& U, int64_t n0,
                                      const int32_t* item, bf16* As, bf16* Bs, bf16* B2s, Stage& st, Store store,
                                      float (*acc)[4][4], float (*acc2)[4][4]) {
  constexpr int L = g_ld<kBK>();
  constexpr int kAct = kGM * kBK / 8 / kGThreads;  // 16-byte activation loads per thread and step
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;  // this warp's 32 × 32 tile
  const int64_t K = W.cols, steps = K / kBK;
  const bf16* x = static_cast<const bf16*>(a.x);
  uint4 xa[kAct];
  auto load_x = [&](int64_t u) {
#pragma unroll
    for (int i = 0; i < kAct; ++i) {
      const int v = tid + i * kGThreads, r = v / (kBK / 8), c8 = v % (kBK / 8);
      xa[i] = item[r] >= 0 ? *reinterpret_cast<const uint4*>(x + int64_t(item[r] / a.x_div) * K + u * kBK + 8 * c8)
                           : make_uint4(0, 0, 0, 0);
    }
  };
  load_x(0);
  st.load(W, U, n0, 0, tid);
  for (int64_t u = 0; u < steps; ++u) {
#pragma unroll
    for (int i = 0; i < kAct; ++i) {
      const int v = tid + i * kGThreads;
      *reinterpret_cast<uint4*>(As + (v / (kBK / 8)) * L + 8 * (v % (kBK / 8))) = xa[i];
    }
    store(u);
    __syncthreads();
    if (u + 1 < steps) {
      load_x(u + 1);
      st.load(W, U, n0, u + 1, tid);
    }
    warp_mma<kBK>(As + wm * L, Bs + wn * L, lane, acc);
    if constexpr (kGelu) warp_mma<kBK>(As + wm * L, B2s + wn * L, lane, acc2);
    __syncthreads();
  }
}

// kWords: Q4_K experts whose rows are 16-byte aligned (a.rows16), staged by Q4kWordsStage (its own
// kernel: the other stager's registers would bound its occupancy).
template <WFormat F, bool kGelu, int kBK, bool kWords>
__global__ void __launch_bounds__(kGThreads) moe_grouped_kernel(MoeMatArgs a, MoeGroups g) {
  pdl_enter_streaming();
  constexpr int L = g_ld<kBK>();
  __shared__ __align__(16) bf16 As[kGM * L];
  __shared__ __align__(16) bf16 Bs[kGN * L];
  __shared__ __align__(16) bf16 B2s[kGelu ? kGN * L : 8];
  __shared__ int32_t item[kGM];
  const int blk = blockIdx.y;
  if (blk >= *g.n_blocks) return;
  const int e = g.block_expert[blk];
  const DevWeight W = a.w[e];
  const int64_t n0 = int64_t(blockIdx.x) * kGN;
  if (n0 >= W.rows) return;
  DevWeight U{};
  if constexpr (kGelu) U = a.w2[e];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  if (tid < kGM) item[tid] = g.slots[blk * kGM + tid];
  __syncthreads();
  float acc[2][4][4] = {}, acc2[2][4][4] = {};
  if constexpr (kWords) {
    Q4kWordsStage<kBK, kGelu> st;
    grouped_k_loop<kBK, kGelu>(a, W, U, n0, item, As, Bs, B2s, st, [&](int64_t u) { st.store(u, tid, Bs, B2s); },
                               acc, acc2);
  } else {
    QuarterStage<F, kBK, kGelu> st;
    grouped_k_loop<kBK, kGelu>(a, W, U, n0, item, As, Bs, B2s, st,
                               [&](int64_t u) { st.store(u, tid, Bs, B2s, W, U); }, acc, acc2);
  }
  // Accumulator h of tile (mi, nj): row g (h < 2) or g + 8, columns 2t and 2t + 1.
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;
  bf16* y = static_cast<bf16*>(a.y);
  const int gq = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int it = item[wm + 16 * mi + gq + 8 * half];
      if (it < 0) continue;
#pragma unroll
      for (int nj = 0; nj < 4; ++nj) {
        const int64_t n = n0 + wn + 8 * nj + 2 * t;
        float v0 = acc[mi][nj][2 * half], v1 = acc[mi][nj][2 * half + 1];
        if constexpr (kGelu) {
          v0 = gelu_tanh_mul(v0, acc2[mi][nj][2 * half]);
          v1 = gelu_tanh_mul(v1, acc2[mi][nj][2 * half + 1]);
        }
        bf16* o = y + int64_t(it) * W.rows + n;
        if (n + 1 < W.rows) {
          *reinterpret_cast<__nv_bfloat162*>(o) = __floats2bfloat162_rn(v0, v1);
        } else if (n < W.rows) {
          o[0] = __float2bfloat16_rn(v0);
        }
      }
    }
}

}  // namespace

int moe_group_max_blocks(int items, int E) { return items / kGM + (items < E ? items : E) + 1; }
size_t moe_group_slots(int items, int E) { return size_t(moe_group_max_blocks(items, E)) * kGM; }

bool moe_grouped_applies(const MoeMatArgs& a, int E, int64_t out_rows) {
  const DevWeight& w = a.w0;
  return a.xt == DType::BF16 && E <= kMaxExperts && w.cols % 32 == 0 && out_rows % 2 == 0 &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && reinterpret_cast<uintptr_t>(a.y) % 4 == 0;
}

void moe_group(cudaStream_t s, const int32_t* idx, int items, int E, const MoeGroups& g) {
  launch_kernel(moe_group_kernel, 1, 1024, 0, s, idx, items, E, g);
}

void moe_grouped_matmul(cudaStream_t s, const MoeMatArgs& a, const MoeGroups& g, int items, int E, int64_t rows,
                        WFormat fmt, bool gelu) {
  if (items <= 0) return;
  const dim3 grid(unsigned((rows + kGN - 1) / kGN), unsigned(moe_group_max_blocks(items, E)));
  const bool wide = a.w0.cols % 64 == 0;  // 64-column steps: twice the units decoded per step
  with_format(fmt, [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    if constexpr (F == WFormat::GgufQ4_K) {
      if (a.rows16) {
        if (gelu && wide) launch_kernel(moe_grouped_kernel<F, true, 64, true>, grid, kGThreads, 0, s, a, g);
        else if (gelu) launch_kernel(moe_grouped_kernel<F, true, 32, true>, grid, kGThreads, 0, s, a, g);
        else if (wide) launch_kernel(moe_grouped_kernel<F, false, 64, true>, grid, kGThreads, 0, s, a, g);
        else launch_kernel(moe_grouped_kernel<F, false, 32, true>, grid, kGThreads, 0, s, a, g);
        return;
      }
    }
    if (gelu && wide) launch_kernel(moe_grouped_kernel<F, true, 64, false>, grid, kGThreads, 0, s, a, g);
    else if (gelu) launch_kernel(moe_grouped_kernel<F, true, 32, false>, grid, kGThreads, 0, s, a, g);
    else if (wide) launch_kernel(moe_grouped_kernel<F, false, 64, false>, grid, kGThreads, 0, s, a, g);
    else launch_kernel(moe_grouped_kernel<F, false, 32, false>, grid, kGThreads, 0, s, a, g);
  });
}

}  // namespace g4::cuda
