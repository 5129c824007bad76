// The int8 activation form the decode GEMVs of cuda_gemv_q8.cu dot weights with (llama.cpp's q8_1
// idea, on the device): a row x[cols] (cols % 32 == 0) is cut into blocks of 32 values; block b
// stores q[32b .. 32b+31] = rint(x / d_b) as int8 with d_b = max|x| / 127 (0 for an all-zero
// block), its scale d[b] and the sum of its dequantized values s[b] = d_b · Σ q (the min / bias
// terms of K-quant and MLX affine weights multiply it). xf keeps the (normed) row in f32 for the
// weight formats that are dotted in floating point (bf16, f16, f32 weights).
//
// The dot of a weight block with an activation block is then an integer sum of byte products
// (dp4a: four per instruction), scaled once: w·x ≈ Σ_b d_b · (w_scale · Σ q_w q_x) (+ min terms).
// Accuracy: x is rounded to 8 bits per block (2^-8 of the block's largest value), the price
// llama.cpp's CUDA backend pays too; everything after the integer sums is f32.
#pragma once
#include <cstdint>

namespace g4::cuda {

// Device scratch of prepared activation rows (q: cols bytes, d and s: cols / 32 floats each, xf:
// cols floats, per row; rows one after another), written by the prepare launch and read by the
// GEMV that follows it.
struct Q8Act {
  int8_t* q;
  float* d;
  float* s;
  float* xf;
};
// The widest row the int8 GEMVs take, and the values (rows x cols) a Q8Act scratch holds: 64
// rows of Gemma 4's widest matmul input (21504), or the routed experts of 64 rows (64 x 8 items
// of 704 or 2816), about 11 MB.
constexpr int64_t kQ8MaxCols = 65536;
constexpr int64_t kQ8MaxValues = int64_t(1) << 21;
inline size_t q8_scratch_bytes() { return size_t(kQ8MaxValues) * (1 + 4) + size_t(kQ8MaxValues / 32) * 8 + 256; }
// Carves the four arrays out of one scratch allocation of q8_scratch_bytes() (16-byte aligned).
inline Q8Act q8_act_in(void* base) {
  uint8_t* p = static_cast<uint8_t*>(base);
  Q8Act a{};
  a.xf = reinterpret_cast<float*>(p);
  p += kQ8MaxValues * 4;
  a.d = reinterpret_cast<float*>(p);
  p += kQ8MaxValues / 32 * 4;
  a.s = reinterpret_cast<float*>(p);
  p += kQ8MaxValues / 32 * 4;
  a.q = reinterpret_cast<int8_t*>(p);
  return a;
}

#ifdef __CUDACC__
// Row `row` of prepared rows of `cols` values.
__device__ __forceinline__ Q8Act q8_row(const Q8Act& a, int64_t row, int64_t cols) {
  return Q8Act{a.q + row * cols, a.d + row * (cols / 32), a.s + row * (cols / 32), a.xf + row * cols};
}
// Σ of the four byte products of a (unsigned bytes: weight codes) and b (signed bytes: x), plus c.
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}
// Σ of the four byte products of a and b, both signed, plus c.
__device__ __forceinline__ int dp4a_ss(uint32_t a, uint32_t b, int c) {
  return __dp4a(int(a), int(b), c);
}
#endif

}  // namespace g4::cuda
