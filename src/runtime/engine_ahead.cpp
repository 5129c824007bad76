// The engine's decode steps queued a step ahead of the host's reads (EngineOptions::decode_ahead).
//
// A plain step waits for its tokens, emits them, and only then builds and launches the next step,
// so on a device the host's work for every step leaves the device idle. While every running
// sequence decodes, samples where the logits are (argmax or a top-k draw) and nothing else joins,
// the engine instead queues step t + 1, whose input tokens are step t's, still on the device
// (SeqInput::token_on_device), before it reads step t's tokens (Model::forward_queued; two read
// slots alternate). A sampling row's random bits are taken from its sampler when its step is
// queued, in the order plain steps take them, and the draw is sampling/top_draw.h's: the tokens
// are those of plain steps.
//
// Bookkeeping: a queued step's input token is in its sequence's `fed` and cache as soon as it is
// queued (the cache advances at once). When the token read for a sequence ends it (a stop token),
// the step already queued behind it fed that token: the cache takes it back (KvCache::truncate)
// before the sequence finishes, and that row of the queued step is dead (its token is dropped).
// Anything that changes the batch (a new sequence, a cancel, a dead row, a row at its token limit,
// a task) drains the pipeline: the queued step's tokens are read and emitted as a plain step's
// would be, and the next step is a plain one.
#include <algorithm>
#include <cstdio>

#include "backend/draw_top_arrays.h"
#include "runtime/engine.h"
#include "runtime/engine_slot.h"

namespace g4 {
namespace {

// Whether be's draw_top gives sampling/top_draw.h's tokens on a fixed set of rows (every filter,
// ties, greedy rows): checked once per engine on a device backend before its sampled steps are
// queued ahead, since those steps' tokens are then the device's draws. A kernel that disagrees
// (beyond the rounding its contract allows, which these rows stay clear of) leaves the sampled
// steps to the host, a step at a time.
bool device_draw_agrees(Backend& be) {
  constexpr int kRows = 8, kK = 64;
  std::vector<float> vals(size_t(kRows) * kK), lse(kRows), fp(size_t(kRows) * kTopDrawFields);
  std::vector<int32_t> ids(vals.size()), ip(fp.size()), want(kRows);
  uint32_t st = 12345;
  auto next = [&st] { return st = st * 1664525u + 1013904223u; };
  TopCandidates cand;
  for (int r = 0; r < kRows; ++r) {
    for (int j = 0; j < kK; ++j) {
      vals[size_t(r * kK + j)] = j < 3 && r % 3 == 0 ? 2.f : float(next() >> 8) * 0x1.0p-24f * 6.f - 3.f;
      ids[size_t(r * kK + j)] = int32_t((next() >> 8) % 1000) * kK + j;  // distinct
    }
    lse[size_t(r)] = 4.5f;
    TopDraw d;
    d.temperature = r == 7 ? 0.f : 0.6f + 0.2f * float(r);
    d.top_k = 8 + 8 * r;
    d.top_p = r % 2 ? 0.8f : 1.f;
    if (r % 3 == 1) {
      d.min_keep = 2;
      d.min_p_log = -2.f;
    }
    d.bits = (uint64_t(next()) << 21) ^ next();
    pack_top_draw(d, fp.data() + size_t(r) * kTopDrawFields, ip.data() + size_t(r) * kTopDrawFields);
    want[size_t(r)] = draw_top(vals.data() + size_t(r) * kK, ids.data() + size_t(r) * kK, kK, lse[size_t(r)], d, &cand);
  }
  return draw_top_arrays(be, vals, ids, lse, kK, fp, ip) == want;
}

}  // namespace

bool Engine::ahead_ok(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch) const {
  using DA = EngineOptions::DecodeAhead;
  if (opt_.decode_ahead == DA::Off || (opt_.decode_ahead == DA::Device && !model_.backend().on_device())) return false;
  if (!device_sampling_ || model_.drafter() || !model_.can_queue_forwards() || batch.empty() ||
      batch.size() * sizeof(int32_t) > Backend::kQueuedReadBytes)
    return false;
  for (size_t i = 0; i < batch.size(); ++i) {
    const Slot& s = *in_batch[i];
    if (batch[i].n != 1 || batch[i].soft || batch[i].all_logits || batch[i].tokens != &s.pending ||
        s.consumed < int(s.req->spec.prompt.size()) || s.matcher)
      return false;
  }
  const SampleMode m = sample_mode(in_batch);
  if (m.kind == SampleMode::DeviceGreedy) return true;
  if (m.kind != SampleMode::DeviceTopK || m.k > Sampler::kMaxTopK) return false;
  if (draw_checked_ == 0) {
    draw_checked_ = !model_.backend().on_device() || device_draw_agrees(model_.backend()) ? 1 : -1;
    if (draw_checked_ < 0)
      std::fprintf(stderr, "[gemma4] decode ahead: the device's top-k draw disagrees with the host's on its check; "
                           "sampled steps are decoded a step at a time\n");
  }
  return draw_checked_ > 0;
}

bool Engine::ahead_draws(const std::vector<Slot*>& rows, Model::QueuedDraw* draw) {
  bool any = false;
  for (const Slot* s : rows) any = any || !plain_greedy(s->sampler->params());
  if (!any) return false;  // the argmax
  draw->k = 1;
  draw->rows.clear();
  for (Slot* s : rows) {
    const SamplingParams& p = s->sampler->params();
    TopDraw d;  // greedy: the largest of the top k
    if (!plain_greedy(p)) {
      d = top_draw_params(p);
      d.bits = s->sampler->take_draw_bits();
      draw->k = std::max(draw->k, d.top_k);
    }
    draw->rows.push_back(d);
  }
  return true;
}

void Engine::start_ahead(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch, clk::time_point t0) {
  Model::QueuedDraw draw;
  const bool drawn = ahead_draws(in_batch, &draw);
  const auto tf = clk::now();
  model_.forward_queued(batch, opt_.precision, ahead_.slot, drawn ? &draw : nullptr);
  const auto tf2 = clk::now();
  ahead_.queued = true;
  ahead_.rows = in_batch;
  ahead_.ids.clear();
  for (Slot* s : in_batch) {
    s->fed.push_back(s->pending);
    ahead_.ids.push_back(s->req->id);
  }
  record_step(t0, tf, tf2, /*ahead=*/true);
}

void Engine::drain_ahead(const std::vector<uint64_t>& skip) {
  if (!ahead_.queued) return;
  const size_t n = ahead_.rows.size();
  ahead_.tokens.resize(n);
  model_.backend().take_read(ahead_.slot, n * sizeof(int32_t), ahead_.tokens.data());
  ahead_.slot ^= 1;
  ahead_.queued = false;
  for (size_t i = 0; i < n; ++i) {
    Slot& s = *ahead_.rows[i];
    if (!s.req || s.req->id != ahead_.ids[i]) continue;  // dead: ended while the step was queued
    if (std::find(skip.begin(), skip.end(), ahead_.ids[i]) != skip.end()) continue;
    s.history.push_back(ahead_.tokens[i]);
    emit(s, ahead_.tokens[i]);
  }
}

bool Engine::continue_ahead(clk::time_point t0) {
  // The same sequences, every one of them alive and short of its token limit after this token.
  std::vector<Slot*> active;
  for (auto& sp : slots_)
    if (sp->req) active.push_back(sp.get());
  bool same = active.size() == ahead_.rows.size();
  for (size_t i = 0; i < ahead_.rows.size() && same; ++i) {
    const Slot& s = *ahead_.rows[i];
    same = s.req && s.req->id == ahead_.ids[i] && s.generated + 1 < s.req->spec.max_tokens;
  }
  std::vector<SeqInput> next;
  if (same) {
    for (Slot* s : ahead_.rows) {
      SeqInput in{s->cache.get(), nullptr, 1, false};
      in.adapter = lora_of(s->req->spec);
      in.token_on_device = true;
      next.push_back(in);
    }
    // (the eligibility of the sequences' sampling holds: it is fixed per request)
    same = pool_fits(next, ahead_.rows);
  }
  if (!same) {
    drain_ahead();
    return false;
  }
  Model::QueuedDraw draw;
  const bool drawn = ahead_draws(ahead_.rows, &draw);
  const auto tf = clk::now();
  model_.forward_queued(next, opt_.precision, ahead_.slot ^ 1, drawn ? &draw : nullptr);
  const size_t n = ahead_.rows.size();
  ahead_.tokens.resize(n);
  model_.backend().take_read(ahead_.slot, n * sizeof(int32_t), ahead_.tokens.data());
  const auto tf2 = clk::now();
  ahead_.slot ^= 1;
  bool any_alive = false;
  for (size_t i = 0; i < n; ++i) {
    Slot& s = *ahead_.rows[i];
    const int32_t tok = ahead_.tokens[i];
    const auto& stops = s.req->spec.stop_ids;
    if (std::find(stops.begin(), stops.end(), tok) != stops.end()) {
      // It ends here: the step queued behind fed its stop token, which the cache takes back (a
      // cache that cannot is not kept for later prefixes: its size no longer matches `fed`).
      s.cache->truncate(s.cache->size() - 1);
      ahead_.ids[i] = 0;
    } else {
      s.fed.push_back(tok);
      any_alive = true;
    }
    s.history.push_back(tok);
    emit(s, tok);
  }
  record_step(t0, tf, tf2, /*ahead=*/true);
  if (!any_alive) drain_ahead();  // every row dead: nothing to emit, the read slot freed
  return true;
}

}  // namespace g4
