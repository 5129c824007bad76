#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

namespace g4 {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
    default: return "none";
  }
}

struct Engine::Request {
  uint64_t id = 0;
  GenerationSpec spec;
  EventFn on_event;
};

struct Engine::Slot {
  std::shared_ptr<Request> req;          // null when free
  std::unique_ptr<KvCache> cache;
  std::unique_ptr<Sampler> sampler;
  std::vector<int32_t> fed;              // tokens whose KV is in the cache
  std::vector<int32_t> history;          // what the logits processors see
  int consumed = 0;                      // prompt tokens fed so far
  int generated = 0;
  int cached = 0;
  int32_t pending = -1;                  // sampled token not yet fed
};

Engine::Engine(Model& model, EngineOptions opt)
    : model_(model), opt_(opt), prefix_(opt.prefix_cache_bytes) {
  opt_.parallel = std::max(1, opt_.parallel);
  opt_.prefill_chunk = std::max(1, opt_.prefill_chunk);
  for (int i = 0; i < opt_.parallel; ++i) slots_.push_back(std::make_unique<Slot>());
  logits_.resize(size_t(opt_.parallel) * model_.config().vocab);
  const char* dt = std::getenv("G4_DEVICE_TOPK");  // 0: always copy the logits (for comparisons)
  device_topk_enabled_ = !(dt && std::string(dt) == "0");
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() { shutdown(false); }

Result<uint64_t> Engine::submit(GenerationSpec spec, EventFn on_event) {
  const int V = model_.config().vocab;
  if (spec.prompt.empty()) return err("prompt is empty");
  for (int32_t t : spec.prompt)
    if (t < 0 || t >= V) return err("prompt token id %d is outside the vocabulary (size %d)", t, V);
  if (spec.max_tokens < 1) return err("max_tokens must be at least 1");
  const long need = long(spec.prompt.size()) + spec.max_tokens;
  if (need > opt_.max_context)
    return err("prompt (%zu tokens) + max_tokens (%d) exceeds the context limit of %d tokens",
               spec.prompt.size(), spec.max_tokens, opt_.max_context);
  Status sv = validate(spec.sampling, V);
  if (!sv) return Error{sv.message()};
  std::lock_guard<std::mutex> lk(mu_);
  if (stop_) return err("engine is shutting down");
  const int busy = stats_.active;
  if (int(queue_.size()) + busy >= opt_.parallel + opt_.max_queue) {
    ++stats_.requests_rejected;
    return err("queue full: %d requests running and %zu waiting", busy, queue_.size());
  }
  auto r = std::make_shared<Request>();
  r->id = next_id_++;
  r->spec = std::move(spec);
  r->on_event = std::move(on_event);
  queue_.push_back(r);
  ++stats_.requests_total;
  cv_.notify_all();
  return r->id;
}

void Engine::cancel(uint64_t id) {
  std::lock_guard<std::mutex> lk(mu_);
  cancels_.push_back(id);
  cv_.notify_all();
}

void Engine::shutdown(bool drain) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    drain_ = drain;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  s.queued = int(queue_.size());
  return s;
}

void Engine::finish(Slot& s, FinishReason r, const std::string& error) {
  TokenEvent ev;
  ev.done = true;
  ev.reason = r;
  ev.prompt_tokens = int(s.req->spec.prompt.size());
  ev.cached_tokens = s.cached;
  ev.completion_tokens = s.generated;
  ev.error = error;
  std::shared_ptr<Request> req = std::move(s.req);
  // Free the slot first, so that whoever sees the final event also sees the slot free.
  // Keep the KV of a cleanly consumed sequence for later prefixes.
  if (r != FinishReason::Error && s.cache && s.cache->size() == int(s.fed.size()) && !s.fed.empty()) {
    prefix_.insert(std::move(s.fed), std::move(s.cache));
  }
  s.cache.reset();
  s.fed.clear();
  s.history.clear();
  s.sampler.reset();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.requests_finished;
    --stats_.active;  // slots are engine-thread state; this counter is what other threads read
  }
  req->on_event(ev);
}

void Engine::admit() {
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (s.req) continue;
    std::shared_ptr<Request> r;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) return;
      r = queue_.front();
      queue_.pop_front();
      ++stats_.active;
    }
    s.req = r;
    s.cache = model_.new_cache();
    s.sampler = std::make_unique<Sampler>(r->spec.sampling, model_.config().vocab);
    s.cached = prefix_.lookup(r->spec.prompt, *s.cache);
    s.consumed = s.cached;
    s.fed.assign(r->spec.prompt.begin(), r->spec.prompt.begin() + s.cached);
    s.generated = 0;
    s.pending = -1;
    s.history.clear();
    std::lock_guard<std::mutex> lk(mu_);
    stats_.prompt_tokens += r->spec.prompt.size();
    stats_.cached_tokens += uint64_t(s.cached);
  }
}

void Engine::step() {
  using clk = std::chrono::steady_clock;
  const auto t0 = clk::now();
  // Apply cancellations first, so a cancelled slot is freed within one step.
  std::vector<uint64_t> cancels;
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancels.swap(cancels_);
    for (uint64_t id : cancels) {
      for (auto it = queue_.begin(); it != queue_.end(); ++it) {
        if ((*it)->id != id) continue;
        TokenEvent ev;
        ev.done = true;
        ev.reason = FinishReason::Cancelled;
        ev.prompt_tokens = int((*it)->spec.prompt.size());
        auto req = *it;
        queue_.erase(it);
        mu_.unlock();
        req->on_event(ev);
        mu_.lock();
        break;
      }
    }
  }
  for (auto& sp : slots_)
    if (sp->req && std::find(cancels.begin(), cancels.end(), sp->req->id) != cancels.end())
      finish(*sp, FinishReason::Cancelled);
  admit();

  std::vector<SeqInput> batch;
  std::vector<Slot*> in_batch;
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (!s.req) continue;
    const auto& prompt = s.req->spec.prompt;
    SeqInput in;
    in.cache = s.cache.get();
    if (s.consumed < int(prompt.size())) {
      in.n = std::min(opt_.prefill_chunk, int(prompt.size()) - s.consumed);
      in.tokens = prompt.data() + s.consumed;
    } else {
      in.n = 1;
      in.tokens = &s.pending;
    }
    batch.push_back(in);
    in_batch.push_back(&s);
  }
  if (batch.empty()) return;
  // On a device backend, a batch whose every sampler is plain greedy takes the argmax there and
  // copies one id per sequence instead of the logits (host backends keep the sampler's own
  // argmax of the logprobs, which mlx-lm's greedy is checked against).
  const int V = model_.config().vocab;
  bool device_greedy = model_.backend().on_device();
  for (Slot* s : in_batch) device_greedy = device_greedy && plain_greedy(s->sampler->params());
  // A batch whose sequences all sample under a top-k bound (or greedily) copies each row's top k
  // and log-sum-exp instead of the logits (Sampler::sample_top).
  bool device_topk = model_.backend().on_device() && !device_greedy && device_topk_enabled_;
  int K = 1;
  for (Slot* s : in_batch) {
    const SamplingParams& sp = s->sampler->params();
    device_topk = device_topk && (plain_greedy(sp) || Sampler::top_k_sampleable(sp, V));
    if (Sampler::top_k_sampleable(sp, V)) K = std::max(K, sp.top_k);
  }
  greedy_ids_.resize(batch.size());
  const auto tf = clk::now();
  Model::TopK tk;
  if (device_greedy) {
    model_.forward(batch, opt_.precision, nullptr, greedy_ids_.data());
  } else if (device_topk) {
    topk_vals_.resize(batch.size() * size_t(K));
    topk_ids_.resize(batch.size() * size_t(K));
    topk_lse_.resize(batch.size());
    tk = Model::TopK{K, topk_vals_.data(), topk_ids_.data(), topk_lse_.data()};
    model_.forward(batch, opt_.precision, nullptr, nullptr, &tk);
  } else {
    model_.forward(batch, opt_.precision, logits_.data());
  }
  const auto tf2 = clk::now();

  for (size_t i = 0; i < in_batch.size(); ++i) {
    Slot& s = *in_batch[i];
    const auto& prompt = s.req->spec.prompt;
    const bool prefilling = s.consumed < int(prompt.size());
    if (prefilling) {
      s.fed.insert(s.fed.end(), prompt.begin() + s.consumed, prompt.begin() + s.consumed + batch[i].n);
      s.consumed += batch[i].n;
      if (s.consumed < int(prompt.size())) continue;  // more prompt to go: no token yet
      // mlx-lm generate_step: the processors see the prompt tokens it computed (not those
      // restored from the prompt cache) plus the generated tokens.
      s.history.assign(prompt.begin() + s.cached, prompt.end());
    } else {
      s.fed.push_back(s.pending);
    }
    int32_t tok;
    if (device_greedy) {
      tok = greedy_ids_[i];
    } else if (device_topk) {
      const float* v = topk_vals_.data() + i * size_t(K);
      const int32_t* ids = topk_ids_.data() + i * size_t(K);
      if (plain_greedy(s.sampler->params())) {  // the largest value, lowest id among ties
        int best = 0;
        for (int j = 1; j < K; ++j)
          if (v[j] > v[best] || (v[j] == v[best] && ids[j] < ids[best])) best = j;
        tok = ids[best];
      } else {
        tok = s.sampler->sample_top(v, ids, K, topk_lse_[i]);
      }
    } else {
      tok = s.sampler->sample(logits_.data() + i * size_t(V), s.history);
    }
    s.history.push_back(tok);
    s.pending = tok;
    ++s.generated;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.generated_tokens;
    }
    const auto& stops = s.req->spec.stop_ids;
    const bool is_stop = std::find(stops.begin(), stops.end(), tok) != stops.end();
    const bool at_limit = s.generated >= s.req->spec.max_tokens;
    TokenEvent ev;
    ev.token = tok;
    ev.prompt_tokens = int(prompt.size());
    ev.cached_tokens = s.cached;
    ev.completion_tokens = s.generated;
    s.req->on_event(ev);
    if (is_stop) {
      finish(s, FinishReason::Stop);
    } else if (at_limit) {
      finish(s, FinishReason::Length);
    }
  }
  const auto t1 = clk::now();
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.steps;
  stats_.forward_seconds += std::chrono::duration<double>(tf2 - tf).count();
  stats_.step_seconds += std::chrono::duration<double>(t1 - t0).count();
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto idle = [&] {
        bool active = false;
        for (auto& s : slots_) active |= bool(s->req);
        return !active && queue_.empty() && cancels_.empty();
      };
      cv_.wait(lk, [&] { return stop_ || !idle(); });
      if (stop_ && (!drain_ || idle())) break;
    }
    step();
  }
  // Anything left is cancelled.
  for (auto& sp : slots_)
    if (sp->req) finish(*sp, FinishReason::Cancelled);
  std::deque<std::shared_ptr<Request>> rest;
  {
    std::lock_guard<std::mutex> lk(mu_);
    rest.swap(queue_);
  }
  for (auto& r : rest) {
    TokenEvent ev;
    ev.done = true;
    ev.reason = FinishReason::Cancelled;
    r->on_event(ev);
  }
}

}  // namespace g4
