// Progress of long work (reading weights, a long prefill), reported to one process-wide sink
// that the program installs (the CLI draws a bar on a terminal; nothing is reported without one).
// Thread-safe: several threads may add to one task.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace g4 {

enum class ProgressUnit { Bytes, Tokens, Iterations };

class ProgressSink {
 public:
  virtual ~ProgressSink() = default;
  // done of total so far, after `seconds` (called at most ~10 times a second, and once at the end
  // with done == total or, for work cut short, finished = true).
  virtual void update(const std::string& what, uint64_t done, uint64_t total, ProgressUnit unit, double seconds,
                      bool finished) = 0;
};

// The sink (null: none, the default). Set before the work starts.
void set_progress_sink(ProgressSink* sink);

// One piece of work of `total` units; reports to the sink when there is one and the work is at
// least `min_total` units (small work finishes before a bar would help).
class ProgressTask {
 public:
  ProgressTask(std::string what, uint64_t total, ProgressUnit unit, uint64_t min_total = 0);
  ~ProgressTask();  // reports the end
  ProgressTask(const ProgressTask&) = delete;
  ProgressTask& operator=(const ProgressTask&) = delete;
  void add(uint64_t n);

 private:
  void report(bool finished);
  std::string what_;
  uint64_t total_;
  ProgressUnit unit_;
  ProgressSink* sink_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> last_report_ns_{0};
  std::chrono::steady_clock::time_point start_;
};

}  // namespace g4
