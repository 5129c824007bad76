// The Gemma text model (Gemma 4 in every variant; Gemma 3 as a configuration of the same code):
// embed -> layers (attention, dense MLP and/or MoE, per-layer inputs) -> norm -> logits.
// Mirrors mlx-lm gemma4_text.py op for op (spec §2); see forward() for the order.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/config.h"
#include "core/token_mask.h"
#include "model/kv_cache.h"
#include "model/lora.h"
#include "model/weights.h"
#include "parallel/communicator.h"
#include "sampling/top_draw.h"

namespace g4 {

class Drafter;
class ExpertTrace;

// One sequence's part of a batched forward call: `n` new tokens appended to `cache`.
struct SeqInput {
  KvCache* cache = nullptr;
  const int32_t* tokens = nullptr;
  int n = 0;
  bool all_logits = false;  // logits for every new token (scoring) or only the last one
  // Image features (host [k, hidden], k = the number of tokens equal to config().image_token
  // among these n), or null. Those rows take these vectors instead of their embedding, as they
  // are (spec §8.4: not scaled by √d), and look up the pad id's per-layer input.
  const float* soft = nullptr;
  // The LoRA adapter on this sequence's rows (model/lora.h), loaded for this model, or null: the
  // model's own (set_adapter; none without one). Sequences with different adapters share one
  // forward: each adapter's delta is added to its sequences' rows only.
  const LoraAdapter* adapter = nullptr;
  // The one new token (n == 1, tokens unused, no soft rows) is not on the host but row i of the
  // argmax the previous forward computed on the backend (i: this sequence's place in the batch;
  // the previous forward had the same rows, one logit row each, no padding). Every sequence of a
  // batch sets it, or none (Model::forward_queued).
  bool token_on_device = false;
};

class Model;

// The other ranks of a tensor-parallel group, driven by its leader (rank 0; Model::set_peers).
// parallel/tp_model.cpp implements it with a thread per peer.
class ModelPeers {
 public:
  virtual ~ModelPeers() = default;
  virtual int count() const = 0;
  virtual Model& peer(int i) = 0;
  // Starts fn(i, peer(i)) for every peer, each on its own thread; join() returns once all have
  // finished. fn must stay valid until join().
  virtual void start(const std::function<void(int, Model&)>& fn) = 0;
  virtual void join() = 0;
  // An adapter directory as the group's shards: the leader's, holding the peers' (LoraAdapter::peers).
  virtual Result<std::unique_ptr<LoraAdapter>> load_adapter(const std::string& dir, Model& leader) = 0;
};

class Model {
 public:
  Model(ModelConfig cfg, ModelWeights w, std::shared_ptr<const WeightSource> src,
        std::unique_ptr<Backend> be);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  const ModelWeights& weights() const { return w_; }
  Backend& backend() { return *be_; }
  // A new, empty cache for one sequence, with the options of set_kv_options (paged in the pool of
  // set_kv_pool when there is one).
  std::unique_ptr<KvCache> new_cache();
  // The pool new_cache's caches take their blocks from (model/kv_pool.h), or null: per-sequence
  // buffers. The serving engine sets it; caches made before keep their storage.
  void set_kv_pool(std::shared_ptr<KvPool> pool);
  const std::shared_ptr<KvPool>& kv_pool() const { return kv_pool_; }
  // Options of the caches new_cache makes from now on (quantized KV); checked first
  // (validate_kv_options), nothing changes on error.
  Status set_kv_options(const KvCacheOptions& opt);
  const KvCacheOptions& kv_options() const { return kv_opt_; }
  // A LoRA adapter applied from the next forward on (null: none); see model/lora.h.
  void set_adapter(std::unique_ptr<LoraAdapter> a);
  // Reads an mlx-lm adapter directory for this model (model/lora.h load_lora_adapter; a group's
  // leader: sharded for every rank), and gives one back (release_lora_adapter on every rank).
  Result<std::unique_ptr<LoraAdapter>> load_adapter(const std::string& dir);
  void release_adapter(LoraAdapter& a);
  const LoraAdapter* adapter() const { return lora_.get(); }
  // A drafter for speculative decoding (model/drafter.h; runtime/engine.h uses it), or null.
  void set_drafter(std::unique_ptr<Drafter> d);
  Drafter* drafter() const { return drafter_.get(); }

  // Runs one batched step. Reserves cache room, computes, and advances every cache by its n.
  // logits (host memory, or null) receives, in input order, [n, vocab] rows for all_logits inputs
  // and one [vocab] row otherwise; argmax (host, or null) the index of each such row's largest
  // logit, computed where the logits are (Backend::argmax), so greedy decoding on a device copies
  // one id per row instead of the logits.
  // topk (or null): each logit row's k largest values and ids and its log-sum-exp (Backend::top_k),
  // into host arrays vals / ids [rows, k] and lse [rows]: sampling with a top-k bound copies these
  // instead of the logits.
  struct TopK {
    int k = 0;
    float* vals = nullptr;
    int32_t* ids = nullptr;
    float* lse = nullptr;
  };
  // masks (or null): allowed-token bitmasks of some logit rows (core/token_mask.h), applied to
  // the logits where they are before argmax, top k and the copy (constrained decoding on a
  // device: Backend::mask_logits); rows without a mask stay open.
  void forward(const std::vector<SeqInput>& batch, ActPrecision P, float* logits, int32_t* argmax = nullptr,
               const TopK* topk = nullptr, const TokenMasks* masks = nullptr);

  // forward() with argmax that does not wait for the step: the argmax rows are queued for the
  // backend's read slot `slot` (Backend::queue_read; Backend::take_read(slot) waits for them), so
  // the caller can queue the next step, whose tokens are these argmax rows (SeqInput::
  // token_on_device), before it reads them. One rank, no expert trace. The caches advance at once.
  // draw (or null: the argmax): each row's token drawn where the logits are from its k largest
  // logits instead (Backend::draw_top; sampling/top_draw.h), rows[r] the parameters and random bits
  // of logit row r (one a sequence, in batch order): sampling with a top-k bound queued like greedy.
  struct QueuedDraw {
    int k = 1;
    std::vector<TopDraw> rows;
  };
  void forward_queued(const std::vector<SeqInput>& batch, ActPrecision P, int slot, const QueuedDraw* draw = nullptr);
  // Whether forward_queued may run: one rank, no expert trace.
  bool can_queue_forwards() const { return !peers_ && !trace_; }

  // After forward(): the final-normed hidden states of its logit rows (the LM head's input),
  // [logit_rows, hidden] in the same order, a backend buffer valid until the next forward.
  const Buf& normed_rows() const;
  // forward() up to the final norm: normed_rows() then holds the LM head's inputs, and no logits
  // are made (training applies the head in row chunks with its loss: train/lora_train_model.h).
  // One rank only (no peers), no padding.
  void forward_hidden(const std::vector<SeqInput>& batch, ActPrecision P);
  // Training: from the next forward on, every adapter module with dropout > 0 (LoraDelta::dropout)
  // drops elements of its input (Backend::dropout), with masks drawn from `seed` mixed with the
  // module's id; 0: off, as at inference.
  void set_lora_dropout(uint64_t seed) { lora_dropout_seed_ = seed; }
  // The files the weights are mapped from (what a second Model over the same weights keeps alive).
  const std::shared_ptr<const WeightSource>& source() const { return src_; }

  // Number of logit rows forward() writes for this batch.
  static int logit_rows(const std::vector<SeqInput>& batch);

  // Decode steps in row buckets. A device backend records a step as a graph keyed by its row
  // count (backend.h begin_step); with padding on, forward() pads a step whose sequences each
  // decode one token (no scores, no images), when it has more than 8 of them, to
  // decode_bucket(rows) rows with pad rows: the pad token at position 0 of a cache of the model's
  // own that never advances (its KV rows are written over every step). So steps of nearby sizes
  // replay one graph. Pad rows are computed like any row and their outputs dropped; they change
  // no sequence's cache. Steps up to 8 rows keep their size (a routed-expert model would read
  // the pad rows' experts too). The pad cache takes its room at once (a pool block per group);
  // false, padding off, when the pool has none. Off with an expert trace.
  bool set_decode_padding(bool on);
  bool decode_padding() const { return pad_cache_ != nullptr; }
  // 9..64 rows: the next multiple of 8; up to 256: of 32; beyond: of 64; 8 or fewer: rows.
  static int decode_bucket(int rows);

  // Records the routed experts of every token of every later forward into t (expert_trace.h;
  // null: stop). The idx / weights the router writes land in a per-step buffer read back once
  // after the step, with the logits: no sync per layer.
  void set_expert_trace(std::shared_ptr<ExpertTrace> t);

  // Tensor parallelism: this model is rank comm->rank() of comm->size() (parallel/tp_model.h
  // builds it: a rank-local config and weights from parallel/tp_source.h, lm_head holding vocabulary
  // rows shard_range(vocab, 1, rank, size)). forward() then sums the row-parallel partial outputs
  // (o_proj, down_proj, the routed experts) over the group and gathers the vocabulary shards'
  // logits, so every rank returns the whole outputs. Every rank runs each forward with the same
  // batch (its own caches) at the same time. An adapter's delta on a row-parallel projection is a
  // partial sum too (parallel/tp_lora.h), reduced with the projection's.
  // comm outlives the model; null: one rank.
  void set_communicator(Communicator* comm);
  // Makes this model (rank 0 of a group, its communicator set) the leader of the other ranks, so
  // that callers use it as one model: forward() runs on every peer too, at the same time, with the
  // same inputs over the peer caches of its caches (outputs come from the leader); new_cache()
  // makes caches holding a peer cache per peer (model/kv_cache.h add_peer); set_kv_pool (a pool of
  // the same block counts per peer), set_kv_options and set_decode_padding apply to every rank.
  void set_peers(std::unique_ptr<ModelPeers> peers);
  int ranks() const { return peers_ ? peers_->count() + 1 : 1; }

  // Optional tap for layer-by-layer debugging: called with (name, layer, host copy of a buffer).
  using Tap = std::function<void(const char* name, int layer, const float* data, size_t n)>;
  void set_tap(Tap t) { tap_ = std::move(t); }

 private:
  struct Scratch;
  // forward() of this rank alone.
  // head false: up to the final norm (forward_hidden).
  // pick_k > 0 (a group's leader asks it of every rank: Model::forward): the vocabulary shards'
  // top pick_k (value, id) per row are gathered instead of the logits (argmax and top k without a
  // [rows, vocab] exchange; combine_picks makes the outputs).
  // argmax_slot >= 0 (forward_queued): the argmax rows are queued for that read slot instead.
  // draw (with argmax_slot): forward_queued's draw.
  void forward_rank(const std::vector<SeqInput>& batch, ActPrecision P, float* logits, int32_t* argmax,
                    const TopK* topk, const TokenMasks* masks, int pick_k = 0, bool head = true,
                    int argmax_slot = -1, const QueuedDraw* draw = nullptr);
  void ensure_scratch(int rows, int logit_rows, int top_k = 0, int masks = 0, bool head = true, int pick_k = 0);
  // The k a group's forward picks per shard for these outputs: 0 (gather the logits) when logits or
  // masks are asked for, or k exceeds a shard.
  int shard_pick_k(const float* logits, const int32_t* argmax, const TopK* topk, const TokenMasks* masks) const;
  // argmax / topk of rows [0, LR_out) from the gathered candidates of every rank (after end_step).
  void combine_picks(int LR, int LR_out, int k, int32_t* argmax, const TopK* topk);
  // batch, or (padding on, a decode step of 9 or more rows) batch and its pad rows in *padded.
  const std::vector<SeqInput>& pad_to_bucket(const std::vector<SeqInput>& batch, std::vector<SeqInput>* padded);
  void tap(const char* name, int layer, const Buf& p, size_t n);
  // After a forward step's end_step, before the caches advance: its routed experts to trace_.
  void record_experts(const std::vector<SeqInput>& batch, int R);
  // The rows of this forward that take one adapter: consecutive sequences with the same adapter
  // (SeqInput::adapter, else the model's own); rows without an adapter are in no run.
  struct AdapterRun {
    int row0 = 0, rows = 0;
    const LoraAdapter* adapter = nullptr;
  };
  using LoraModule = const LoraDelta* LayerLora::*;  // one module of a layer (&LayerLora::q, ...)
  void set_lora_runs(const std::vector<SeqInput>& batch);
  // Module m of layer l's adapters on this forward's rows (LoRA wrapping its matmul; backend.h
  // LoraApply), or null when no run adapts it. Valid until the next call for the same module.
  const LoraApply* lora(int l, LoraModule m);
  // The residual stream (scratch x) += rms_norm(x·Wᵀ + lora)·norm_w (Backend::matmul_norm_add);
  // y_scratch [M, W.rows]. row_parallel: W holds this rank's input columns (o_proj, down_proj):
  // the projection is summed over the group before the norm. tap_proj (layer l): the tap that
  // observes the projection before the norm (computed beside the op on one rank; under tensor
  // parallelism the summed projection, read between the split op's parts).
  void matmul_norm_add(const Buf& x, int M, const WeightView& W, const LoraApply* lora, const Buf& y_scratch,
                       const float* norm_w, ActPrecision P, bool row_parallel, const char* tap_proj = nullptr,
                       int l = -1);
  // Tensor parallelism: y[0, n) summed over the group in place (nothing with one rank).
  void all_reduce(const Buf& y, size_t n);
  // Tensor parallelism: the ranks' vocabulary shards' logits [LR, own rows] (scratch lpart) into
  // the whole logits [LR, vocab] (scratch logits).
  void gather_logits(int LR);
  // Tensor parallelism: this rank's top k (value, id) per row of its softcapped shard (scratch
  // lpart), gathered from every rank with each shard's log-sum-exp (scratch gk_*).
  void gather_picks(int LR, int k);
  // gelu_tanh(gate) * up the way cfg_.gelu says (the ggml table only with f32 activations).
  void gelu_mul(const Buf& gate, const Buf& up, size_t n, ActPrecision P, const Buf& out);

  ModelConfig cfg_;
  ModelWeights w_;
  std::shared_ptr<const WeightSource> src_;  // keeps the mapped files alive
  std::unique_ptr<Backend> be_;
  std::vector<RopeTable> rope_;        // per layer
  std::vector<int> moe_layers_;        // the MoE layers' numbers, in order
  std::unique_ptr<Scratch> s_;
  KvCacheOptions kv_opt_;
  std::shared_ptr<KvPool> kv_pool_;
  std::unique_ptr<KvCache> pad_cache_;  // set_decode_padding's pad sequence, or null: padding off
  int32_t pad_token_ = 0;
  std::unique_ptr<LoraAdapter> lora_;
  std::vector<AdapterRun> lora_runs_;  // the current forward's (set_lora_runs)
  std::array<LoraApply, 9> lora_apply_;  // lora()'s, one per module of a layer
  uint64_t lora_dropout_seed_ = 0;   // set_lora_dropout's
  Tap tap_;
  std::shared_ptr<ExpertTrace> trace_;
  Communicator* comm_ = nullptr;  // set_communicator's, or null
  std::unique_ptr<ModelPeers> peers_;  // set_peers', or null
  int64_t vocab_max_ = 0;         // with comm_: the largest rank's vocabulary rows
  std::unique_ptr<Drafter> drafter_;  // last: it frees its buffers through be_
};

// Where a forward call over tokens[begin, end) should end instead (end <= n): past the run of
// image tokens that straddles `end` when the model attends bidirectionally within images
// (ModelConfig::bidi_images), so no call splits an image block; else `end`.
int image_block_chunk_end(const ModelConfig& c, const int32_t* tokens, int n, int end);

// Opens a model and loads it on the named backend (make_backend's names). `path` is a directory
// with config.json + *.safetensors, a .gguf file, or a directory holding one .gguf file; empty
// means the default model (io/gguf_model.h default_model_path()).
// opt: the device backend's options (BackendOptions).
Result<std::unique_ptr<Model>> load_model(const std::string& path, const std::string& backend = "cpu",
                                          const BackendOptions& opt = {});

// `path`, or the default model's path when empty (error: no model configured).
Result<std::string> resolve_model_path(const std::string& path);

// The named backend (make_backend's names) with its options; errors say why a device backend
// cannot start (no CUDA in this build, no such GPU) or that the name is unknown.
Result<std::unique_ptr<Backend>> open_backend(const std::string& backend, const BackendOptions& opt = {});

struct OpenedModel;
// Builds the Model from an already opened checkpoint (io/model_dir.h).
Result<std::unique_ptr<Model>> build_model(const OpenedModel& om, const std::string& backend,
                                           const BackendOptions& opt = {});

}  // namespace g4
