// The launchers of a tensor-parallel group's device collectives (Backend::all_reduce / all_gather
// on the CUDA backend): each enqueues the communicator's collective on the stream, so that the
// step recorder logs them among the kernels (cuda_step.h) and a captured step holds them as graph
// nodes. The communicator is a device one (Communicator::on_device, nccl_communicator.h).
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "core/dtype.h"

namespace g4 {
class Communicator;
}

namespace g4::cuda {

// data (n elements of t, device memory) = the sum over the group's ranks.
void collective_all_reduce(cudaStream_t s, Communicator* c, void* data, size_t n, DType t);
// recv = every rank's n elements of send (device memory), rank after rank.
void collective_all_gather(cudaStream_t s, Communicator* c, const void* send, size_t n, DType t, void* recv);
// dst[r, off:off+n] = src[r, :] for r < rows (element size es bytes; dst rows of dst_dim).
void place_cols(cudaStream_t s, const void* src, int rows, int n, void* dst, int dst_dim, int off, size_t es);

}  // namespace g4::cuda
