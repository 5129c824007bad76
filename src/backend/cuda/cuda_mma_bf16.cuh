// bf16 tensor-core helpers shared by the mma.sync kernels (flash attention, grouped experts) and the
// bf16 staging of dequantized weights (cuBLAS prefill, grouped experts).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace g4::cuda {

// Two adjacent bf16 values as one 32-bit MMA operand register.
__device__ inline uint32_t ld_pair(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }
// (lo, hi) rounded to bf16 and packed as one operand register (lo in the low half).
__device__ inline uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&b);
}
// c[16×8, f32] += a[16×16, bf16, row] · b[16×8, bf16, col] (m16n8k16 fragments).
__device__ inline void mma_bf16(float* c, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// v[0..31] rounded to bf16 into dst[0..31] (16-byte aligned): four 16-byte stores.
__device__ inline void store_bf16x32(const float* v, __nv_bfloat16* dst) {
  uint4* d = reinterpret_cast<uint4*>(dst);
#pragma unroll
  for (int q = 0; q < 4; ++q)
    d[q] = make_uint4(pack_bf16(v[8 * q], v[8 * q + 1]), pack_bf16(v[8 * q + 2], v[8 * q + 3]),
                      pack_bf16(v[8 * q + 4], v[8 * q + 5]), pack_bf16(v[8 * q + 6], v[8 * q + 7]));
}

}  // namespace g4::cuda
