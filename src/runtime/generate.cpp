#include "runtime/generate.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>

namespace g4 {

GenerationResult run_generation(Engine& engine, GenerationSpec spec, TextStream& stream,
                                const std::function<void(const TextEvent&)>& on_text,
                                const std::atomic<bool>* interrupt) {
  using clk = std::chrono::steady_clock;
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<TokenEvent> q;
  };
  auto sh = std::make_shared<Shared>();
  GenerationResult res;
  const auto stops = spec.stop_ids;
  const auto t0 = clk::now();
  auto id = engine.submit(std::move(spec), [sh](const TokenEvent& ev) {
    std::lock_guard<std::mutex> lk(sh->mu);
    sh->q.push_back(ev);
    sh->cv.notify_one();
  });
  if (!id) {
    res.reason = FinishReason::Error;
    res.error = id.message();
    return res;
  }
  bool cancelled = false;
  clk::time_point first{}, last{};
  for (;;) {
    TokenEvent ev;
    {
      std::unique_lock<std::mutex> lk(sh->mu);
      sh->cv.wait_for(lk, std::chrono::milliseconds(50), [&] { return !sh->q.empty(); });
      if (sh->q.empty()) {
        if (!cancelled && interrupt && interrupt->load()) {
          engine.cancel(id.value());
          cancelled = true;
        }
        continue;
      }
      ev = sh->q.front();
      sh->q.pop_front();
    }
    if (ev.token >= 0) {
      last = clk::now();
      if (res.tokens.empty()) first = last;
      res.tokens.push_back(ev.token);
      const bool is_stop = std::find(stops.begin(), stops.end(), ev.token) != stops.end();
      if (!is_stop && !cancelled) {
        for (const TextEvent& te : stream.push(ev.token)) on_text(te);
        if (stream.stopped()) {
          res.stopped_by_string = true;
          engine.cancel(id.value());
          cancelled = true;
        }
      }
    }
    if (!cancelled && interrupt && interrupt->load()) {
      engine.cancel(id.value());
      cancelled = true;
    }
    if (ev.done) {
      res.reason = res.stopped_by_string ? FinishReason::Stop : ev.reason;
      res.prompt_tokens = ev.prompt_tokens;
      res.cached_tokens = ev.cached_tokens;
      res.completion_tokens = ev.completion_tokens;
      res.error = ev.error;
      break;
    }
  }
  for (const TextEvent& te : stream.finish()) on_text(te);
  if (!res.tokens.empty()) {
    res.prefill_seconds = std::chrono::duration<double>(first - t0).count();
    res.decode_seconds = std::chrono::duration<double>(last - first).count();
  }
  return res;
}

}  // namespace g4
