// cp.async (sm_80+): 16-byte copies from global to shared memory that run in the background while
// the thread goes on. A thread's copies are grouped by cp_async_commit and waited for by group;
// other threads see them after the wait and a barrier.
#pragma once

namespace g4::cuda {

__device__ inline void cp_async16(void* dst, const void* src) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
// The same, writing 16 zero bytes instead when !valid (nothing is read; src must still be an address
// of global memory).
__device__ inline void cp_async16_or_zero(void* dst, const void* src, bool valid) {
  const unsigned d = unsigned(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most kPending of this thread's groups are still in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace g4::cuda
