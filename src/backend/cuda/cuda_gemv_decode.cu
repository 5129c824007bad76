// The decode (M = 1) GEMVs: K-quant rows on a persistent grid (cuda_kquant_dot.cuh) and the
// one-row GEMV for tall matrices of any format (the 262144-row LM head). Each reads the activation
// row in its storage type, fixed at compile time (the inner loops are instruction-bound).
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_kquant_dot.cuh"
#include "backend/cuda/cuda_matmul_common.cuh"
#include "backend/cuda/cuda_launch.cuh"

namespace g4::cuda {
namespace {

// K-quant decode (M = 1; cuda_kquant_dot.cuh): the MatArgs contract of matmul_kernel, with
// `split` warps per row and a persistent grid: each block walks virtual blocks of kMatWarps /
// split rows (vb = blockIdx.x, + gridDim.x, ...), so that a few resident blocks per SM keep loads
// in flight instead of thousands of short blocks paying their start and drain.
template <WFormat F, int kAct, class TX>
__device__ void kquant_decode_rows(const MatArgs& a, const TX* x) {
  __shared__ float partial[2][kMatWarps];
  const int split = a.split, warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp, part = warp % split;
  const bool y_f32 = a.yt == DType::F32;
  const unsigned total = a.first[a.n];
  for (unsigned vb = blockIdx.x; vb < total; vb += gridDim.x) {
    int i = 0;
    while (i + 1 < a.n && vb >= a.first[i + 1]) ++i;
    const DevWeight& w = a.w[i];
    const int64_t r = int64_t(vb - a.first[i]) * (kMatWarps / split) + warp / split;
    float s1 = 0.f, s2 = 0.f;
    if (r < w.rows) {
      if constexpr (kAct != kPlain) {  // gate and up rows in one pass over x
        const uint8_t* rr[2] = {w.data + r * w.row_bytes, a.w2.data + r * a.w2.row_bytes};
        float acc[2];
        kquant_rows_dot<F, 2, TX>(rr, x, w.cols, lane, part, split, acc);
        s1 = warp_sum(acc[0]);
        s2 = warp_sum(acc[1]);
      } else {
        s1 = warp_sum(kquant_row_dot<F, TX>(w.data + r * w.row_bytes, x, w.cols, lane, part, split));
      }
    }
    if (split > 1) {
      if (lane == 0) partial[0][warp] = s1, partial[1][warp] = s2;
      __syncthreads();
      s1 = s2 = 0.f;
      for (int k = 0; k < split; ++k) s1 += partial[0][warp - part + k], s2 += partial[1][warp - part + k];
      __syncthreads();  // partial is rewritten by the next virtual block
    }
    if (r < w.rows && part == 0 && lane == 0) {
      float v = s1;
      if constexpr (kAct == kGelu) v = gelu_tanh_mul(s1, s2);
      if constexpr (kAct == kGeluGgml) v = gelu_ggml_mul(s1, s2, a.table);
      store_out(a.y[i], r, v, y_f32);
    }
  }
}

template <WFormat F, int kAct>
__global__ void __launch_bounds__(kMatWarps * kWarp) kquant_decode_kernel(MatArgs a) {
  pdl_enter_streaming();
  extern __shared__ uint4 smem[];
  const bool bf = a.xt == DType::BF16;
  if (a.norm_w) {  // one row, normed once per block into shared memory
    float* xn = reinterpret_cast<float*>(smem);
    norm_row_to_shared(a.x, bf, a.w[0].cols, a.norm_w, a.eps, xn);
    kquant_decode_rows<F, kAct>(a, static_cast<const float*>(xn));
  } else if (bf) {
    kquant_decode_rows<F, kAct>(a, static_cast<const bf16*>(a.x));
  } else {
    kquant_decode_rows<F, kAct>(a, static_cast<const float*>(a.x));
  }
  if (a.resid) residual_epilogue(a, a.y[0], a.w[0].rows);
}

// y[r] = x · w[r] for one activation row and a tall matrix (the LM head): a warp per row, lane l
// on columns l, l + 32, ... (a 32-value unit's bytes in one coalesced load per step), four steps
// in flight; no staging, few registers, so many warps hide the memory latency.
constexpr int kLanesMinRows = 32768;
constexpr int kGemvWarps = 8;
template <WFormat F, class TX>
__global__ void __launch_bounds__(kGemvWarps * kWarp) gemv_lanes_kernel(const TX* x, DevWeight w, void* y, bool y_f32) {
  pdl_enter_streaming();
  const int64_t r = int64_t(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (r >= w.rows) return;
  const uint8_t* row = w.data + r * w.row_bytes;
  float acc = 0.f;
  if constexpr (F == WFormat::GgufQ8_0) {
    // Four columns per lane and step (a warp covers four 34-byte blocks): the block scale and two
    // 16-bit loads of quants (blocks are 2-byte aligned) against one float4 of x. Six steps per
    // iteration (768 columns: a whole 640-wide row) put all of a row's loads in flight at once.
    constexpr int kSteps = 6;
    for (int64_t c0 = 4 * lane; c0 < w.cols; c0 += kSteps * 4 * kWarp) {
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        const int64_t c = c0 + k * 4 * kWarp;
        if (c < w.cols) {
          const uint8_t* b = row + (c >> 5) * 34;
          const int j = int(c & 31);
          const float d = __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(b)));
          const unsigned q01 = *reinterpret_cast<const unsigned short*>(b + 2 + j);
          const unsigned q23 = *reinterpret_cast<const unsigned short*>(b + 4 + j);
          const float4 xv = ld4(x + c);
          acc += d * (xv.x * float(int8_t(q01 & 0xffu)) + xv.y * float(int8_t(q01 >> 8)) +
                      xv.z * float(int8_t(q23 & 0xffu)) + xv.w * float(int8_t(q23 >> 8)));
        }
      }
    }
  } else if constexpr (kKquantDot<F>) {
    acc = kquant_row_dot<F, TX>(row, x, w.cols, lane);
  } else {
    for (int64_t c0 = lane; c0 < w.cols; c0 += 4 * kWarp) {
      float xv[4], wv[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int64_t c = c0 + k * kWarp;
        xv[k] = c < w.cols ? to_f(x[c]) : 0.f;
        wv[k] = c < w.cols ? dequant_at(row, w, r, c) : 0.f;
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) acc += xv[k] * wv[k];
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) store_out(y, r, acc, y_f32);
}

// Warps per output row for K-quant rows at M = 1: about four super-blocks per warp (one unrolled
// round of loads), at most the block's 8 warps.
int kquant_split(int64_t cols) {
  const int64_t nsb = cols / 256;
  return nsb <= 4 ? 1 : nsb <= 8 ? 2 : nsb <= 16 ? 4 : 8;
}

// One launch of kquant_decode_kernel: virtual blocks of kMatWarps / split rows per weight, a grid
// of as many blocks as fit on the GPU at once (or fewer when there is less work).
template <WFormat F, int kAct>
void kquant_decode_launch(cudaStream_t s, MatArgs a) {
  a.split = kquant_split(a.w[0].cols);
  a.M = 1;
  const unsigned blocks = assign_row_blocks(a, kMatWarps / a.split);
  const size_t smem = a.norm_w ? size_t(a.w[0].cols) * 4 : 0;
  int per_sm = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kquant_decode_kernel<F, kAct>, kMatWarps * kWarp, smem);
  const unsigned resident = unsigned((per_sm > 0 ? per_sm : 1) * sm_count());
  launch_kernel(kquant_decode_kernel<F, kAct>, blocks < resident ? blocks : resident, kMatWarps * kWarp, smem, s, a);
}

}  // namespace

bool decode_gemv(cudaStream_t s, const MatArgs& a, int act) {
  const DevWeight& w = a.w[0];
  if (act == kPlain && a.n == 1 && !a.norm_w && !a.resid && w.rows >= kLanesMinRows) {
    const unsigned blocks = blocks_for(w.rows, kGemvWarps);
    const bool y_f32 = a.yt == DType::F32;
    with_format(w.fmt, [&](auto f) {
      constexpr WFormat F = decltype(f)::value;
      with_act(a.xt, [&](auto tag) {
        using TX = decltype(tag);
        launch_kernel(gemv_lanes_kernel<F, TX>, blocks, kGemvWarps * kWarp, 0, s, static_cast<const TX*>(a.x), w, a.y[0], y_f32);
      });
    });
    return true;
  }
  auto kquant = [&](auto f) {
    constexpr WFormat F = decltype(f)::value;
    if (act == kGelu) kquant_decode_launch<F, kGelu>(s, a);
    else if (act == kGeluGgml) kquant_decode_launch<F, kGeluGgml>(s, a);
    else kquant_decode_launch<F, kPlain>(s, a);
    return true;
  };
  if (w.fmt == WFormat::GgufQ4_K) return kquant(std::integral_constant<WFormat, WFormat::GgufQ4_K>{});
  if (w.fmt == WFormat::GgufQ6_K) return kquant(std::integral_constant<WFormat, WFormat::GgufQ6_K>{});
  return false;
}

}  // namespace g4::cuda
