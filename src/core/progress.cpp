#include "core/progress.h"

#include <mutex>

namespace g4 {
namespace {

std::atomic<ProgressSink*> g_sink{nullptr};
std::mutex g_report_mutex;  // one update at a time reaches the sink
constexpr int64_t kReportIntervalNs = 100'000'000;

}  // namespace

void set_progress_sink(ProgressSink* sink) { g_sink.store(sink); }

ProgressTask::ProgressTask(std::string what, uint64_t total, ProgressUnit unit, uint64_t min_total)
    : what_(std::move(what)), total_(total), unit_(unit),
      sink_(total >= min_total && total > 0 ? g_sink.load() : nullptr), start_(std::chrono::steady_clock::now()) {
  if (sink_) report(false);
}

ProgressTask::~ProgressTask() {
  if (sink_) report(true);
}

void ProgressTask::add(uint64_t n) {
  const uint64_t done = done_.fetch_add(n) + n;
  if (!sink_ || done >= total_) return;  // the end is reported by the destructor
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now() - start_).count();
  int64_t last = last_report_ns_.load();
  if (now - last < kReportIntervalNs || !last_report_ns_.compare_exchange_strong(last, now)) return;
  report(false);
}

void ProgressTask::report(bool finished) {
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::lock_guard<std::mutex> lock(g_report_mutex);
  sink_->update(what_, std::min(done_.load(), total_), total_, unit_, s, finished);
}

}  // namespace g4
