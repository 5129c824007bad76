// Tensor-core matmul for many activation rows (prefill): y = xn · wᵀ (x f32 or bf16, read into f32
// tiles) with f32 accuracy from TF32
// tensor cores ("3xTF32": each f32 operand split into a TF32 high part and a TF32 remainder,
// hi·hi + lo·hi + hi·lo accumulated in f32; what is dropped, lo·lo, is ~2^-22 of each product).
//
// Tiles: a block computes kBM activation rows × BN weight rows (BN 64, or 32 when 64 would leave
// SMs idle: short prompts); 4 warps, each 16 rows × BN/2 columns as BN/16 m16n8k8 MMAs. Per 32-column step of the reduction the block stages the
// activation tile (normalized on the way when the launch has an input norm) and the weight tile
// (each weight row's 32-value unit decoded once by dequant32) in shared memory.
#include <cuda_runtime.h>

#include <cstdint>
#include <atomic>
#include <cstdlib>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

constexpr int kBM = 32, kBNMax = 64, kThreads = 128, kPad = 4;
// Shared-memory row stride (floats) for a kBK-column tile: kBK + 4 keeps the fragment loads free
// of bank conflicts.
template <int kBK>
__host__ __device__ constexpr int ld_of() { return kBK + kPad; }

__device__ inline uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}
// x = hi + lo, both TF32.
__device__ inline void split(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}
__device__ inline void mma_tf32(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The kNT 16×8 accumulators of a warp's 16 × 8·kNT tile += As[16 rows] · Bs[8·kNT rows]ᵀ over kBK.
template <int kNT, int kBK>
__device__ inline void warp_tile(const float* As, const float* Bs, int lane, float (*acc)[4]) {
  constexpr int kLd = ld_of<kBK>();
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int k0 = 0; k0 < kBK; k0 += 8) {
    uint32_t ah[4], al[4];
    split(As[g * kLd + k0 + t], ah[0], al[0]);
    split(As[(g + 8) * kLd + k0 + t], ah[1], al[1]);
    split(As[g * kLd + k0 + t + 4], ah[2], al[2]);
    split(As[(g + 8) * kLd + k0 + t + 4], ah[3], al[3]);
#pragma unroll
    for (int j = 0; j < kNT; ++j) {
      uint32_t bh[2], bl[2];
      split(Bs[(8 * j + g) * kLd + k0 + t], bh[0], bl[0]);
      split(Bs[(8 * j + g) * kLd + k0 + t + 4], bh[1], bl[1]);
      mma_tf32(acc[j], al, bh);
      mma_tf32(acc[j], ah, bl);
      mma_tf32(acc[j], ah, bh);
    }
  }
}

// acc += one step's products. They start from zero in the MMA accumulators and are then added to
// the running sums with IEEE f32 adds: the tensor cores' own accumulation does not round to
// nearest, and over thousands of columns that drift reached 1e-4 of the result.
template <int kNT, int kBK>
__device__ inline void step_tile(const float* As, const float* Bs, int lane, float (*acc)[4]) {
  float part[kNT][4] = {};
  warp_tile<kNT, kBK>(As, Bs, lane, part);
#pragma unroll
  for (int j = 0; j < kNT; ++j)
#pragma unroll
    for (int h = 0; h < 4; ++h) acc[j][h] += part[j][h];
}

// Decodes 32-value unit `unit` of weight row n0 + row into Bs[row][32·sub ...] (rows past the
// matrix: zeros).
template <WFormat F, int kBK>
__device__ inline void stage_unit(const DevWeight& w, int64_t n0, int row, int64_t unit, int sub, float* Bs) {
  const int64_t r = n0 + row;
  float v[32];
  if (r < w.rows) {
    dequant32<F>(w.data + r * w.row_bytes, w, r, unit, v);
  } else {
#pragma unroll
    for (int j = 0; j < 32; ++j) v[j] = 0.f;
  }
  float4* dst = reinterpret_cast<float4*>(Bs + row * ld_of<kBK>() + 32 * sub);
#pragma unroll
  for (int j = 0; j < 8; ++j) dst[j] = make_float4(v[4 * j], v[4 * j + 1], v[4 * j + 2], v[4 * j + 3]);
}

// grid.x: the weights' row tiles (a.first as in matmul_kernel), grid.y: activation row tiles.
// kAct: 0 plain, 1 gelu(x·wᵀ)·(x·w2ᵀ) in MLX's form, 2 the same through ggml's table.
// Per kBK-column step, the tile's kBN · kBK/32 weight units (and as many of w2) are spread over the
// threads, one dequant32 each, so slow formats decode in parallel.
template <WFormat F, int kAct, int kBN, int kBK>
__global__ void __launch_bounds__(kThreads) tc_matmul_kernel(MatArgs a) {
  pdl_enter_streaming();
  constexpr int kNT = kBN / 16;  // 8-wide MMA tiles per warp
  constexpr int kLd = ld_of<kBK>();
  constexpr int kUnits = kBN * (kBK / 32);  // weight units per step (<= kThreads)
  static_assert(kUnits <= kThreads, "one unit per thread and weight");
  __shared__ __align__(16) float As[kBM * kLd];
  __shared__ __align__(16) float Bs[kBN * kLd];
  __shared__ __align__(16) float B2s[kAct ? kBN * kLd : 4];
  __shared__ float inv[kBM];
  int i = 0;
  while (i + 1 < a.n && blockIdx.x >= a.first[i + 1]) ++i;
  const DevWeight& w = a.w[i];
  const int64_t n0 = int64_t(blockIdx.x - a.first[i]) * kBN;
  const int m0 = blockIdx.y * kBM;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int64_t K = w.cols;
  const bool bf = a.xt == DType::BF16;  // x's type, at run time (cuda_act.cuh ld4x)

  if (a.norm_w) {  // inv_rms of this tile's rows: a warp per row
    for (int r = warp; r < kBM; r += kThreads / 32) {
      float ss = 0.f;
      if (m0 + r < a.M) {
        const int64_t xr = int64_t(m0 + r) * K;
        for (int64_t c = lane; c < K; c += 32) {
          const float v = ldx(a.x, xr + c, bf);
          ss += v * v;
        }
      }
      for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
      if (lane == 0) inv[r] = 1.0f / sqrtf(ss / float(K) + a.eps);
    }
    __syncthreads();
  }

  float acc[kNT][4] = {}, acc2[kNT][4] = {};
  const int wm = (warp & 1) * 16, wn = (warp >> 1) * (kBN / 2);  // this warp's 16 × kBN/2 tile
  for (int64_t u = 0; u < K / kBK; ++u) {
    // Activation tile: kBM × 32 floats, two float4 per thread.
    for (int e = tid; e < kBM * kBK / 4; e += kThreads) {
      const int r = e / (kBK / 4), c4 = e % (kBK / 4);
      float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
      if (m0 + r < a.M) {
        const int64_t c = u * kBK + 4 * c4;
        v = ld4x(a.x, int64_t(m0 + r) * K + c, bf);
        if (a.norm_w) {
          const float s = inv[r];
          v.x *= s * a.norm_w[c];
          v.y *= s * a.norm_w[c + 1];
          v.z *= s * a.norm_w[c + 2];
          v.w *= s * a.norm_w[c + 3];
        }
      }
      *reinterpret_cast<float4*>(As + r * kLd + 4 * c4) = v;
    }
    // Unit (row, sub) of this step: thread t < kUnits takes row t % kBN, column chunk t / kBN.
    if (tid < kUnits) stage_unit<F, kBK>(w, n0, tid % kBN, u * (kBK / 32) + tid / kBN, tid / kBN, Bs);
    if constexpr (kAct != 0) {
      const int t2 = 2 * kUnits <= kThreads ? tid - kUnits : tid;  // idle threads take w2, else all again
      if (t2 >= 0 && t2 < kUnits) stage_unit<F, kBK>(a.w2, n0, t2 % kBN, u * (kBK / 32) + t2 / kBN, t2 / kBN, B2s);
    }
    __syncthreads();
    step_tile<kNT, kBK>(As + wm * kLd, Bs + wn * kLd, lane, acc);
    if constexpr (kAct != 0) step_tile<kNT, kBK>(As + wm * kLd, B2s + wn * kLd, lane, acc2);
    __syncthreads();
  }

  // c0, c1: row g, columns 2t, 2t+1; c2, c3: row g+8.
  void* y = a.y[i];
  const bool y_f32 = a.yt == DType::F32;
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int j = 0; j < kNT; ++j) {
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const int m = m0 + wm + g + (h >= 2 ? 8 : 0);
      const int64_t n = n0 + wn + 8 * j + 2 * t + (h & 1);
      if (m >= a.M || n >= w.rows) continue;
      float v = acc[j][h];
      if constexpr (kAct == 1) v = gelu_tanh_mul(v, acc2[j][h]);
      if constexpr (kAct == 2) v = gelu_ggml_mul(v, acc2[j][h], a.table);
      store_out(y, int64_t(m) * w.rows + n, v, y_f32);
    }
  }
}

template <WFormat F, int kAct, int kBN, int kBK>
void launch_tiles(cudaStream_t s, MatArgs a, int M) {
  const unsigned blocks = assign_row_blocks(a, kBN);
  a.M = M;
  const dim3 grid(blocks, unsigned((M + kBM - 1) / kBM));
  launch_kernel(tc_matmul_kernel<F, kAct, kBN, kBK>, grid, kThreads, 0, s, a);
}

template <WFormat F, int kAct>
void launch(cudaStream_t s, const MatArgs& a, int M) {
  // 64-row weight tiles unless that leaves fewer than two blocks per SM (short prompts).
  int64_t tiles = 0;
  for (int i = 0; i < a.n; ++i) tiles += (a.w[i].rows + kBNMax - 1) / kBNMax;
  const bool narrow = tiles * ((M + kBM - 1) / kBM) < 2 * int64_t(sm_count());
  if (a.w[0].cols % 64 == 0) {  // 64-column steps: twice the units per step to decode in parallel
    if (narrow) launch_tiles<F, kAct, 32, 64>(s, a, M);
    else launch_tiles<F, kAct, kBNMax, 64>(s, a, M);
  } else {
    if (narrow) launch_tiles<F, kAct, 32, 32>(s, a, M);
    else launch_tiles<F, kAct, kBNMax, 32>(s, a, M);
  }
}

template <int kAct>
void launch_any(cudaStream_t s, const MatArgs& a, int M) {
  with_format(a.w[0].fmt, [&](auto f) { launch<decltype(f)::value, kAct>(s, a, M); });
}

}  // namespace

bool tc_matmul_applies(const MatArgs& a, int M) {
  if (M < kTcMinRows || a.resid || tc_matmul_disabled() || reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return false;
  for (int i = 0; i < a.n; ++i)
    if (a.w[i].cols % 32 != 0) return false;
  return true;
}

void tc_matmul(cudaStream_t s, const MatArgs& a, int M, int act) {
  if (act == 1) launch_any<1>(s, a, M);
  else if (act == 2) launch_any<2>(s, a, M);
  else launch_any<0>(s, a, M);
}

namespace {
std::atomic<bool> g_tensor_cores{true};
}  // namespace
void set_tensor_cores(bool on) { g_tensor_cores = on; }
bool tc_matmul_disabled() { return !g_tensor_cores; }

}  // namespace g4::cuda
