#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace g4 {
namespace {

int default_threads() {
  if (const char* e = std::getenv("G4_THREADS")) {
    int n = std::atoi(e);
    if (n > 0) return n;
  }
  unsigned h = std::thread::hardware_concurrency();
  return h ? int(h) : 1;
}

class Pool {
 public:
  explicit Pool(int n) : n_(n) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++gen_;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
    int parts = int(std::min<int64_t>(n_, std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
    if (parts <= 1) {
      fn(0, n);
      return;
    }
    std::unique_lock<std::mutex> call_lock(call_mu_);  // one parallel region at a time
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      total_ = n;
      parts_ = parts;
      pending_ = parts - 1;
      ++gen_;
    }
    cv_.notify_all();
    run_part(0);
    std::unique_lock<std::mutex> lk(mu_);
    done_cv_.wait(lk, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }

 private:
  void run_part(int p) {
    int64_t b = total_ * p / parts_, e = total_ * (p + 1) / parts_;
    if (b < e) (*fn_)(b, e);
  }
  void loop(int id) {
    uint64_t seen = 0;
    for (;;) {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (stop_) return;
      if (id >= parts_) continue;
      lk.unlock();
      run_part(id);
      lk.lock();
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, call_mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0;
  int parts_ = 0, pending_ = 0;
  uint64_t gen_ = 0;
  bool stop_ = false;
};

int g_requested = 0;
Pool& pool() {
  static Pool p(g_requested > 0 ? g_requested : default_threads());
  return p;
}

}  // namespace

void set_num_threads(int n) { g_requested = n; }
int num_threads() { return pool().size(); }

void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
  if (n <= 0) return;
  pool().run(n, fn, min_chunk);
}

}  // namespace g4
