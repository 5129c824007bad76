// The Gemma 4 assistant drafter ("MTP" drafter; HF Gemma4AssistantForCausalLM, mlx-vlm
// speculative/drafters/gemma4_assistant): a small decoder that proposes the next few tokens of a
// target Gemma 4 model for speculative decoding. Its checkpoint is a directory with config.json
// (model_type "gemma4_assistant": backbone_hidden_size, block_size, use_ordered_embeddings,
// num_centroids, centroid_intermediate_top_k, and the decoder's text_config) and *.safetensors.
//
// One draft step, from a token t and a backbone-sized state h (HF / mlx-vlm order):
//   x   = pre_projection([E_target[t]·√d_target, h])          [2·backbone -> d_draft]
//   x   = decoder layers (Gemma 4 layers whose attention has only q: each reads the target's KV
//         cache of the target's LAST layer of the same kind, sliding or full; the query sits at
//         the position of the target's last cached token p, and sees what the target's own query
//         at p sees: every key for full layers, keys p-W < k <= p for sliding ones)
//   hn  = final_norm(x);  logits = hn · E_draftᵀ (no softcap);  h' = post_projection(hn)
// The next step feeds (argmax token, h'); the position stays p. The first step's h is the
// target's final-normed hidden state at p (the input of its LM head) and t the token the target
// predicted there (not yet in its cache).
//
// With use_ordered_embeddings (the E2B/E4B drafters), the head scores num_centroids clusters
// (centroids · hn), keeps the centroid_intermediate_top_k best and the argmax runs over their
// tokens only (masked_embedding.token_ordering lists each cluster's token ids); the logits of
// those tokens are the tied head's. Drafts are always argmax: the target decides every emitted
// token (runtime/engine.h), so greedy drafts keep the output exactly the target's.
//
// Where the references differ, this follows HF: mlx-vlm 0.7.10 places the query one slot past the
// end of a wrapped sliding ring (its _local_window_offset), so it drops the oldest key of the
// window once the ring has wrapped. Refused with one line naming the file and field or tensor: a
// MoE drafter, a backbone or vocabulary that is not the target's, layer kinds the target lacks,
// head sizes or windows that differ from the target layer whose KV a drafter layer reads.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "core/status.h"
#include "io/model_config.h"
#include "core/config.h"
#include "model/kv_cache.h"
#include "model/weights.h"

namespace g4 {

struct DrafterConfig {
  // The drafter's decoder. Its layers own no KV: after Drafter::load, each layer's kv_source is
  // the TARGET layer whose cache it reads.
  ModelConfig text;
  QuantConfig quant;             // config.json's quantization block (mlx-community drafters)
  int backbone = 0;              // the target's hidden size
  int block_size = 4;            // tokens per verification round: the target's token + drafts
  bool ordered_embeddings = false;
  int num_centroids = 0;
  int centroid_top_k = 0;
};

// Parses a gemma4_assistant config.json (`file` names it in errors).
Result<DrafterConfig> parse_drafter_config(std::string_view config_json, const std::string& file);

class Drafter {
 public:
  // Loads <dir>/config.json + *.safetensors for `target` (its config and weights, on `be`: the
  // drafter runs on the target's backend and reads the target's caches).
  static Result<std::unique_ptr<Drafter>> load(const std::string& dir, const ModelConfig& target,
                                               const ModelWeights& target_weights, Backend& be);
  ~Drafter();

  const DrafterConfig& config() const { return cfg_; }
  // Tokens drafted per round (block_size - 1 unless set).
  int draft_tokens() const { return draft_tokens_; }
  void set_draft_tokens(int n) { draft_tokens_ = n; }
  const std::string& path() const { return path_; }

  // Drafts n tokens after `token`. `cache` is the target's (size s >= 1: the tokens before
  // `token`); `hidden` [backbone] (a backend buffer) the target's final-normed hidden state at
  // position s - 1. out [n] receives the drafted ids; logits (host, or null) [n, vocab] the tied
  // head's logits of each step, and states (host, or null) [n, backbone] each step's h'.
  void draft(const KvCache& cache, const Buf& hidden, int32_t token, int n, ActPrecision P, int32_t* out,
             float* logits = nullptr, float* states = nullptr);

 private:
  Drafter(DrafterConfig cfg, Backend& be) : cfg_(std::move(cfg)), be_(be) {}
  // The draft token for the state in hn_: the head's argmax, over the routed candidates with
  // ordered embeddings. full_logits: logits_ holds the whole head's output.
  int32_t pick(ActPrecision P, bool full_logits);

  DrafterConfig cfg_;
  Backend& be_;
  std::shared_ptr<const WeightSource> src_;  // keeps the mapped checkpoint alive
  std::string path_;
  int draft_tokens_ = 3;
  int target_hidden_ = 0;
  ModelWeights w_;  // the decoder: embed_tokens (the tied head), layers (q, o, norms, MLP), norm
  WeightView target_embed_, pre_proj_, post_proj_, centroids_;
  std::vector<int32_t> ordering_;  // [vocab]: num_centroids rows of vocab/num_centroids ids
  std::vector<RopeTable> rope_;
  // Backend scratch (activation dtype; logits_ and cent_ f32; ids I32).
  Buf cat_, x_, xn_, q_, att_, o_, gate_, up_, f_, hn_, logits_, state_;
  Buf cent_;
  Buf cand_rows_;  // [candidates, hidden] f32: the routed candidates' head rows (host backends)
  Buf cand_ids_, ids_, am_;
  std::vector<float> host_logits_, host_cent_, host_hn_, host_cand_scores_;
  std::vector<int32_t> cand_;
};

}  // namespace g4
