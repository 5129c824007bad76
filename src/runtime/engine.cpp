#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <string>

#include "model/drafter.h"
#include "runtime/engine_slot.h"

namespace g4 {
namespace {

// The prefix-cache tag of a request's KV (PrefixCache: 0 for the base model).
uint64_t adapter_tag(const GenerationSpec& spec) { return spec.adapter ? spec.adapter->serial : 0; }

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::Stop: return "stop";
    case FinishReason::Length: return "length";
    case FinishReason::Cancelled: return "cancelled";
    case FinishReason::Error: return "error";
    default: return "none";
  }
}

namespace {
// Sequences whose tokens are drawn from the logits on the host: reported logprobs. (A grammar's
// mask is applied where the logits are: Engine::device_masks.)
bool needs_host_logits(const GenerationSpec& spec) { return spec.logprobs >= 0; }
}  // namespace

Engine::Engine(Model& model, EngineOptions opt)
    : model_(model), opt_(opt), prefix_(opt.prefix_cache_bytes) {
  opt_.parallel = std::max(1, opt_.parallel);
  if (opt_.prefix_listener) prefix_.set_listener(opt_.prefix_listener);
  opt_.prefill_chunk = std::max(1, opt_.prefill_chunk);
  for (int i = 0; i < opt_.parallel; ++i) slots_.push_back(std::make_unique<Slot>());
  stats_.kv_capacity_tokens = int64_t(opt_.parallel) * opt_.max_context;
  stats_.prefix_capacity_bytes = opt_.prefix_cache_bytes;
  if (opt_.kv_pool_bytes > 0) open_pool();
  if (opt_.decode_buckets && !model_.set_decode_padding(true))
    std::fprintf(stderr, "[gemma4] decode buckets: off (an expert trace, or no KV room for the pad sequence)\n");
  logits_.resize(size_t(opt_.parallel) * model_.config().vocab);
  const char* dt = std::getenv("G4_DEVICE_TOPK");  // 0: always copy the logits (for comparisons)
  device_topk_enabled_ = !(dt && std::string(dt) == "0");
  const char* ds = std::getenv("G4_DEVICE_SAMPLING");
  device_sampling_ = model_.backend().on_device() || (ds && std::string(ds) == "1");
  if (!opt_.prompt_cache_dir.empty() && opt_.prefix_cache_bytes > 0) open_prompt_store();
  thread_ = std::thread([this] { loop(); });
}

void Engine::open_prompt_store() {
  auto warn = [](const std::string& m) { std::fprintf(stderr, "[gemma4] prompt cache: %s\n", m.c_str()); };
  store_ = std::make_unique<PromptStore>(opt_.prompt_cache_dir, opt_.prompt_cache_key, opt_.prompt_cache_disk_bytes,
                                         warn);
  // Newest first from the store; inserted oldest first, so the newest are the most recently used.
  std::vector<std::pair<std::vector<int32_t>, std::unique_ptr<KvCache>>> got;
  size_t bytes = 0;
  store_->load(opt_.prefix_cache_bytes, [&](std::vector<int32_t> tokens, std::vector<uint8_t> state) {
    auto cache = cache_from_state(tokens.size(), state);
    if (!cache) {
      warn("an entry of " + std::to_string(tokens.size()) + " tokens does not fit this model: " + cache.message());
      return true;
    }
    bytes += cache.value()->bytes();
    got.emplace_back(std::move(tokens), std::move(cache).value());
    return true;
  });
  for (auto it = got.rbegin(); it != got.rend(); ++it) prefix_.insert(std::move(it->first), std::move(it->second));
  std::fprintf(stderr, "[gemma4] prompt cache: %zu of %zu entries on disk read back (%.1f MiB) from %s\n", got.size(),
               store_->entries(), double(bytes) / double(1 << 20), opt_.prompt_cache_dir.c_str());
}

Engine::~Engine() {
  shutdown(false);
  for (auto& s : slots_) model_.backend().free(s->hidden);
  model_.set_decode_padding(false);
  if (pool_) model_.set_kv_pool(nullptr);  // caches made after the engine get their own buffers
}

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
  {
    const int img = model_.config().image_token;
    const size_t k = size_t(std::count(spec.prompt.begin(), spec.prompt.end(), img));
    if (k * size_t(model_.config().hidden) != spec.soft.size())
      return err(k && spec.soft.empty() ? "the prompt has %zu image tokens but no image was given"
                                        : "the prompt has %zu image tokens but the image features hold %zu",
                 k, spec.soft.size() / size_t(model_.config().hidden));
  }
  Status sv = validate(spec.sampling, V);
  if (!sv) return Error{sv.message()};
  if (pool_) {
    const auto need = pool_need(spec);
    for (int g = 0; g < KvPool::kGroups; ++g)
      if (need[size_t(g)] > pool_->total_blocks(KvPool::Group(g)))
        return err("prompt (%zu tokens) + max_tokens (%d) needs %lld KV blocks of %d positions; the KV pool holds "
                   "%lld (serve --kv-pool-mb)", spec.prompt.size(), spec.max_tokens, (long long)need[size_t(g)],
                   pool_->block(), (long long)pool_->total_blocks(KvPool::Group(g)));
  }
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

Status Engine::run_exclusive(const std::function<void()>& fn) {
  auto done = std::make_shared<std::promise<void>>();
  auto fut = done->get_future();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) return err("engine is shutting down");
    tasks_.push_back([&fn, done] {
      fn();
      done->set_value();
    });
    cv_.notify_all();
  }
  fut.wait();
  return Status::ok();
}

Result<std::pair<std::vector<int32_t>, std::vector<uint8_t>>> Engine::export_prefix(const std::vector<int32_t>& tokens,
                                                                                    size_t* matched) {
  std::pair<std::vector<int32_t>, std::vector<uint8_t>> out;
  *matched = 0;
  Status st = run_exclusive([&] {
    const PrefixCache::Match m = prefix_.longest(tokens, tokens.size());
    if (!m.cache) return;
    *matched = m.len;
    out = {*m.tokens, m.cache->save_state()};
  });
  if (!st) return st;
  return out;
}

Result<std::unique_ptr<KvCache>> Engine::cache_from_state(size_t n_tokens, const std::vector<uint8_t>& state) {
  auto cache = model_.new_cache();
  G4_TRY(cache->load_state(state.data(), state.size()));
  if (cache->size() != int(n_tokens)) return err("its KV holds %d tokens, its list %zu", cache->size(), n_tokens);
  return cache;
}

Status Engine::import_prefix(std::vector<int32_t> tokens, const std::vector<uint8_t>& state) {
  if (opt_.prefix_cache_bytes == 0) return err("the prefix cache is off");
  Status result = Status::ok();
  Status st = run_exclusive([&] {
    auto cache = cache_from_state(tokens.size(), state);
    if (!cache) {
      result = cache.status();
      return;
    }
    prefix_.insert(std::move(tokens), std::move(cache).value());
    publish_cache_stats();
  });
  return st ? result : st;
}

void Engine::request_stop(bool drain) {
  std::lock_guard<std::mutex> lk(mu_);
  stop_ = true;
  drain_ = drain;
  cv_.notify_all();
}

void Engine::shutdown(bool drain) {
  request_stop(drain);
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  EngineStats s = stats_;
  s.queued = int(queue_.size());
  return s;
}

void Engine::grammar_end(Slot& s) {
  if (s.matcher && s.matcher->terminated()) finish(s, FinishReason::Stop);
  else finish(s, FinishReason::Error, "grammar: the constrained sequence has no allowed continuation");
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
  if (r != FinishReason::Error && s.cache && s.cache->size() == int(s.fed.size()) && !s.fed.empty() &&
      req->spec.soft.empty()) {
    const uint64_t tag = adapter_tag(req->spec);
    if (store_ && tag == 0) store_->save(s.fed, s.cache->save_state());
    prefix_.insert(std::move(s.fed), std::move(s.cache), tag);
  }
  s.cache.reset();
  s.has_hidden = false;
  s.fed.clear();
  s.history.clear();
  s.sampler.reset();
  s.matcher.reset();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.requests_finished;
    --stats_.active;  // slots are engine-thread state; this counter is what other threads read
  }
  publish_cache_stats();
  req->on_event(ev);
}

Engine::Slot* Engine::prompt_sibling(const Request& r) {
  if (opt_.prefix_cache_bytes == 0 || !r.spec.soft.empty() || r.spec.prompt.size() < 2) return nullptr;
  for (auto& sp : slots_)
    if (sp->req && sp->req.get() != &r && sp->req->spec.soft.empty() && sp->req->spec.prompt == r.spec.prompt &&
        adapter_tag(sp->req->spec) == adapter_tag(r.spec))
      return sp.get();
  return nullptr;
}

int Engine::start_from_sibling(Slot& s, const Slot& sibling) {
  const int n = int(s.req->spec.prompt.size()) - 1;  // the last prompt token is computed, for its logits
  s.cache->copy_from(*sibling.cache);
  if (s.cache->truncate(n)) return n;
  s.cache->truncate(0);  // a sliding window already rolled past the prompt
  return 0;
}

void Engine::admit() {
  for (auto& sp : slots_) {
    Slot& s = *sp;
    if (s.req) continue;
    std::shared_ptr<Request> r;
    Slot* sibling = nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (queue_.empty()) return;
      r = queue_.front();
      sibling = prompt_sibling(*r);
      // The same prompt is being prefilled in another slot: wait for that prefill and share it
      // (the queue waits behind it for that long).
      if (sibling && sibling->consumed < int(sibling->req->spec.prompt.size())) return;
      // A KV pool without room for what the request may need: it waits until sequences finish.
      if (pool_ && !pool_room(pool_need(r->spec))) return;
      queue_.pop_front();
      ++stats_.active;
    }
    s.req = r;
    if (pool_) s.kv_need = pool_need(r->spec);
    s.cache = model_.new_cache();
    s.sampler = std::make_unique<Sampler>(r->spec.sampling, model_.config().vocab);
    if (r->spec.grammar) s.matcher = std::make_unique<GrammarMatcher>(r->spec.grammar, r->spec.stop_ids);
    s.cached = sibling ? start_from_sibling(s, *sibling) : 0;
    if (s.cached == 0 && r->spec.soft.empty()) s.cached = prefix_.lookup(r->spec.prompt, *s.cache, adapter_tag(r->spec));
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
  if (!cancels.empty()) drain_ahead(cancels);  // a queued step's tokens, but the cancelled ones
  for (auto& sp : slots_)
    if (sp->req && std::find(cancels.begin(), cancels.end(), sp->req->id) != cancels.end())
      finish(*sp, FinishReason::Cancelled);
  admit();
  if (ahead_.queued && continue_ahead(t0)) return;

  // A backend whose rows compute as alone only up to a bound (Backend::invariant_row_limit) gets
  // prompt chunks of at most that many rows, and the step in forwards of at most that many rows
  // (row_groups), so a sequence's tokens stay those it gets alone, after a prefix-cache hit too
  // (a chunk that must hold a whole image block may run longer, alone).
  const int limit = model_.backend().invariant_row_limit();
  const int chunk = limit > 0 ? std::min(opt_.prefill_chunk, limit) : opt_.prefill_chunk;
  std::vector<Slot*> active;
  std::vector<int> prompt_left;
  std::vector<uint64_t> order;
  for (auto& sp : slots_) {
    if (!sp->req) continue;
    active.push_back(sp.get());
    prompt_left.push_back(std::max(0, int(sp->req->spec.prompt.size()) - sp->consumed));
    order.push_back(sp->req->id);
  }
  const std::vector<int> take = step_rows(prompt_left, order, chunk, opt_.step_tokens);
  std::vector<SeqInput> batch;
  std::vector<Slot*> in_batch;
  for (size_t k = 0; k < active.size(); ++k) {
    if (take[k] == 0) continue;  // a prompt waiting for room in a later step
    Slot& s = *active[k];
    const auto& prompt = s.req->spec.prompt;
    SeqInput in;
    in.cache = s.cache.get();
    in.adapter = lora_of(s.req->spec);
    if (s.consumed < int(prompt.size())) {
      // A chunk never splits an image block (it may then run past the budget).
      in.n = image_block_chunk_end(model_.config(), prompt.data(), int(prompt.size()), s.consumed + take[k]) -
             s.consumed;
      in.tokens = prompt.data() + s.consumed;
      if (!s.req->spec.soft.empty()) {  // the features of this chunk's image tokens come next
        const auto before = std::count(prompt.begin(), prompt.begin() + s.consumed, model_.config().image_token);
        in.soft = s.req->spec.soft.data() + size_t(before) * size_t(model_.config().hidden);
      }
    } else {
      in.n = 1;
      in.tokens = &s.pending;
    }
    batch.push_back(in);
    in_batch.push_back(&s);
  }
  fit_pool(batch, in_batch);
  if (batch.empty()) return;
  Drafter* dr = model_.drafter();
  bool all_decoding = dr != nullptr;  // with a drafter: every active sequence past its prompt
  for (size_t i = 0; i < in_batch.size() && all_decoding; ++i)
    all_decoding = in_batch[i]->consumed >= int(in_batch[i]->req->spec.prompt.size()) && in_batch[i]->has_hidden &&
                   !needs_host_logits(in_batch[i]->req->spec) && !in_batch[i]->req->spec.grammar;
  std::vector<int> rows;
  for (size_t i = 0; i < batch.size(); ++i) rows.push_back(all_decoding ? 1 + dr->draft_tokens() : batch[i].n);
  const std::vector<std::vector<size_t>> groups = row_groups(rows, limit);
  if (groups.size() == 1 && ahead_ok(batch, in_batch)) {  // engine_ahead.cpp
    start_ahead(batch, in_batch, t0);
    return;
  }
  clk::time_point tg = t0;  // each forward's step time from where the one before it ended
  for (const std::vector<size_t>& g : groups) {
    std::vector<SeqInput> sub_batch;
    std::vector<Slot*> sub_slots;
    for (size_t i : g) {
      sub_batch.push_back(batch[i]);
      sub_slots.push_back(in_batch[i]);
    }
    if (all_decoding) speculative_step(sub_slots, tg);
    else forward_and_emit(sub_batch, sub_slots, tg);
    tg = clk::now();
  }
}

std::vector<int> Engine::step_rows(const std::vector<int>& prompt_left, const std::vector<uint64_t>& order,
                                   int chunk, int budget) {
  std::vector<int> rows(prompt_left.size(), 0);
  int used = 0;
  std::vector<size_t> prompts;
  for (size_t i = 0; i < prompt_left.size(); ++i) {
    if (prompt_left[i] > 0) {
      prompts.push_back(i);
    } else {
      rows[i] = 1;
      ++used;
    }
  }
  std::stable_sort(prompts.begin(), prompts.end(), [&](size_t a, size_t b) { return order[a] < order[b]; });
  for (size_t j = 0; j < prompts.size(); ++j) {
    const size_t i = prompts[j];
    int n = std::min(chunk, prompt_left[i]);
    if (budget > 0 && j > 0) n = std::min(n, budget - used);
    if (n <= 0) break;
    rows[i] = n;
    used += n;
  }
  return rows;
}

std::vector<std::vector<size_t>> Engine::row_groups(const std::vector<int>& rows, int limit) {
  std::vector<std::vector<size_t>> groups(1);
  int in_group = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (limit > 0 && !groups.back().empty() && in_group + rows[i] > limit) {
      groups.emplace_back();
      in_group = 0;
    }
    groups.back().push_back(i);
    in_group += rows[i];
  }
  return groups;
}

void Engine::forward_and_emit(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch,
                              clk::time_point t0) {
  const SampleMode mode = sample_mode(in_batch);
  const TokenMasks* masks = mode.kind == SampleMode::HostLogits ? nullptr : device_masks(batch, in_batch);
  const auto tf = clk::now();
  run_forward(batch, mode, masks);
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
    if (model_.drafter()) keep_hidden(s, int(i));
    const int32_t tok = sample_row(s, mode, i);
    if (tok < 0) {
      grammar_end(s);
      continue;
    }
    emit(s, tok);
  }
  record_step(t0, tf, tf2);
}

void Engine::record_step(clk::time_point t0, clk::time_point tf, clk::time_point tf2, bool ahead) {
  const auto t1 = clk::now();
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++stats_.steps;
    stats_.ahead_steps += ahead;
    stats_.forward_seconds += std::chrono::duration<double>(tf2 - tf).count();
    stats_.step_seconds += std::chrono::duration<double>(t1 - t0).count();
  }
  publish_cache_stats();
}

void Engine::publish_cache_stats() {
  int64_t tokens = 0;
  for (const auto& s : slots_)
    if (s->req) tokens += int64_t(s->fed.size());
  const size_t bytes = prefix_.bytes(), entries = prefix_.entries();
  std::lock_guard<std::mutex> lk(mu_);
  stats_.kv_tokens = tokens;
  if (pool_) {
    const int64_t full = pool_->total_blocks(KvPool::kFull), block = pool_->block();
    stats_.kv_tokens = (full - pool_->free_blocks(KvPool::kFull)) * block;
    stats_.kv_capacity_tokens = full * block;
    stats_.kv_pool_blocks = full + pool_->total_blocks(KvPool::kSliding);
    stats_.kv_pool_free_blocks = pool_->free_blocks(KvPool::kFull) + pool_->free_blocks(KvPool::kSliding);
  }
  stats_.prefix_bytes = bytes;
  stats_.prefix_entries = entries;
}

Engine::SampleMode Engine::sample_mode(const std::vector<Slot*>& slots) const {
  // On a device backend, a batch whose every sampler is plain greedy takes the argmax there and
  // copies one id per row instead of the logits (host backends keep the sampler's own argmax of
  // the logprobs, which mlx-lm's greedy is checked against).
  const int V = model_.config().vocab;
  SampleMode m;
  for (const Slot* s : slots)
    if (needs_host_logits(s->req->spec)) return m;
  bool greedy = device_sampling_;
  for (const Slot* s : slots) greedy = greedy && plain_greedy(s->sampler->params());
  if (greedy) {
    m.kind = SampleMode::DeviceGreedy;
    return m;
  }
  // A batch whose sequences all sample under a top-k bound (or greedily) copies each row's top k
  // and log-sum-exp instead of the logits (Sampler::sample_top).
  bool topk = device_sampling_ && device_topk_enabled_;
  for (const Slot* s : slots) {
    const SamplingParams& sp = s->sampler->params();
    topk = topk && (plain_greedy(sp) || Sampler::top_k_sampleable(sp, V));
    if (Sampler::top_k_sampleable(sp, V)) m.k = std::max(m.k, sp.top_k);
  }
  m.kind = topk ? SampleMode::DeviceTopK : SampleMode::HostLogits;
  return m;
}

void Engine::run_forward(const std::vector<SeqInput>& batch, const SampleMode& mode, const TokenMasks* masks) {
  const size_t rows = size_t(Model::logit_rows(batch));
  if (mode.kind == SampleMode::DeviceGreedy) {
    greedy_ids_.resize(rows);
    model_.forward(batch, opt_.precision, nullptr, greedy_ids_.data(), nullptr, masks);
  } else if (mode.kind == SampleMode::DeviceTopK) {
    topk_vals_.resize(rows * size_t(mode.k));
    topk_ids_.resize(rows * size_t(mode.k));
    topk_lse_.resize(rows);
    Model::TopK tk{mode.k, topk_vals_.data(), topk_ids_.data(), topk_lse_.data()};
    model_.forward(batch, opt_.precision, nullptr, nullptr, &tk, masks);
  } else {
    logits_.resize(std::max(logits_.size(), rows * size_t(model_.config().vocab)));
    model_.forward(batch, opt_.precision, logits_.data());
  }
}

int32_t Engine::sample_row(Slot& s, const SampleMode& mode, size_t row) {
  int32_t tok;
  if (mode.kind != SampleMode::HostLogits && s.matcher && std::exchange(s.mask_refused, false)) return -1;
  if (mode.kind == SampleMode::DeviceGreedy) {
    tok = greedy_ids_[row];
  } else if (mode.kind == SampleMode::DeviceTopK) {
    const int K = mode.k;
    const float* v = topk_vals_.data() + row * size_t(K);
    const int32_t* ids = topk_ids_.data() + row * size_t(K);
    if (plain_greedy(s.sampler->params())) {  // the largest value, lowest id among ties
      int best = 0;
      for (int j = 1; j < K; ++j)
        if (v[j] > v[best] || (v[j] == v[best] && ids[j] < ids[best])) best = j;
      tok = ids[best];
    } else {
      tok = s.sampler->sample_top(v, ids, K, topk_lse_[row]);
    }
  } else {
    const int V = model_.config().vocab;
    float* lp = logits_.data() + row * size_t(V);
    double mask_s = 0;
    if (s.matcher) {
      const auto tg = clk::now();
      if (!s.matcher->mask(lp, V)) return -1;
      mask_s = std::chrono::duration<double>(clk::now() - tg).count();
    }
    tok = s.sampler->sample(lp, s.history);  // leaves the processed logprobs in lp
    if (s.matcher && !grammar_accept(s, tok, mask_s)) return -1;
    if (s.req->spec.logprobs >= 0) {
      s.logprob = lp[tok];
      s.top = top_logprobs(lp, V, std::min(s.req->spec.logprobs, kMaxTopLogprobs));
    }
  }
  // Sampled where the logits are, under the mask device_masks gave (its time counted there).
  if (mode.kind != SampleMode::HostLogits && s.matcher && !grammar_accept(s, tok, 0)) return -1;
  s.history.push_back(tok);
  return tok;
}

bool Engine::emit(Slot& s, int32_t tok) {
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
  ev.prompt_tokens = int(s.req->spec.prompt.size());
  ev.cached_tokens = s.cached;
  ev.completion_tokens = s.generated;
  if (s.req->spec.logprobs >= 0) {
    ev.logprob = s.logprob;
    ev.top = std::move(s.top);
  }
  s.req->on_event(ev);
  if (is_stop) {
    finish(s, FinishReason::Stop);
  } else if (at_limit) {
    finish(s, FinishReason::Length);
  }
  return is_stop || at_limit;
}

void Engine::keep_hidden(Slot& s, int row) {
  const int d = model_.config().hidden;
  if (!s.hidden) s.hidden = model_.backend().alloc_act(size_t(d));
  model_.backend().copy(model_.normed_rows().at(int64_t(row) * d), size_t(d), s.hidden);
  s.has_hidden = true;
}

void Engine::speculative_step(const std::vector<Slot*>& slots, clk::time_point t0) {
  // One round for every decoding sequence (mlx-vlm _mtp_rounds, HF assisted generation): the
  // drafter proposes up to draft_tokens tokens after each pending one; the target runs every
  // sequence's pending token and drafts in one batched forward with logits for every row; row j's
  // token is sampled exactly as a plain decode step would sample it (same sampler, same RNG
  // draws, in order), and a sequence's round stops at the first row whose token differs from the
  // draft that follows it. Every emitted token is the target's own, so the output is the one
  // decoding without a drafter gives (with row-exact kernels: --batch-invariant on); the KV of
  // rejected drafts is dropped.
  Drafter& dr = *model_.drafter();
  struct Round {
    std::vector<int32_t> tokens;  // the pending token, then the drafts
    int n0 = 0;                   // cache size before the round
    int row0 = 0;                 // first logit row
  };
  std::vector<Round> rounds(slots.size());
  std::vector<SeqInput> batch;
  int rows = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = *slots[i];
    Round& r = rounds[i];
    const int budget = s.req->spec.max_tokens - s.generated;  // tokens this request may still emit
    const int n_draft = std::max(0, std::min(dr.draft_tokens(), budget - 1));
    r.tokens.assign(size_t(1 + n_draft), s.pending);
    if (n_draft > 0) dr.draft(*s.cache, s.hidden, s.pending, n_draft, opt_.precision, r.tokens.data() + 1);
    r.n0 = s.cache->size();
    r.row0 = rows;
    rows += 1 + n_draft;
  }
  for (size_t i = 0; i < slots.size(); ++i) {
    batch.push_back(SeqInput{slots[i]->cache.get(), rounds[i].tokens.data(), int(rounds[i].tokens.size()), true});
    batch.back().adapter = lora_of(slots[i]->req->spec);
  }
  const SampleMode mode = sample_mode(slots);
  const auto tf = clk::now();
  run_forward(batch, mode);
  const auto tf2 = clk::now();
  for (size_t i = 0; i < slots.size(); ++i) {
    Slot& s = *slots[i];
    const Round& r = rounds[i];
    const int n_draft = int(r.tokens.size()) - 1;
    // Accept while the target's token equals the next draft (and is not a stop token).
    std::vector<int32_t> out;
    const auto& stops = s.req->spec.stop_ids;
    for (int j = 0; j <= n_draft; ++j) {
      const int32_t tok = sample_row(s, mode, size_t(r.row0 + j));
      out.push_back(tok);
      if (j == n_draft || tok != r.tokens[size_t(j + 1)] || std::find(stops.begin(), stops.end(), tok) != stops.end())
        break;
    }
    const int kept = int(out.size());  // the pending token and the accepted drafts have valid KV
    if (!s.cache->truncate(r.n0 + kept)) {  // reserve() keeps the window: cannot fail
      finish(s, FinishReason::Error, "internal error: KV cache rollback failed");
      continue;
    }
    s.fed.insert(s.fed.end(), r.tokens.begin(), r.tokens.begin() + kept);
    keep_hidden(s, r.row0 + kept - 1);
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++stats_.draft_rounds;
      stats_.drafted_tokens += uint64_t(n_draft);
      stats_.accepted_tokens += uint64_t(kept - 1);
    }
    for (int32_t tok : out)
      if (emit(s, tok)) break;
  }
  record_step(t0, tf, tf2);
}

void Engine::loop() {
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto idle = [&] {
        bool active = false;
        for (auto& s : slots_) active |= bool(s->req);
        return !active && queue_.empty() && cancels_.empty() && tasks_.empty();
      };
      cv_.wait(lk, [&] { return stop_ || !idle(); });
      if (stop_ && (!drain_ || idle())) break;
    }
    bool tasks = false;
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks = !tasks_.empty();
    }
    if (tasks) drain_ahead();  // a task may use the backend or the caches: nothing queued beside it
    for (;;) {  // run_exclusive work first, between steps
      std::function<void()> task;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (tasks_.empty()) break;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
    step();
  }
  std::vector<uint64_t> running;  // a queued step's tokens are dropped: the requests are cancelled
  for (auto& sp : slots_)
    if (sp->req) running.push_back(sp->req->id);
  drain_ahead(running);
  for (auto& t : tasks_) t();  // whoever waits in run_exclusive is released
  tasks_.clear();
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
