// Collectives between the ranks of a tensor-parallel group: the one seam through which sharded
// forward code (parallel/shard.h) exchanges activations. One Communicator object per rank; rank r
// drives its own backend (a thread per rank, one process) and calls its Communicator only.
//
// Contract for every implementation (inproc_communicator.h; nccl_communicator.h for GPUs):
// - Memory: data pointers are memory of the calling rank's backend: host memory for the CPU and
//   reference backends, device memory for a device backend (an NCCL communicator passes them to
//   ncclAllReduce / ncclAllGather on the backend's stream). Host implementations read the data
//   when called, so the rank's backend must have finished writing it (Backend::sync()).
// - Blocking and ordered: a collective returns when this rank's result is in place and its input
//   may be reused. Every rank of the group calls the same collectives, with the same count and
//   dtype, in the same order; a rank that calls something else is a programming error (the
//   in-process implementation aborts naming both calls; NCCL would hang or corrupt).
// - Deterministic: every rank receives the same bits, and the same inputs give the same result on
//   every call. all_reduce_sum adds the ranks' values in rank order, acc = x0 + x1 + ... + x(n-1),
//   in f32: F32 results equal a serial f32 sum in rank order exactly; BF16 and F16 inputs are
//   widened to f32, summed in rank order and rounded to the dtype once (round to nearest even),
//   not after each addition. (An implementation that calls ncclAllReduce directly sums in NCCL's
//   ring or tree order instead: it must still give every rank the same bits, must say that it
//   does not keep the rank order, and comparisons with the in-process result then take a
//   tolerance. ncclAllGather followed by a local rank-order sum keeps the order exactly, at n
//   times the traffic.)
// - Uneven shards: all_gather takes one count for every rank (as NCCL does); slices of unequal
//   length are gathered padded to the longest, or reduced first (a vocabulary shard's argmax).
// - Errors: collectives run inside the forward pass, where nothing returns errors; an unusable
//   dtype or a failed transport aborts with a message naming the collective.
// - Device collectives (on_device(): NCCL): data pointers are device memory of the rank's GPU. A
//   device backend enqueues them on its stream in the order of its other work (the *_on forms,
//   through Backend::all_reduce / all_gather, so that a recorded step keeps them in place); the
//   blocking forms run on the communicator's own stream and wait for it.
#pragma once
#include <cstddef>

#include "core/dtype.h"
#include "core/status.h"

namespace g4 {

class Communicator {
 public:
  virtual ~Communicator() = default;
  // This rank's index in [0, size()) and the number of ranks of the group.
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place: data[i] = sum over ranks r (in rank order) of rank r's data[i], for i < count.
  // dtype: F32, BF16 or F16 (the latter two summed in f32, rounded once).
  virtual void all_reduce_sum(void* data, size_t count, DType dtype) = 0;
  // recv[r * count + i] = rank r's send[i] for every rank r (rank order); recv holds
  // size() * count elements. Any dtype with a size (dtype_size > 0): the bytes are copied.
  // In place is allowed as NCCL allows it: send == recv + rank() * count elements; otherwise
  // send and recv must not overlap.
  virtual void all_gather(const void* send, size_t count, DType dtype, void* recv) = 0;
  // Returns once every rank has called barrier().
  virtual void barrier() = 0;

  // Whether the collectives take device memory and can be enqueued on a device stream (the *_on
  // forms); false for host groups, whose *_on forms must not be called.
  virtual bool on_device() const { return false; }
  // all_reduce_sum / all_gather enqueued on `stream` (a cudaStream_t of the rank's GPU): they
  // return once queued, and the stream's later work sees the result.
  virtual void all_reduce_sum_on(void* stream, void* data, size_t count, DType dtype) {
    (void)stream, (void)data, (void)count, (void)dtype;
    G4_CHECK(false && "Communicator::all_reduce_sum_on: this group has no device collectives");
  }
  virtual void all_gather_on(void* stream, const void* send, size_t count, DType dtype, void* recv) {
    (void)stream, (void)send, (void)count, (void)dtype, (void)recv;
    G4_CHECK(false && "Communicator::all_gather_on: this group has no device collectives");
  }
};

}  // namespace g4
