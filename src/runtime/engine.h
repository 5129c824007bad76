// The engine: one thread owns the model, the KV caches and the batch (continuous batching).
// Callers (CLI, HTTP handlers) submit token-level generation requests from any thread and receive
// token events through a callback that runs ON THE ENGINE THREAD (it must be quick: queue the
// event and return). Every step runs ONE batched forward pass over all active sequences: prompt
// chunks of sequences still prefilling and single tokens of decoding ones. New requests join
// between steps, finished or cancelled ones leave. Text (detokenizing, stop strings, tool calls)
// is the caller's business; a caller that sees a stop string calls cancel().
// With a drafter on the model (model/drafter.h), steps in which every active sequence is decoding
// are speculative rounds instead: each sequence's drafts are verified in one batched forward.
#pragma once
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "grammar/grammar.h"
#include "model/model.h"
#include "runtime/adapter_set.h"
#include "runtime/prefix_cache.h"
#include "runtime/prompt_store.h"
#include "sampling/sampler.h"

namespace g4 {

struct GenerationSpec {
  std::vector<int32_t> prompt;     // must be non-empty
  SamplingParams sampling;
  int max_tokens = 256;            // generated tokens, stop token included
  std::vector<int32_t> stop_ids;   // generation ends when one is sampled (it is reported)
  // Image features for the prompt's image tokens (Model config().image_token), host
  // [k, hidden] in prompt order (vision/vision_encoder.h). Such prompts bypass the prefix cache
  // (its key is the token ids alone).
  std::vector<float> soft;
  // >= 0: every generated token's log-probability is reported (TokenEvent::logprob), with this many
  // of the most likely alternatives (TokenEvent::top, at most kMaxTopLogprobs): the model's
  // distribution after the logits processors and the log-softmax, before temperature and the
  // filters (mlx-lm's `logprobs`). Such sequences sample from host logits (no device argmax),
  // and take no speculative rounds.
  int logprobs = -1;
  // Constrained decoding (grammar/grammar.h): every generated token is one the grammar allows, and
  // once it is complete only stop_ids may follow. Sampled where the logits are, the mask is applied
  // there (Engine::device_masks); such sequences take no speculative rounds.
  std::shared_ptr<const CompiledGrammar> grammar;
  // A LoRA adapter mounted over the model (runtime/adapter_set.h) for this request's rows, or null:
  // the model's own (Model::set_adapter). Its KV is cached apart from other adapters' (its mount's
  // serial tags the prefix cache's entries) and is not written to the prompt cache on disk.
  std::shared_ptr<const MountedAdapter> adapter;
};
constexpr int kMaxTopLogprobs = 20;

enum class FinishReason { None, Stop, Length, Cancelled, Error };
const char* finish_reason_name(FinishReason r);

struct TokenEvent {
  int32_t token = -1;   // the sampled token, or -1 for a finish-only event
  bool done = false;    // last event of the request
  FinishReason reason = FinishReason::None;
  int prompt_tokens = 0;
  int cached_tokens = 0;      // prompt tokens whose KV came from the prefix cache
  int completion_tokens = 0;  // tokens generated so far (this one included)
  std::string error;
  float logprob = 0.f;                       // the token's (GenerationSpec::logprobs >= 0)
  std::vector<std::pair<int, float>> top;    // the most likely alternatives, descending
};
using EventFn = std::function<void(const TokenEvent&)>;

struct EngineOptions {
  int parallel = 4;                 // sequences decoded together
  int max_queue = 64;               // waiting requests beyond the slots; more are refused
  int max_context = 8192;           // prompt + max_tokens limit per sequence
  int prefill_chunk = 256;          // prompt tokens per sequence per step
  // Rows one step feeds at most (llama.cpp's n_batch, vLLM's max_num_batched_tokens): every
  // decoding sequence's token first, then prompt chunks, the oldest request's first, so decoding
  // streams keep their pace while long prompts are prefilled beside them. The oldest prompt
  // always gets a chunk (prompts progress when decode rows alone fill the budget). 0: no bound.
  int step_tokens = 2048;
  ActPrecision precision = ActPrecision::F32;
  size_t prefix_cache_bytes = size_t(256) << 20;  // 0 disables the prompt-prefix cache
  // Prompt caches on disk (runtime/prompt_store.h), with the prefix cache on: entries under
  // prompt_cache_key are read back at start (within prefix_cache_bytes) and every entry the prefix
  // cache takes is written, at most prompt_cache_disk_bytes of them. Empty dir: none.
  std::string prompt_cache_dir;
  std::string prompt_cache_key;  // the model and the options its KV's values depend on
  size_t prompt_cache_disk_bytes = size_t(8) << 30;
  // > 0: the sequences' KV lives in one pool of this many bytes (model/kv_pool.h, paged as vLLM
  // keeps it) instead of a buffer per sequence: a request is admitted when the pool's free blocks
  // hold what it can need at most (prompt + max_tokens; the sliding layers' window), prefix-cache
  // hits share blocks, and requests past the queue bound are refused. Unquantized KV only.
  size_t kv_pool_bytes = 0;
  int kv_block = 32;  // positions per pool block (a power of two)
  // Decode steps of more than 8 sequences padded to row buckets (Model::set_decode_padding), so
  // that a step replays a recorded graph when the number of streams changes: set where steps run
  // as graphs (cuda, not batch-invariant).
  bool decode_buckets = false;
  // Decode steps queued a step ahead of the host's reads (runtime/engine_ahead.cpp): while every
  // running sequence decodes one token a step, sampled where the logits are (argmax, or a top-k
  // draw: Backend::draw_top), each step is queued before the tokens of the one before it are read,
  // so the host's work (recording, launching, emitting tokens) overlaps the device's. The tokens
  // are those of plain steps. Device: on device backends; Always: on host backends too (tests).
  enum class DecodeAhead { Off, Device, Always };
  DecodeAhead decode_ahead = DecodeAhead::Device;
  // Told of every prefix-cache entry that comes and goes (runtime/kv_events.h: KV events for a
  // cache-aware router), from the start on (entries read back from prompt_cache_dir included).
  std::shared_ptr<PrefixCacheListener> prefix_listener;
};

struct EngineStats {
  uint64_t requests_total = 0, requests_finished = 0, requests_rejected = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  uint64_t steps = 0;
  uint64_t ahead_steps = 0;  // of them, queued before the step before them was read (decode_ahead)
  // Speculative decoding (a drafter on the model): rounds run, tokens drafted, drafts accepted.
  uint64_t draft_rounds = 0, drafted_tokens = 0, accepted_tokens = 0;
  double forward_seconds = 0, step_seconds = 0;  // step = forward + scheduling + sampling
  // Constrained decoding: time spent filling and applying grammar masks and advancing matchers,
  // and the tokens it constrained (the mask's cost per token against a step's).
  double grammar_seconds = 0;
  uint64_t grammar_tokens = 0;
  int active = 0, queued = 0;
  // KV held for running sequences (tokens in their caches) against what the slots may hold
  // (parallel x max_context): the KV-cache utilization a gateway routes by. The prompt-prefix
  // cache's KV (evictable, reused by later prompts) is counted apart.
  int64_t kv_tokens = 0, kv_capacity_tokens = 0;
  // A KV pool (EngineOptions::kv_pool_bytes): its blocks and the free ones (both groups); then
  // kv_tokens / kv_capacity_tokens count the full-attention group's blocks in use / all, in tokens.
  int64_t kv_pool_blocks = 0, kv_pool_free_blocks = 0;
  size_t prefix_bytes = 0, prefix_capacity_bytes = 0, prefix_entries = 0;
};

class Engine {
 public:
  Engine(Model& model, EngineOptions opt);
  ~Engine();  // shutdown(false)

  const EngineOptions& options() const { return opt_; }
  Model& model() { return model_; }

  // Queues a request. Errors (as one line): empty prompt, token ids out of range, prompt +
  // max_tokens over max_context, queue full (message starts with "queue full").
  Result<uint64_t> submit(GenerationSpec spec, EventFn on_event);
  // Cancels a queued or running request; its final event has reason Cancelled. Safe to call
  // from any thread, also from inside the event callback, and for finished ids (no-op).
  void cancel(uint64_t id);
  // Runs fn on the engine thread between two steps and returns when it has run (work that uses
  // the model's backend, such as encoding images, must not run beside a step). Error when the
  // engine is shutting down.
  Status run_exclusive(const std::function<void()>& fn);
  // Explicit saves of a conversation's KV (POST /slots/save and /slots/restore): the prefix cache's
  // entry sharing the longest prefix with `tokens` (its tokens and KvCache::save_state; *matched:
  // the shared length, 0 and nothing when none), and an entry put into the prefix cache from such
  // a state (refused when the state does not fit this model and options). On the engine thread.
  Result<std::pair<std::vector<int32_t>, std::vector<uint8_t>>> export_prefix(const std::vector<int32_t>& tokens,
                                                                             size_t* matched);
  Status import_prefix(std::vector<int32_t> tokens, const std::vector<uint8_t>& state);
  // Stops the engine thread. drain=true lets running and queued requests finish first.
  void shutdown(bool drain);
  // The same without waiting: new requests are refused from now on; request_stop(false) after
  // request_stop(true) cancels what is still running (a drain's deadline).
  void request_stop(bool drain);
  EngineStats stats() const;

  // The rows each sequence feeds in one step (EngineOptions::step_tokens): prompt_left[i] is
  // sequence i's prompt tokens still to feed (0: it is decoding, one row), order[i] its request's
  // arrival (older first). Decoding sequences get 1; prompts up to `chunk` rows each, oldest
  // first, while the step stays within `budget` rows (0: no bound), the last one cut to fit;
  // the oldest prompt gets its chunk whatever the budget. 0: not in this step.
  static std::vector<int> step_rows(const std::vector<int>& prompt_left, const std::vector<uint64_t>& order,
                                    int chunk, int budget);
  // The forwards a step's sequences (rows[i] rows each) run in: consecutive sequences in groups of
  // at most `limit` rows (a sequence of more rows alone); one group when limit is 0.
  static std::vector<std::vector<size_t>> row_groups(const std::vector<int>& rows, int limit);

 private:
  struct Request;
  struct Slot;
  using clk = std::chrono::steady_clock;
  // How a step's tokens are sampled: argmax on the device, from the device's top k, or from the
  // logits copied to the host.
  struct SampleMode {
    enum Kind { DeviceGreedy, DeviceTopK, HostLogits } kind = HostLogits;
    int k = 1;  // DeviceTopK: candidates per row
  };
  void loop();
  // Takes queued requests into free slots. A request whose prompt another slot holds (n choices
  // of one request, or one prompt from several clients) starts from that slot's KV once its
  // prefill is done, computing only the last prompt token (with the prefix cache on).
  void admit();
  // A busy slot with r's prompt (no images), or null; start_from_sibling copies its prompt KV
  // into s's cache and returns the tokens reused.
  Slot* prompt_sibling(const Request& r);
  int start_from_sibling(Slot& s, const Slot& sibling);
  // One step: every decoding sequence's next token and the prompt chunks step_rows gives room to,
  // in one forward (or several: row_groups), then each sequence's sampled token emitted.
  void step();
  // One forward of `batch` (the sequences of in_batch), then each sequence's token sampled and
  // emitted (a prefill chunk that ends short of its prompt emits nothing).
  void forward_and_emit(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch, clk::time_point t0);
  // With a drafter on the model and every active sequence decoding: one draft-and-verify round
  // for each, verified in one batched forward.
  void speculative_step(const std::vector<Slot*>& slots, clk::time_point t0);
  SampleMode sample_mode(const std::vector<Slot*>& slots) const;
  // Model::forward for `batch`, its outputs into the buffers `mode` reads (masks: Model::forward's).
  void run_forward(const std::vector<SeqInput>& batch, const SampleMode& mode, const TokenMasks* masks = nullptr);
  // Constrained sequences sampled where the logits are (engine_grammar.cpp): the allowed-token
  // masks of this forward's constrained logit rows (valid until the next call), or null when no
  // sequence samples under a grammar in it; a matcher that gives no mask leaves its row open and
  // marks the slot (Slot::mask_refused), which ends after the step. grammar_accept advances s's
  // matcher past the token it sampled (false: refused), counting the time.
  const TokenMasks* device_masks(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch);
  bool grammar_accept(Slot& s, int32_t tok, double mask_seconds);
  // The token of logit row `row` for s (appended to its history); -1 when s's grammar gives no
  // token (the caller ends s: grammar_end).
  int32_t sample_row(Slot& s, const SampleMode& mode, size_t row);
  // Ends s after its grammar gave no token: a stop, when the grammar had already accepted its stop
  // token (nothing may follow); an error when it refused the sampled token.
  void grammar_end(Slot& s);
  // Reports `tok` as s's next token; finishes s at a stop token or its max_tokens (returns true).
  bool emit(Slot& s, int32_t tok);
  // Copies logit row `row`'s final-normed hidden state into s.hidden (the drafter's input).
  void keep_hidden(Slot& s, int row);
  void record_step(clk::time_point t0, clk::time_point tf, clk::time_point tf2, bool ahead = false);
  // Steps queued ahead (engine_ahead.cpp; EngineOptions::decode_ahead). ahead_ok: whether this
  // step's batch (one forward) may be queued: every sequence decodes its pending token, sampled
  // where the logits are without a grammar, no drafter, the model can queue forwards.
  // start_ahead queues it (the tokens it feeds are recorded as fed; none is emitted yet).
  // continue_ahead, with a step queued: when the same sequences go on, queues the next step (its
  // tokens the queued step's, on the device) before it reads and emits the queued step's tokens
  // (true: this engine step is done); else drains (false: the caller runs a plain step).
  // drain_ahead reads the queued step's tokens and emits them, but for the requests in `skip`
  // (cancelled: their tokens are dropped).
  bool ahead_ok(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch) const;
  void start_ahead(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch, clk::time_point t0);
  bool continue_ahead(clk::time_point t0);
  void drain_ahead(const std::vector<uint64_t>& skip = {});
  // The queued step's draw parameters for its rows (taking each sampling row's next random bits),
  // or false for argmax rows only.
  bool ahead_draws(const std::vector<Slot*>& rows, Model::QueuedDraw* draw);
  // Whether the pool has a block for each sequence's next `batch` rows (evicting prefix-cache
  // entries for it), without changing the batch.
  bool pool_fits(const std::vector<SeqInput>& batch, const std::vector<Slot*>& in_batch);
  // Copies the slots' and the prefix cache's occupancy (engine-thread state) into stats_.
  void publish_cache_stats();
  void finish(Slot& s, FinishReason r, const std::string& error = "");
  // Opens opt_.prompt_cache_dir and puts its entries into the prefix cache (the constructor).
  void open_prompt_store();
  // A cache of this model filled from `state` (KvCache::save_state) that holds exactly n_tokens, or
  // why not.
  Result<std::unique_ptr<KvCache>> cache_from_state(size_t n_tokens, const std::vector<uint8_t>& state);
  // The KV pool (engine_pool.cpp): the blocks a request can need at most at once, per group;
  // whether the pool has room for `need` beside what the running sequences may still take
  // (evicting prefix-cache entries for it); and a step's batch cut to what the pool can hold now
  // (prompt chunks of the youngest requests wait; decoding sequences that cannot go on end with an
  // error, which admission makes rare).
  void open_pool();
  std::array<int64_t, KvPool::kGroups> pool_need(const GenerationSpec& spec) const;
  bool pool_room(const std::array<int64_t, KvPool::kGroups>& need);
  void fit_pool(std::vector<SeqInput>& batch, std::vector<Slot*>& in_batch);

  Model& model_;
  EngineOptions opt_;
  std::shared_ptr<KvPool> pool_;  // EngineOptions::kv_pool_bytes's pool, or null
  PrefixCache prefix_;
  std::unique_ptr<PromptStore> store_;  // opt_.prompt_cache_dir's entries, or null
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<uint64_t> cancels_;
  std::deque<std::function<void()>> tasks_;  // run_exclusive's work, run by the engine thread
  uint64_t next_id_ = 1;
  bool stop_ = false, drain_ = false;
  EngineStats stats_;
  std::vector<float> logits_;
  std::vector<int32_t> greedy_ids_;  // argmax ids of a batch sampled on the device (plain greedy)
  std::vector<float> topk_vals_, topk_lse_;  // a device top-k batch's candidates (Model::TopK)
  std::vector<int32_t> topk_ids_;
  bool device_topk_enabled_ = true;  // G4_DEVICE_TOPK=0 turns the top-k path off
  // Sampling where the logits are (argmax, top k, grammar masks): on device backends, and on the
  // host ones with G4_DEVICE_SAMPLING=1 (tests of that path without a GPU).
  bool device_sampling_ = false;
  // The step queued ahead: its read slot, its sequences in row order, and their requests' ids
  // (a row whose request has since ended is dead: its token is dropped).
  struct Ahead {
    bool queued = false;
    int slot = 0;
    std::vector<Slot*> rows;
    std::vector<uint64_t> ids;
    std::vector<int32_t> tokens;
  } ahead_;
  // Whether the backend's draw_top was checked against the host's (engine_ahead.cpp): 0 not yet,
  // 1 agrees, -1 disagrees (sampled steps are then not queued ahead). Set on the engine thread.
  mutable int draw_checked_ = 0;
  std::vector<uint32_t> allow_;      // device_masks' masks, one a constrained row
  std::vector<int32_t> mask_rows_;   // and the logit row of each
  TokenMasks masks_;
  std::thread thread_;
};

}  // namespace g4
