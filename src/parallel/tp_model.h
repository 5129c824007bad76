// A model split over the ranks of a tensor-parallel group in one process, used as one model: rank
// 0's Model leads (model/model.h set_peers), every rank holds its shard (parallel/tp_source.h:
// heads, MLP columns, experts; the vocabulary rows), talks to the others through its Communicator
// and runs on a thread of its own. One forward pass: the Model's, with its collectives.
//
// Backends: cpu and reference over the in-process communicator; cuda with a GPU per rank over NCCL
// (nccl_communicator.h), or ranks sharing a GPU over the in-process group through host copies
// (checks on one GPU). MoE models split by expert on every backend.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/model_dir.h"
#include "model/model.h"
#include "parallel/communicator.h"

namespace g4 {

class ShardedWeightSource;

// Rank comm.rank() of comm.size() of the opened checkpoint, on a backend of its own made with opt
// (opt.device: its GPU); *source (when given) receives the rank's shard of the checkpoint.
Result<std::unique_ptr<Model>> build_tp_rank(const OpenedModel& om, const std::string& backend, Communicator& comm,
                                             const BackendOptions& opt = {},
                                             std::shared_ptr<ShardedWeightSource>* source = nullptr);

// Rank r's GPU under opt: BackendOptions::devices as listed, else GPUs 0..N-1 for N ranks, and
// --cuda-device's GPU for one rank.
std::vector<int> rank_devices(const BackendOptions& opt);

// Where a group's ranks run and how they exchange: devices[r] is rank r's GPU (-1: host backends);
// nccl: an NCCL group, else the in-process host group.
struct TpGroupPlan {
  std::vector<int> devices;
  bool nccl = false;
};
// The plan for opt.tensor_parallel ranks on `backend` (BackendOptions::devices, ::collectives);
// errors name the flag that does not fit (a host backend with --devices or NCCL, a GPU list of
// another length, one rank without NCCL).
Result<TpGroupPlan> plan_tp_group(const std::string& backend, const BackendOptions& opt);

// The leader of the group opt asks for (plan_tp_group) over the opened checkpoint: it owns the
// other ranks, their threads and the group. Errors name what does not split.
Result<std::unique_ptr<Model>> build_tp_model(const OpenedModel& om, const std::string& backend,
                                              const BackendOptions& opt);

// Whether opt asks for a group (more than one rank, NCCL, or GPUs listed) rather than one model.
bool uses_tp_group(const BackendOptions& opt);

// The model as opt asks: build_tp_model when uses_tp_group(opt), else build_model.
Result<std::unique_ptr<Model>> build_model_ranks(const OpenedModel& om, const std::string& backend,
                                                 const BackendOptions& opt);

}  // namespace g4
