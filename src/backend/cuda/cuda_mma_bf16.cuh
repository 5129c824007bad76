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
// v[0..7] rounded to bf16 into dst[0..7] (16-byte aligned): one 16-byte store.
__device__ inline void store_bf16x8(const float* v, __nv_bfloat16* dst) {
  *reinterpret_cast<uint4*>(dst) =
      make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]), pack_bf16(v[6], v[7]));
}
// v[0..31] rounded to bf16 into dst[0..31] (16-byte aligned): four 16-byte stores.
__device__ inline void store_bf16x32(const float* v, __nv_bfloat16* dst) {
#pragma unroll
  for (int q = 0; q < 4; ++q) store_bf16x8(v + 8 * q, dst + 8 * q);
}
// Four 8 × 8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 (16-byte aligned); r[i] is matrix i's MMA fragment (row lane / 4, columns 2·(lane % 4)
// and the next).
__device__ inline void ldmatrix_x4(const __nv_bfloat16* p, uint32_t* r) {
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

}  // namespace g4::cuda
