// A model split over the ranks of a tensor-parallel group in one process, used as one model: rank
// 0's Model leads (model/model.h set_peers), every rank holds its shard (parallel/tp_source.h:
// heads, MLP columns, experts; the vocabulary rows), talks to the others through its Communicator
// and runs on a thread of its own. One forward pass: the Model's, with its collectives.
//
// Backends: cpu and reference, with the in-process communicator. A device backend needs the NCCL
// communicator and device-side logit gathering, which are not built yet; it is refused by name.
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "io/model_dir.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace g4 {

class ShardedWeightSource;

// Rank comm.rank() of comm.size() of the opened checkpoint, on a backend of its own; *source (when
// given) receives the rank's shard of the checkpoint.
Result<std::unique_ptr<Model>> build_tp_rank(const OpenedModel& om, const std::string& backend, Communicator& comm,
                                             std::shared_ptr<ShardedWeightSource>* source = nullptr);

// The leader of `ranks` ranks (>= 2) of the opened checkpoint over an in-process group: it owns
// the other ranks, their threads and the group. Errors name what does not split.
Result<std::unique_ptr<Model>> build_tp_model(const OpenedModel& om, const std::string& backend, int ranks);

// The model as opt asks: build_tp_model over opt.tensor_parallel ranks, or build_model for one.
Result<std::unique_ptr<Model>> build_model_ranks(const OpenedModel& om, const std::string& backend,
                                                 const BackendOptions& opt);

}  // namespace g4
