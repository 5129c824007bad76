// Writing one value of an activation row in the int8 form of cuda_q8.cuh, a warp per 32-value
// block: shared by the prepare kernels and the launches that write their output's int8 form for
// the matmul after them (the decode GEMV, attention: MatArgs::q8_out).
#pragma once
#include "backend/cuda/cuda_kernel_util.cuh"
#include "backend/cuda/cuda_q8.cuh"

namespace g4::cuda {

// Value v of column c (c % 32 == lane: the calling warp holds block c / 32, all 32 lanes present)
// into the int8 form o: its f32 copy, its code, and (lane 0) the block's scale and sum. IEEE
// operations throughout (no contraction), so the host reference of the tests rounds identically.
__device__ __forceinline__ void q8_store_block(float v, int c, int lane, const Q8Act& o) {
  o.xf[c] = v;
  const float amax = warp_reduce(fabsf(v), Max{});
  const float d = __fdiv_rn(amax, 127.f);
  const float id = d != 0.f ? __frcp_rn(d) : 0.f;
  int q = __float2int_rn(__fmul_rn(v, id));
  q = q > 127 ? 127 : q < -127 ? -127 : q;
  o.q[c] = int8_t(q);
  const int qs = __reduce_add_sync(0xffffffffu, q);
  if (lane == 0) {
    o.d[c / 32] = d;
    o.s[c / 32] = __fmul_rn(d, float(qs));
  }
}

}  // namespace g4::cuda
