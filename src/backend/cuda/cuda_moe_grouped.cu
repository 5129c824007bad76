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
// (Q4_K units by one thread each, q4k_pairs; other formats by four threads a unit, dequant8;
// rounded to bf16) are staged in shared memory. Outputs are rounded once to bf16. The gate/up
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


// A warp's 32 × 32 tile += As[32 rows] · Bs[32 rows]ᵀ over kBK columns (row strides g_ld).
template <int kBK>
__device__ inline void warp_mma(const bf16* As, const bf16* Bs, int lane, float (*acc)[4][4]) {
  constexpr int L = g_ld<kBK>();
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k0 = 0; k0 < kBK; k0 += 16) {
    uint32_t a[2][4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
      const bf16* p = As + (16 * mi + g) * L + k0 + 2 * t;
      a[mi][0] = ld_pair(p);
      a[mi][1] = ld_pair(p + 8 * L);
      a[mi][2] = ld_pair(p + 8);
      a[mi][3] = ld_pair(p + 8 * L + 8);
    }
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      const bf16* q = Bs + (8 * nj + g) * L + k0 + 2 * t;
      const uint32_t b[2] = {ld_pair(q), ld_pair(q + 8)};
#pragma unroll
      for (int mi = 0; mi < 2; ++mi) mma_bf16(acc[mi][nj], a[mi], b);
    }
  }
}

// Values 8p .. 8p + 7 of weight row n0 + row's 32-value unit `unit`, rounded to bf16, into
// Bs[row][32·sub + 8p ..] (rows past the matrix: zeros). Four adjacent threads take a unit
// (dequant8), so a warp's loads cover 8 rows' contiguous bytes.
template <WFormat F, int kBK>
__device__ inline void stage_part(const DevWeight& w, int64_t n0, int row, int64_t unit, int sub, int p, bf16* Bs) {
  const int64_t r = n0 + row;
  float v[8];
  if (r < w.rows) {
    dequant8<F>(w.data + r * w.row_bytes, w, r, unit, p, v);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = 0.f;
  }
  *reinterpret_cast<uint4*>(Bs + row * g_ld<kBK>() + 32 * sub + 8 * p) =
      make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}

// Q4_K row n0 + row's unit `unit` into Bs[row][32·sub ..] by one thread: two 16-byte loads and
// bf16 arithmetic (q4k_pairs: the unit's scale and min rounded to bf16, the few-row kernel's
// contract). For rows 16-byte aligned (whole 144-byte blocks from an aligned start).
template <int kBK>
__device__ inline void stage_q4k_unit(const DevWeight& w, int64_t n0, int row, int64_t unit, int sub, bf16* Bs) {
  const int64_t r = n0 + row;
  uint4* dst = reinterpret_cast<uint4*>(Bs + row * g_ld<kBK>() + 32 * sub);
  uint32_t a[16] = {};
  if (r < w.rows) q4k_pairs(w.data + r * w.row_bytes + (unit / 8) * 144, int(unit % 8), a);
#pragma unroll
  for (int q = 0; q < 4; ++q) dst[q] = make_uint4(a[4 * q], a[4 * q + 1], a[4 * q + 2], a[4 * q + 3]);
}
__device__ inline bool words_aligned(const DevWeight& w) {
  return ((reinterpret_cast<uintptr_t>(w.data) | uintptr_t(w.row_bytes)) & 15) == 0;
}

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

template <WFormat F, bool kGelu, int kBK>
__global__ void __launch_bounds__(kGThreads) moe_grouped_kernel(MoeMatArgs a, MoeGroups g) {
  pdl_enter_streaming();
  constexpr int L = g_ld<kBK>();
  constexpr int kUnits = kGN * (kBK / 32);  // weight units per matrix and step
  constexpr int kParts = 4 * kUnits;        // and their quarters
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
  const int64_t K = W.cols;
  const bf16* x = static_cast<const bf16*>(a.x);
  const bool q4k_words = F == WFormat::GgufQ4_K && words_aligned(W) && (!kGelu || words_aligned(U));
  float acc[2][4][4] = {}, acc2[2][4][4] = {};
  const int wm = (warp & 1) * 32, wn = (warp >> 1) * 32;  // this warp's 32 × 32 tile
  for (int64_t u = 0; u < K / kBK; ++u) {
    for (int v = tid; v < kGM * kBK / 8; v += kGThreads) {  // 8 bf16 (16 bytes) per load
      const int r = v / (kBK / 8), c8 = v % (kBK / 8);
      uint4 q = make_uint4(0, 0, 0, 0);
      if (item[r] >= 0) q = *reinterpret_cast<const uint4*>(x + int64_t(item[r] / a.x_div) * K + u * kBK + 8 * c8);
      *reinterpret_cast<uint4*>(As + r * L + 8 * c8) = q;
    }
    if (q4k_words) {
      for (int j = tid; j < kUnits; j += kGThreads) {  // j: row j % kGN's unit j / kGN of the step
        stage_q4k_unit<kBK>(W, n0, j % kGN, u * (kBK / 32) + j / kGN, j / kGN, Bs);
        if constexpr (kGelu) stage_q4k_unit<kBK>(U, n0, j % kGN, u * (kBK / 32) + j / kGN, j / kGN, B2s);
      }
    } else {
      for (int j = tid; j < kParts; j += kGThreads) {  // j: quarter j % 4 of row (j / 4) % kGN's unit
        const int q = j >> 2;
        stage_part<F, kBK>(W, n0, q % kGN, u * (kBK / 32) + q / kGN, q / kGN, j & 3, Bs);
        if constexpr (kGelu) stage_part<F, kBK>(U, n0, q % kGN, u * (kBK / 32) + q / kGN, q / kGN, j & 3, B2s);
      }
    }
    __syncthreads();
    warp_mma<kBK>(As + wm * L, Bs + wn * L, lane, acc);
    if constexpr (kGelu) warp_mma<kBK>(As + wm * L, B2s + wn * L, lane, acc2);
    __syncthreads();
  }
  // Accumulator h of tile (mi, nj): row g (h < 2) or g + 8, columns 2t and 2t + 1.
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
    if (gelu && wide) launch_kernel(moe_grouped_kernel<F, true, 64>, grid, kGThreads, 0, s, a, g);
    else if (gelu) launch_kernel(moe_grouped_kernel<F, true, 32>, grid, kGThreads, 0, s, a, g);
    else if (wide) launch_kernel(moe_grouped_kernel<F, false, 64>, grid, kGThreads, 0, s, a, g);
    else launch_kernel(moe_grouped_kernel<F, false, 32>, grid, kGThreads, 0, s, a, g);
  });
}

}  // namespace g4::cuda
