// Fixed thread pool with cheap wake-up. A parallel region publishes the job, bumps `gen_` and
// runs part 0 itself. Idle workers spin on `gen_` (with pause) for an adaptive budget (at most
// G4_SPIN_US, default 2000 µs; see SpinBudget) and then sleep in std::atomic::wait (a futex on
// Linux); notify is a no-op when nobody sleeps, so back-to-back regions (~300 per decoded token)
// cost well under a microsecond each on free cores, and an idle pool burns no CPU after the
// budget. Every worker acknowledges every generation (even when it has no part), so no worker can
// lag into the next job.
#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define G4_PAUSE() _mm_pause()
#else
#define G4_PAUSE() std::this_thread::yield()
#endif

namespace g4 {
namespace {

int env_int(const char* name, int dflt) {
  if (const char* e = std::getenv(name)) {
    int n = std::atoi(e);
    if (n >= 0) return n;
  }
  return dflt;
}

int default_threads() {
  int n = env_int("G4_THREADS", 0);
  if (n > 0) return n;
  unsigned h = std::thread::hardware_concurrency();
  return h ? int(h) : 1;
}

thread_local bool t_in_pool = false;  // set on workers and on a caller inside a region

// Adaptive spin budget, one per thread: a spin that ends in success (the awaited event came) grows
// the budget back towards the maximum; one that times out halves it. On a machine with free cores
// waits stay in the spin (sub-microsecond wake-ups); when threads outnumber cores, spinning only
// delays the thread being awaited, the budget collapses, and waits go straight to the futex (with
// a short probe every 64 waits so the budget can recover). The 2 ms maximum outlasts the serial
// gaps of a decode step (sampling over 262k logits, host-side bookkeeping): on a KVM guest a futex
// wake-up costs tens of µs, and a 100 µs maximum let the budget collapse and cost the starter
// model ~25 % of its decode speed (bench, 2 threads).
class SpinBudget {
 public:
  explicit SpinBudget(int64_t max_ns) : max_(max_ns), cur_(max_ns) {}
  // Spins while pred() holds; returns true when pred() became false within the budget.
  template <class Pred>
  bool spin_while(Pred pred) {
    if (!pred()) return true;
    int64_t budget = cur_;
    if (budget < kMinNs) {
      if ((++probe_ & 63) != 0 || max_ <= 0) return false;
      budget = kMinNs;
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      for (int i = 0; i < 16; ++i) {
        G4_PAUSE();
        if (!pred()) {
          cur_ = std::min(max_, budget + budget / 2 + kMinNs);
          return true;
        }
      }
      if ((std::chrono::steady_clock::now() - t0).count() > budget) {
        cur_ = budget / 2;
        return false;
      }
    }
  }

 private:
  static constexpr int64_t kMinNs = 500;
  int64_t max_, cur_;
  uint32_t probe_ = 0;
};

class Pool {
 public:
  explicit Pool(int n) : n_(n), spin_max_ns_(int64_t(env_int("G4_SPIN_US", 2000)) * 1000) {
    for (int i = 1; i < n_; ++i) workers_.emplace_back([this, i] { loop(i); });
  }
  ~Pool() {
    stop_.store(true, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_release);
    gen_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
    int parts = int(std::min<int64_t>(n_, std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk))));
    if (parts <= 1 || t_in_pool) {  // tiny loop, or nested region: run inline
      fn(0, n);
      return;
    }
    std::lock_guard<std::mutex> call_lock(call_mu_);  // one parallel region at a time
    t_in_pool = true;
    fn_ = &fn;
    total_ = n;
    parts_ = parts;
    pending_.store(n_ - 1, std::memory_order_relaxed);
    gen_.fetch_add(1, std::memory_order_release);  // publishes fn_, total_, parts_
    gen_.notify_all();
    run_part(0);
    // Wait until every worker has acknowledged this generation.
    thread_local SpinBudget spin(spin_max_ns_);
    if (!spin.spin_while([&] { return pending_.load(std::memory_order_acquire) != 0; })) {
      for (int p; (p = pending_.load(std::memory_order_acquire)) != 0;) pending_.wait(p, std::memory_order_acquire);
    }
    fn_ = nullptr;
    t_in_pool = false;
  }

 private:
  void run_part(int p) {
    int64_t b = total_ * p / parts_, e = total_ * (p + 1) / parts_;
    if (b < e) (*fn_)(b, e);
  }
  void loop(int id) {
    t_in_pool = true;
    uint32_t seen = 0;
    SpinBudget spin(spin_max_ns_);
    for (;;) {
      if (!spin.spin_while([&] { return gen_.load(std::memory_order_acquire) == seen; })) {
        gen_.wait(seen, std::memory_order_acquire);
      }
      seen = gen_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      if (id < parts_) run_part(id);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  int n_;
  int64_t spin_max_ns_;
  std::vector<std::thread> workers_;
  std::mutex call_mu_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0;
  int parts_ = 0;
  std::atomic<uint32_t> gen_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
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
