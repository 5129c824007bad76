#include "parallel/tp_model.h"

#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "model/weights.h"
#include "parallel/inproc_communicator.h"
#include "parallel/nccl_communicator.h"
#include "parallel/shard.h"
#include "parallel/tp_lora.h"
#include "parallel/tp_source.h"

namespace g4 {
namespace {

// The peers of a group's leader (ModelPeers), each on a thread that waits for the leader's next
// job; owns the peers' models and the group's communicators (the leader's included).
class ThreadPeers : public ModelPeers {
 public:
  // sources: every rank's shard of the checkpoint (rank order, the leader's first); global: its config.
  ThreadPeers(std::vector<std::unique_ptr<Communicator>> comms, std::vector<std::unique_ptr<Model>> peers,
              std::vector<std::shared_ptr<ShardedWeightSource>> sources, ModelConfig global)
      : comms_(std::move(comms)), peers_(std::move(peers)), sources_(std::move(sources)), global_(std::move(global)) {
    for (int i = 0; i < count(); ++i) threads_.emplace_back([this, i] { serve(i); });
  }
  ~ThreadPeers() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  int count() const override { return int(peers_.size()); }
  Model& peer(int i) override { return *peers_[size_t(i)]; }
  void start(const std::function<void(int, Model&)>& fn) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &fn;
      ++generation_;
      running_ = count();
    }
    cv_.notify_all();
  }
  void join() override {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [this] { return running_ == 0; });
    job_ = nullptr;
  }
  Result<std::unique_ptr<LoraAdapter>> load_adapter(const std::string& dir, Model& leader) override {
    std::unique_ptr<Backend> host = make_backend("reference");  // the whole adapter, in host memory
    G4_ASSIGN_OR_RETURN(std::unique_ptr<LoraAdapter> whole, load_lora_adapter(dir, global_, *host));
    G4_ASSIGN_OR_RETURN(std::unique_ptr<LoraAdapter> mine, shard_lora_adapter(*whole, *sources_[0], leader.backend()));
    for (int i = 0; i < count(); ++i) {
      G4_ASSIGN_OR_RETURN(std::unique_ptr<LoraAdapter> theirs,
                          shard_lora_adapter(*whole, *sources_[size_t(i) + 1], peer(i).backend()));
      mine->peers.push_back(std::move(theirs));
    }
    return mine;
  }

 private:
  void serve(int i) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      const auto* fn = job_;
      lock.unlock();
      (*fn)(i, *peers_[size_t(i)]);
      lock.lock();
      if (--running_ == 0) done_.notify_one();
    }
  }

  std::vector<std::unique_ptr<Communicator>> comms_;  // destroyed after the models
  std::vector<std::unique_ptr<Model>> peers_;
  std::vector<std::shared_ptr<ShardedWeightSource>> sources_;
  ModelConfig global_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_;
  const std::function<void(int, Model&)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
};

}  // namespace

Result<std::unique_ptr<Model>> build_tp_rank(const OpenedModel& om, const std::string& backend, Communicator& comm,
                                             const BackendOptions& opt, std::shared_ptr<ShardedWeightSource>* source) {
  if (backend != "cpu" && backend != "reference" && backend != "cuda")
    return err("tensor parallelism runs on the cpu, reference and cuda backends, not '%s'", backend.c_str());
  G4_ASSIGN_OR_RETURN(std::shared_ptr<ShardedWeightSource> src,
                      ShardedWeightSource::make(om.weights, om.config, comm.rank(), comm.size()));
  G4_ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, open_backend(backend, opt));
  G4_ASSIGN_OR_RETURN(ModelWeights w, load_weights(src->config(), *src, *be));
  G4_ASSIGN_OR_RETURN(w.lm_head, shard_rows(w.lm_head, comm.rank(), comm.size(), "lm_head"));
  auto m = std::make_unique<Model>(src->config(), std::move(w), src, std::move(be));
  m->set_communicator(&comm);
  if (source) *source = src;
  return m;
}

std::vector<int> rank_devices(const BackendOptions& opt) {
  if (!opt.devices.empty()) return opt.devices;
  if (opt.tensor_parallel <= 1) return {opt.device};
  std::vector<int> d;
  for (int r = 0; r < opt.tensor_parallel; ++r) d.push_back(r);
  return d;
}

Result<TpGroupPlan> plan_tp_group(const std::string& backend, const BackendOptions& opt) {
  using C = BackendOptions::Collectives;
  const int n = opt.tensor_parallel;
  TpGroupPlan plan;
  if (backend != "cuda") {
    if (!opt.devices.empty()) return err("--devices places ranks on GPUs: it needs --backend cuda");
    if (opt.collectives == C::Nccl) return err("--collectives nccl needs --backend cuda");
    if (n < 2) return err("tensor parallel: %d rank; a group on the host has at least 2", n);
    plan.devices.assign(size_t(n), -1);
    return plan;
  }
  if (!opt.devices.empty() && int(opt.devices.size()) != n)
    return err("--devices lists %zu GPUs for --tensor-parallel %d (one per rank)", opt.devices.size(), n);
  plan.devices = rank_devices(opt);
  const bool distinct = std::set<int>(plan.devices.begin(), plan.devices.end()).size() == plan.devices.size();
  plan.nccl = opt.collectives == C::Nccl || (opt.collectives == C::Auto && distinct);
  if (!plan.nccl && n < 2)
    return err("tensor parallel: 1 rank over host collectives is the plain model (--collectives nccl checks "
               "the NCCL path with one rank)");
  return plan;
}

Result<std::unique_ptr<Model>> build_tp_model(const OpenedModel& om, const std::string& backend,
                                              const BackendOptions& opt) {
  G4_ASSIGN_OR_RETURN(TpGroupPlan plan, plan_tp_group(backend, opt));
  std::vector<std::unique_ptr<Communicator>> comms;
  if (plan.nccl) {
    G4_ASSIGN_OR_RETURN(comms, make_nccl_group(plan.devices));
  } else {
    comms = make_inproc_group(int(plan.devices.size()));
  }
  std::vector<std::unique_ptr<Model>> models;
  std::vector<std::shared_ptr<ShardedWeightSource>> sources(comms.size());
  for (size_t r = 0; r < comms.size(); ++r) {
    BackendOptions rank_opt = opt;
    if (plan.devices[r] >= 0) rank_opt.device = plan.devices[r];
    G4_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, build_tp_rank(om, backend, *comms[r], rank_opt, &sources[r]));
    models.push_back(std::move(m));
  }
  std::unique_ptr<Model> leader = std::move(models[0]);
  models.erase(models.begin());
  leader->set_peers(std::make_unique<ThreadPeers>(std::move(comms), std::move(models), std::move(sources), om.config));
  return leader;
}

Result<std::unique_ptr<Model>> build_model_ranks(const OpenedModel& om, const std::string& backend,
                                                 const BackendOptions& opt) {
  if (!uses_tp_group(opt)) return build_model(om, backend, opt);
  return build_tp_model(om, backend, opt);
}

bool uses_tp_group(const BackendOptions& opt) {
  return opt.tensor_parallel > 1 || opt.collectives == BackendOptions::Collectives::Nccl || !opt.devices.empty();
}

}  // namespace g4
