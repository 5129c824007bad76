// The profiling and timing observers (cuda_observers.h).
#include "backend/cuda/cuda_observers.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <vector>

#include "backend/cuda/cuda_check.h"

namespace g4::cuda {
namespace {

class OpProfile final : public LaunchObserver {
 public:
  ~OpProfile() override {
    resolve();
    std::vector<std::pair<std::string, Acc>> rows(acc_.begin(), acc_.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
    double total = 0;
    for (const auto& r : rows) total += r.second.ms;
    std::fprintf(stderr, "cuda profile: %.3f ms of device time in ops\n%-34s %8s %10s %9s %6s\n", total, "op", "calls",
                 "total ms", "us/call", "share");
    for (const auto& [k, a] : rows)
      std::fprintf(stderr, "%-34s %8ld %10.3f %9.2f %5.1f%%\n", k.c_str(), a.n, a.ms, 1e3 * a.ms / double(a.n),
                   100.0 * a.ms / total);
  }
  void before(const std::string& label, cudaStream_t s) override {
    Pending p{label, nullptr, nullptr};
    G4_CUDA(cudaEventCreate(&p.a));
    G4_CUDA(cudaEventCreate(&p.b));
    G4_CUDA(cudaEventRecord(p.a, s));
    pending_.push_back(p);
  }
  void after(cudaStream_t s) override {
    G4_CUDA(cudaEventRecord(pending_.back().b, s));
    if (pending_.size() > 4096) resolve();
  }

 private:
  void resolve() {
    for (Pending& p : pending_) {
      G4_CUDA(cudaEventSynchronize(p.b));
      float ms = 0;
      G4_CUDA(cudaEventElapsedTime(&ms, p.a, p.b));
      Acc& a = acc_[p.label];
      a.ms += ms;
      ++a.n;
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
    pending_.clear();
  }
  struct Pending {
    std::string label;
    cudaEvent_t a, b;
  };
  struct Acc {
    double ms = 0;
    long n = 0;
  };
  std::vector<Pending> pending_;
  std::map<std::string, Acc> acc_;
};

class StepTimer final : public StepObserver {
 public:
  StepTimer() {
    G4_CUDA(cudaEventCreate(&ev_[0]));
    G4_CUDA(cudaEventCreate(&ev_[1]));
  }
  ~StepTimer() override {
    if (!wait_.empty())
      std::fprintf(stderr, "cuda timing: %zu steps, medians per step: host enqueue %.1f us, end_step %.1f us, "
                           "logits wait %.1f us, host between steps %.1f us; device time of the step's work %.1f "
                           "us\n", wait_.size(), med(enqueue_), med(end_), med(wait_), med(outside_), med(gpu_));
    cudaEventDestroy(ev_[0]);
    cudaEventDestroy(ev_[1]);
  }
  void step_begin() override {
    if (!wait_.empty()) outside_.push_back(lap());
    mark_ = Clock::now();
  }
  void step_logged(cudaStream_t s) override {
    enqueue_.push_back(lap());
    G4_CUDA(cudaEventRecord(ev_[0], s));
  }
  void step_launched(cudaStream_t s) override {
    G4_CUDA(cudaEventRecord(ev_[1], s));
    end_.push_back(lap());
  }
  void output_read() override {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, ev_[0], ev_[1]) == cudaSuccess) gpu_.push_back(1e-3 * ms);
    wait_.push_back(lap());
  }

 private:
  using Clock = std::chrono::steady_clock;
  // Seconds since the last mark; the mark moves to now.
  double lap() {
    const auto now = Clock::now();
    const double s = std::chrono::duration<double>(now - mark_).count();
    mark_ = now;
    return s;
  }
  static double med(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : 1e6 * v[v.size() / 2];
  }
  Clock::time_point mark_ = Clock::now();
  std::vector<double> enqueue_, end_, wait_, outside_, gpu_;
  cudaEvent_t ev_[2] = {nullptr, nullptr};
};

}  // namespace

std::unique_ptr<LaunchObserver> make_op_profile() { return std::make_unique<OpProfile>(); }
std::unique_ptr<StepObserver> make_step_timer() { return std::make_unique<StepTimer>(); }

}  // namespace g4::cuda
