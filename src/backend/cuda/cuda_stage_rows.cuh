// A GEMV block's weight rows copied into shared memory by the tensor memory accelerator
// (cp.async.bulk, sm_90), so that a block has all its rows' bytes in flight at once without holding
// them in registers, and they land where the L2 cannot evict them.
//
// Use (every thread of the block):
//   __shared__ uint64_t bar;  extern __shared__ uint8_t stage[];   (16-byte aligned)
//   RowSpan s[2] = {row_span(p0, n0), row_span(p1, n1)};  stage_rows(s, 2, stage, &bar);
//   ... pdl wait (the copies need not wait: weights are never written during a step) ...
//   stage_wait(&bar);   then byte p_k + j of span k is at stage + s[k].offset + j.
// Each span is copied from its start rounded down to 16 bytes to its end rounded up (the 16 bytes
// of slack after every uploaded weight cover the end), so a byte keeps its address modulo 16 and
// the units' aligned loads (cuda_q8_units.cuh) read the copy as they read the weight.
#pragma once
#include <cstddef>
#include <cstdint>

namespace g4::cuda {

struct RowSpan {
  uintptr_t begin = 0;  // 16-byte aligned
  uint32_t bytes = 0;   // a multiple of 16
  uint32_t offset = 0;  // of the first byte asked for, from the start of its copy (then: of the stage)
};

__host__ __device__ inline RowSpan row_span(const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + n + 15) & ~uintptr_t(15);
  RowSpan s;
  s.begin = a;
  s.bytes = n ? uint32_t(e - a) : 0;
  s.offset = uint32_t(reinterpret_cast<uintptr_t>(p) - a);
  return s;
}
// Shared-memory bytes a stage of spans of at most n0 and n1 bytes needs (with the rounding above).
__host__ __device__ constexpr size_t stage_bytes(size_t n0, size_t n1) {
  return (n0 ? n0 + 32 : 0) + (n1 ? n1 + 32 : 0);
}

// Thread 0 starts the copies of s[0 .. n) back to back into stage, completing on bar, and every
// thread sets each span's offset to where its first asked-for byte lands; all return after a
// block barrier, with the copies in flight. Completion: stage_wait.
__device__ inline void stage_rows(RowSpan* s, int n, uint8_t* stage, uint64_t* bar) {
  uint32_t at = 0;
  for (int k = 0; k < n; ++k) {
    s[k].offset += at;
    at += s[k].bytes;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) {
    const uint32_t b = uint32_t(__cvta_generic_to_shared(bar));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(at) : "memory");
    uint32_t dst = uint32_t(__cvta_generic_to_shared(stage));
    for (int k = 0; k < n; ++k) {
      if (s[k].bytes)
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
            "l"(s[k].begin), "r"(s[k].bytes), "r"(b)
            : "memory");
      dst += s[k].bytes;
    }
  }
#endif
  __syncthreads();
}

// Waits until the copies stage_rows started on bar have landed in shared memory.
__device__ inline void stage_wait(uint64_t* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t b = uint32_t(__cvta_generic_to_shared(bar));
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(b)
        : "memory");
#endif
}

}  // namespace g4::cuda
