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
  // The table sorts by each label's calls times its median call: one-off costs (cuBLAS's start,
  // a kernel module's first load) land in a label's first call and show as its max, not as a share.
  ~OpProfile() override {
    resolve();
    struct Row {
      std::string label;
      long n;
      double total_ms, median_us, max_us, typical_ms;
    };
    std::vector<Row> rows;
    double typical = 0, total = 0;
    for (auto& [label, us] : acc_) {
      std::sort(us.begin(), us.end());
      double sum = 0;
      for (float v : us) sum += v;
      const double med = us[us.size() / 2];
      rows.push_back({label, long(us.size()), sum / 1e3, med, us.back(), med * double(us.size()) / 1e3});
      typical += rows.back().typical_ms;
      total += sum / 1e3;
    }
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.typical_ms > b.typical_ms; });
    std::fprintf(stderr, "cuda profile: %.3f ms of device time in ops (%.3f ms at each op's median)\n"
                         "%-34s %8s %10s %10s %10s %10s %6s\n", total, typical, "op", "calls", "total ms",
                 "median us", "max us", "calls*med", "share");
    for (const Row& r : rows)
      std::fprintf(stderr, "%-34s %8ld %10.3f %10.2f %10.1f %10.3f %5.1f%%\n", r.label.c_str(), r.n, r.total_ms,
                   r.median_us, r.max_us, r.typical_ms, 100.0 * r.typical_ms / typical);
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
      acc_[p.label].push_back(1e3f * ms);
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
    pending_.clear();
  }
  struct Pending {
    std::string label;
    cudaEvent_t a, b;
  };
  std::vector<Pending> pending_;
  std::map<std::string, std::vector<float>> acc_;  // each call's device time (us), by label
};

// A step's device time runs from an event before its work to one after it. Steps may be queued
// ahead of the reads (model/greedy_pipeline.h), so the pairs live in a ring and each is read once
// its second event has completed (at a later read, or when its ring slot comes round again).
class StepTimer final : public StepObserver {
 public:
  StepTimer() {
    for (Pair& p : ring_) {
      G4_CUDA(cudaEventCreate(&p.a));
      G4_CUDA(cudaEventCreate(&p.b));
    }
  }
  ~StepTimer() override {
    for (Pair& p : ring_) collect(p, true);
    if (!wait_.empty())
      std::fprintf(stderr, "cuda timing: %zu steps, medians per step: host enqueue %.1f us, end_step %.1f us, "
                           "logits wait %.1f us, host between steps %.1f us; device time of the step's work %.1f "
                           "us\n", wait_.size(), med(enqueue_), med(end_), med(wait_), med(outside_), med(gpu_));
    for (Pair& p : ring_) {
      cudaEventDestroy(p.a);
      cudaEventDestroy(p.b);
    }
  }
  void step_begin() override {
    if (!wait_.empty()) outside_.push_back(lap());
    mark_ = Clock::now();
  }
  void step_logged(cudaStream_t s) override {
    enqueue_.push_back(lap());
    Pair& p = ring_[next_];
    collect(p, true);  // a step kRing back: long done
    G4_CUDA(cudaEventRecord(p.a, s));
  }
  void step_launched(cudaStream_t s) override {
    Pair& p = ring_[next_];
    G4_CUDA(cudaEventRecord(p.b, s));
    p.pending = true;
    next_ = (next_ + 1) % kRing;
    end_.push_back(lap());
  }
  void output_read() override {
    for (Pair& p : ring_) collect(p, false);
    wait_.push_back(lap());
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr int kRing = 4;
  struct Pair {
    cudaEvent_t a = nullptr, b = nullptr;
    bool pending = false;
  };
  // Adds p's step time once its work is done (waiting for it when `wait`).
  void collect(Pair& p, bool wait) {
    if (!p.pending) return;
    if (wait) G4_CUDA(cudaEventSynchronize(p.b));
    else if (cudaEventQuery(p.b) != cudaSuccess) return;
    float ms = 0;
    if (cudaEventElapsedTime(&ms, p.a, p.b) == cudaSuccess) gpu_.push_back(1e-3 * ms);
    p.pending = false;
  }
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
  Pair ring_[kRing];
  int next_ = 0;
};

}  // namespace

std::unique_ptr<LaunchObserver> make_op_profile() { return std::make_unique<OpProfile>(); }
std::unique_ptr<StepObserver> make_step_timer() { return std::make_unique<StepTimer>(); }

}  // namespace g4::cuda
