// A model split over the ranks of a tensor-parallel group in one process: rank r's Model holds its
// shard (parallel/tp_source.h: heads, MLP columns, experts; the vocabulary rows), talks to the
// other ranks through its Communicator, and runs on a thread of its own. One forward pass: the
// Model's, with the collectives of Model::set_communicator.
//
// Backends: cpu and reference, with the in-process communicator. A device backend needs the NCCL
// communicator and device-side logit gathering, which are not built yet; it is refused by name.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_dir.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace g4 {

// Rank comm.rank() of comm.size() of the opened checkpoint, on a backend of its own.
Result<std::unique_ptr<Model>> build_tp_rank(const OpenedModel& om, const std::string& backend, Communicator& comm);

class TensorParallelGroup {
 public:
  // Builds every rank (one after another) over an in-process group of `ranks` (>= 1).
  static Result<std::unique_ptr<TensorParallelGroup>> open(const OpenedModel& om, const std::string& backend,
                                                           int ranks);
  int size() const { return int(models_.size()); }
  Model& rank(int r) { return *models_[size_t(r)]; }
  // fn(r, rank r's model) on one thread per rank; returns when every rank has. Every rank must
  // make the same forward calls (same batches, its own caches) in the same order.
  void run(const std::function<void(int, Model&)>& fn);

 private:
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<Model>> models_;  // destroyed before comms_
};

}  // namespace g4
