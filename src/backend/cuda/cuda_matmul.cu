// The matmul kernels (cuda_kernels.h matmul / matmuls / gate_up_gelu) for every weight format:
// one warp per output row, up to kMaxM activation rows per chunk, optional input norm, fused gated
// activation and residual epilogue. M = 1 goes to the decode GEMVs (cuda_gemv_decode.cu) where one
// applies, 2 to 32 bf16 rows to the few-row tensor-core kernel (cuda_mma_small.cu), 33 and more to
// cuBLAS (cuda_blas.h, chosen by the backend), M >= kTcMinRows otherwise to the 3xTF32 tensor cores
// (cuda_tc_matmul.cu).
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_matmul_common.cuh"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_mma_small.h"

namespace g4::cuda {
namespace {

// Row r of w (its bytes at `row`: global memory or a shared-memory copy) dotted with up to kMaxM
// activation rows, this lane's share (acc[m], summed over the warp by the caller). kUnits
// (cols % 32 == 0): each lane takes whole 32-value units (a block or sub-block of every format),
// decodes the unit once (dequant32) and dots it with the activations read as float4. Otherwise
// lanes stride over single columns (dequant_at). kM: the most activation rows this instance handles
// (1 for decode keeps the accumulators, and so the registers, few).
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
  pdl_enter_streaming();
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
      launch_kernel(matmul_kernel<F, false, kAct, false, kMaxM>, grid, block, smem, s, a);
    } else if (a.M == 1) {
      if (staged) launch_kernel(matmul_kernel<F, true, kAct, true, 1>, grid, block, smem, s, a);
      else launch_kernel(matmul_kernel<F, true, kAct, false, 1>, grid, block, smem, s, a);
    } else {
      if (staged) launch_kernel(matmul_kernel<F, true, kAct, true, kMaxM>, grid, block, smem, s, a);
      else launch_kernel(matmul_kernel<F, true, kAct, false, kMaxM>, grid, block, smem, s, a);
    }
  }
}

template <WFormat F, int kAct>
void matmul_fmt(cudaStream_t s, const MatArgs& a, int M) {
  // Decode on int8 activations (bf16 mode): one row, or the rows of a row-exact launch (a.q8 set
  // by the backend for those only).
  if (a.q8.q && q8_gemv(s, a, M, kAct)) return;
  if (small_mma_applies(a, M)) {  // batched decode: bf16 tensor cores, the weights read once
    small_mma(s, a, M, kAct);
    return;
  }
  if (tc_matmul_applies(a, M)) {  // prefill: tensor cores
    tc_matmul(s, a, M, kAct);
    return;
  }
  if (M == 1 && decode_gemv(s, a, kAct)) return;  // decode: the GEMV kernels
  if (a.w[0].cols % 32 == 0) matmul_launch<F, true, kAct>(s, a, M);
  else matmul_launch<F, false, kAct>(s, a, M);
}

template <int kAct>
void matmul_any(cudaStream_t s, const MatArgs& a, int M) {
  with_format(a.w[0].fmt, [&](auto f) { matmul_fmt<decltype(f)::value, kAct>(s, a, M); });
}

}  // namespace

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
