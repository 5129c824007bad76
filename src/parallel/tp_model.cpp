#include "parallel/tp_model.h"

#include <thread>

#include "model/weights.h"
#include "parallel/inproc_communicator.h"
#include "parallel/shard.h"
#include "parallel/tp_source.h"

namespace g4 {

Result<std::unique_ptr<Model>> build_tp_rank(const OpenedModel& om, const std::string& backend, Communicator& comm) {
  if (backend != "cpu" && backend != "reference")
    return err("tensor parallelism runs on the cpu and reference backends in this build, not '%s' (the NCCL "
               "communicator is not built yet)", backend.c_str());
  G4_ASSIGN_OR_RETURN(std::shared_ptr<ShardedWeightSource> src,
                      ShardedWeightSource::make(om.weights, om.config, comm.rank(), comm.size()));
  std::unique_ptr<Backend> be = make_backend(backend);
  G4_ASSIGN_OR_RETURN(ModelWeights w, load_weights(src->config(), *src, *be));
  G4_ASSIGN_OR_RETURN(w.lm_head, shard_rows(w.lm_head, comm.rank(), comm.size(), "lm_head"));
  auto m = std::make_unique<Model>(src->config(), std::move(w), src, std::move(be));
  m->set_communicator(&comm);
  return m;
}

Result<std::unique_ptr<TensorParallelGroup>> TensorParallelGroup::open(const OpenedModel& om,
                                                                       const std::string& backend, int ranks) {
  if (ranks < 1) return err("tensor parallel: %d ranks; give at least 1", ranks);
  auto g = std::unique_ptr<TensorParallelGroup>(new TensorParallelGroup());
  g->comms_ = make_inproc_group(ranks);
  for (auto& c : g->comms_) {
    G4_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, build_tp_rank(om, backend, *c));
    g->models_.push_back(std::move(m));
  }
  return g;
}

void TensorParallelGroup::run(const std::function<void(int, Model&)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 1; r < size(); ++r) threads.emplace_back([this, &fn, r] { fn(r, *models_[size_t(r)]); });
  fn(0, *models_[0]);  // rank 0 on the caller's thread
  for (auto& t : threads) t.join();
}

}  // namespace g4
