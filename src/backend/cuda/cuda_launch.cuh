// Kernel launches with programmatic dependent launch (PDL, Hopper): a kernel launched through
// launch_kernel may be scheduled while the kernel before it on the stream is still running, so
// the ~1 µs gap between the ~550 small kernels of a decode step (graph replay included) overlaps
// the previous kernel's tail instead of idling the GPU.
//
// Contract: every __global__ function launched through launch_kernel calls pdl_enter() or
// pdl_enter_streaming() before it touches memory that earlier kernels write or read. Before it a
// kernel may read only what no kernel of a step writes: weights (the short kernels load their norm
// weights and scales there; GEMVs prefetch their rows into L2), and the step's sequence tables
// (SeqTable: written by the step's first copy node or a synchronous upload; attention and attn_prep
// read their entry there). Not the image blocks a table points to: a copy kernel may stage them.
// An L2 prefetch (a hint) may also name memory that a kernel of the step still writes (the decode
// attention prefetches its K/V cache rows): writes go through L2, so no later load reads stale data.
//   - pdl_wait (griddepcontrol.wait) returns once the preceding grid has completed and its writes
//     are visible. Since that grid itself waited for its predecessor, every launch still sees all
//     work queued before it, as in plain stream order.
//   - pdl_release (griddepcontrol.launch_dependents) lets the next kernel be scheduled once every
//     block of this one has released (or exited).
//   - pdl_enter (release, then wait): the short kernels (norms, quantizing a row, attention,
//     elementwise). The next kernel may become resident while they wait and run.
//   - pdl_enter_streaming (wait, then release): kernels that stream weights (GEMV and GEMM). At
//     most one such kernel is launched ahead of the running one, so their L2 prefetches
//     (prefetch_l2, issued before the wait: weights are never written by a step) do not evict
//     each other. With the chain `GEMV, norm, quantize, GEMV`, the second GEMV's blocks become
//     resident and prefetch their weight rows while the first GEMV drains and the short kernels
//     run, keeping DRAM busy through the latency-bound gaps of a decode step.
// Without the launch attribute (PDL off, or a plain <<<>>> launch) these instructions do nothing.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace g4::cuda {

#ifdef __CUDACC__
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_enter() {
  pdl_release();
  pdl_wait();
}
__device__ __forceinline__ void pdl_enter_streaming() {
  pdl_wait();
  pdl_release();
}
// Asks L2 to fetch [p, p + bytes) (a hint; no completion is awaited). The range is widened to
// whole 16-byte words: the 16 bytes of slack after every uploaded weight cover the end.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) & ~uintptr_t(15);
  const uintptr_t e = (reinterpret_cast<uintptr_t>(p) + bytes + 15) & ~uintptr_t(15);
  if (e > a)
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(uint32_t(e - a)) : "memory");
#endif
}
#endif

// Whether launch_kernel asks for PDL, for the calling thread (the backend sets it before each of
// its launches: BackendOptions::pdl, decode-sized steps).
void set_pdl_launches(bool on);
bool pdl_launches();

// kernel<<<grid, block, smem, s>>>(args...), with the PDL attribute when pdl_launches().
// Launch errors are left for the caller's G4_CUDA_LAUNCHED() (cudaGetLastError).
template <class... P, class... A>
inline void launch_kernel(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_launches() ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  (void)cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}

}  // namespace g4::cuda
