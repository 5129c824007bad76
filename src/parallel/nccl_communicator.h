// Communicators over NCCL for ranks on GPUs (communicator.h's device collectives): one per rank,
// rank r on GPU devices[r], all in one process (a thread per rank; ncclCommInitAll). libnccl.so.2
// (the CUDA toolkit's, or pip's nvidia-nccl-cu13 on LD_LIBRARY_PATH) is loaded at run time, so a
// machine without it runs everything but this.
//
// Numerics: ncclAllReduce adds in its ring or tree order, not in rank order. Every rank still
// receives the same bits (a reduce-scatter, then an all-gather of the reduced parts), so the ranks
// stay in step; against the in-process group's rank-order sum the results differ in the last bits
// of f32 (tests compare with a tolerance). bf16 and f16 are reduced by NCCL in their own type.
// NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set when the environment sets nothing.
#pragma once
#include <memory>
#include <vector>

#include "core/status.h"
#include "parallel/communicator.h"

namespace g4 {

// Errors: a build without CUDA, libnccl missing, a GPU listed twice (NCCL takes one GPU per rank:
// ranks that share a GPU take the host group), or NCCL's own message when the group cannot start.
Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_group(const std::vector<int>& devices);

}  // namespace g4
