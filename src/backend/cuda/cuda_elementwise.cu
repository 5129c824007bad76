// Embedding lookups and the elementwise kernels (gelu_mul, add, scale, softcap, row gathers and
// column copies): one thread per element or 32-value unit, T from the buffers' dtype.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_act.cuh"
#include "backend/cuda/cuda_dequant.cuh"
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_launch.cuh"
#include "backend/cuda/cuda_q8_store.cuh"

namespace g4::cuda {
namespace {

// Grid (tokens, column chunks). kUnits (cols % 32 == 0): a thread per 32-value unit (one block
// header read, dequant32); else a thread per column. Many blocks per row: the per-layer-input
// table's rows are 8960 wide, and one block walking a row serially took 225 us.
constexpr int kEmbedThreads = 128;
template <WFormat F, bool kUnits, class T>
__global__ void __launch_bounds__(kEmbedThreads) embed_kernel(DevWeight e, const int32_t* ids, float scale, T* out) {
  pdl_enter();
  const int i = blockIdx.x;
  const int64_t id = ids[i];
  const uint8_t* row = e.data + id * e.row_bytes;
  T* o = out + int64_t(i) * e.cols;
  const int64_t k = int64_t(blockIdx.y) * kEmbedThreads + threadIdx.x;
  if constexpr (kUnits) {
    if (k >= e.cols / 32) return;
    float v[32];
    dequant32<F>(row, e, id, k, v);
#pragma unroll
    for (int j = 0; j < 32; j += 4)
      st4(o + 32 * k + j, make_float4(v[j] * scale, v[j + 1] * scale, v[j + 2] * scale, v[j + 3] * scale));
  } else {
    if (k < e.cols) o[k] = from_f<T>(dequant_at(row, e, id, k) * scale);
  }
}

template <class T>
__global__ void gelu_mul_kernel(const T* gate, const T* up, int64_t n, T* out) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_f<T>(gelu_tanh_mul(to_f(gate[i]), to_f(up[i])));
}

template <class T>
__global__ void gelu_mul_ggml_kernel(const T* gate, const T* up, int64_t n, const uint16_t* table, T* out) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  out[i] = from_f<T>(gelu_ggml_mul(to_f(gate[i]), to_f(up[i]), table));
}

// gelu_mul (table null: the tanh form) or gelu_mul_ggml (the table's form) over rows of `cols`
// values (cols % 32 == 0), a warp per 32-value block, each value stored in T and then, as stored,
// written into the int8 form o (cuda_q8_store.cuh): the bits of the elementwise launch followed by
// q8_prepare without a norm, in one launch.
constexpr int kGeluQ8Warps = 8;
template <class T>
__global__ void __launch_bounds__(kGeluQ8Warps * kWarp) gelu_mul_q8_kernel(const T* gate, const T* up, int64_t n,
                                                                          const uint16_t* table, T* out, int cols,
                                                                          Q8Act o) {
  pdl_enter();
  const int lane = threadIdx.x % kWarp;
  const int64_t c = (int64_t(blockIdx.x) * kGeluQ8Warps + threadIdx.x / kWarp) * 32 + lane;
  if (c - lane >= n) return;  // the warp's block lies past the end (n % 32 == 0: all lanes agree)
  const float g = to_f(gate[c]), u = to_f(up[c]);
  const T y = from_f<T>(table ? gelu_ggml_mul(g, u, table) : gelu_tanh_mul(g, u));
  out[c] = y;
  q8_store_block(to_f(y), int(c % cols), lane, q8_row(o, c / cols, cols));
}

// 16 bytes a thread where both ends are 16-byte aligned, else a byte; a grid-stride loop.
__global__ void copy_bytes_kernel(const uint8_t* src, size_t n, uint8_t* dst) {
  pdl_enter();
  const size_t stride = size_t(gridDim.x) * blockDim.x, i0 = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  size_t done = 0;
  if (((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst)) & 15) == 0) {
    done = n / 16 * 16;
    for (size_t i = i0; i < n / 16; i += stride)
      reinterpret_cast<uint4*>(dst)[i] = reinterpret_cast<const uint4*>(src)[i];
  }
  for (size_t i = done + i0; i < n; i += stride) dst[i] = src[i];
}

template <class T>
__global__ void add_kernel(const T* a, const T* b, int64_t n, T* y) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = from_f<T>(to_f(a[i]) + to_f(b[i]));
}
template <class T>
__global__ void scale_kernel(const T* a, float s, int64_t n, T* y) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) y[i] = from_f<T>(to_f(a[i]) * s);
}
template <class T>
__global__ void softcap_kernel(T* x, int64_t n, float cap) {
  pdl_enter();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = from_f<T>(tanhf(to_f(x[i]) / cap) * cap);
}
template <class T>
__global__ void gather_rows_kernel(const T* src, const int32_t* idx, int dim, T* dst) {
  pdl_enter();
  const int i = blockIdx.x;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) dst[int64_t(i) * dim + c] = src[int64_t(idx[i]) * dim + c];
}
template <class T>
__global__ void copy_cols_kernel(const T* src, int src_dim, int off, int n, T* dst) {
  pdl_enter();
  const int r = blockIdx.x;
  for (int c = threadIdx.x; c < n; c += blockDim.x) dst[int64_t(r) * n + c] = src[int64_t(r) * src_dim + off + c];
}

}  // namespace

void embed(cudaStream_t s, const DevWeight& e, const int32_t* ids, int n, float scale, void* out, DType t) {
  if (n <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out);
    with_format(e.fmt, [&](auto f) {
      constexpr WFormat F = decltype(f)::value;
      if (e.cols % 32 == 0)
        launch_kernel(embed_kernel<F, true, T>, dim3(n, blocks_for(e.cols / 32, kEmbedThreads)), kEmbedThreads, 0, s, e, ids, scale, o);
      else
        launch_kernel(embed_kernel<F, false, T>, dim3(n, blocks_for(e.cols, kEmbedThreads)), kEmbedThreads, 0, s, e, ids, scale, o);
    });
  });
}

// Elementwise launches: one thread per element, T from the buffers' dtype.
#define G4_ELEMENTWISE(kernel, ...)                                                     \
  with_act(t, [&](auto tag) {                                                           \
    using T = decltype(tag);                                                            \
    launch_kernel(kernel<T>, blocks_for(int64_t(n), 256), 256, 0, s, __VA_ARGS__);                 \
  })
void gelu_mul(cudaStream_t s, const void* gate, const void* up, size_t n, void* out, DType t) {
  if (n)
    G4_ELEMENTWISE(gelu_mul_kernel, static_cast<const T*>(gate), static_cast<const T*>(up), int64_t(n),
                   static_cast<T*>(out));
}
void gelu_mul_ggml(cudaStream_t s, const void* gate, const void* up, size_t n, const uint16_t* table, void* out,
                   DType t) {
  if (n)
    G4_ELEMENTWISE(gelu_mul_ggml_kernel, static_cast<const T*>(gate), static_cast<const T*>(up), int64_t(n), table,
                   static_cast<T*>(out));
}
void copy_bytes(cudaStream_t s, const void* src, size_t n, void* dst) {
  if (!n) return;
  const unsigned blocks = std::min(blocks_for(int64_t(n / 16 + 1), 256), 1024u);
  launch_kernel(copy_bytes_kernel, blocks, 256, 0, s, static_cast<const uint8_t*>(src), n, static_cast<uint8_t*>(dst));
}
void gelu_mul_q8(cudaStream_t s, const void* gate, const void* up, size_t n, const uint16_t* table, void* out, DType t,
                 int cols, Q8Act o) {
  if (!n) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(gelu_mul_q8_kernel<T>, blocks_for(int64_t(n) / 32, kGeluQ8Warps), kGeluQ8Warps * kWarp, 0, s,
                  static_cast<const T*>(gate), static_cast<const T*>(up), int64_t(n), table, static_cast<T*>(out), cols, o);
  });
}
void add(cudaStream_t s, const void* a, const void* b, size_t n, void* y, DType t) {
  if (n) G4_ELEMENTWISE(add_kernel, static_cast<const T*>(a), static_cast<const T*>(b), int64_t(n), static_cast<T*>(y));
}
void scale(cudaStream_t s, const void* a, float f, size_t n, void* y, DType t) {
  if (n) G4_ELEMENTWISE(scale_kernel, static_cast<const T*>(a), f, int64_t(n), static_cast<T*>(y));
}
void softcap(cudaStream_t s, void* x, size_t n, float cap, DType t) {
  if (n) G4_ELEMENTWISE(softcap_kernel, static_cast<T*>(x), int64_t(n), cap);
}
#undef G4_ELEMENTWISE

void gather_rows(cudaStream_t s, const void* src, const int32_t* idx, int n, int dim, void* dst, DType t) {
  if (n <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(gather_rows_kernel<T>, n, 256, 0, s, static_cast<const T*>(src), idx, dim, static_cast<T*>(dst));
  });
}
void copy_cols(cudaStream_t s, const void* src, int rows, int src_dim, int off, int n, void* dst, DType t) {
  if (rows <= 0) return;
  with_act(t, [&](auto tag) {
    using T = decltype(tag);
    launch_kernel(copy_cols_kernel<T>, rows, 256, 0, s, static_cast<const T*>(src), src_dim, off, n, static_cast<T*>(dst));
  });
}

}  // namespace g4::cuda
