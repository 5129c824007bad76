// The Gemma text model as a differentiable function for LoRA training: forward over one token
// sequence, the next-token cross-entropy loss, and its gradient with respect to every adapter
// matrix (LoraParams), in f32 on the host (train/dense_ops.h).
//
// The forward is the model's own (model/model.cpp, mlx-lm gemma4_text.py), with the adapters
// applied as mlx-lm's LoRALinear applies them; tests check its logits against Model::forward
// and its gradients against finite differences and mlx-lm's autodiff.
// Memory: the forward keeps each adapted layer's input and the K/V that KV-shared layers read;
// the backward recomputes one layer at a time (gradient checkpointing per layer, as mlx-lm's
// --grad-checkpoint), so activations stay at O(layers · T · hidden + heads · T²).
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "train/lora_params.h"

namespace g4::train {

// One training sequence: its tokens and the index of the first token that is a target (tokens
// before it are context only: mlx-lm's --mask-prompt offset; 0 trains on all).
struct Example {
  std::vector<int32_t> tokens;
  int offset = 0;
};

// Σ of the per-token losses of one sequence and how many targets it had.
struct SeqLoss {
  double sum = 0.0;
  int count = 0;
};

// The targets of `ex` once truncated to `max_len` tokens: positions s in [max(offset, 1), L-1]
// (each predicted from the tokens before it). mlx-lm's default_loss also counts one position
// past the end (a pad id 0) per padded row; this runtime does not (ml-explore/mlx-lm PR 1697).
int target_count(const Example& ex, int max_len);

class LoraTrainModel {
 public:
  // `model` must run on a host backend (its weights readable here); both must outlive this.
  LoraTrainModel(const Model& model, LoraParams& params);

  // The summed loss of a batch of sequences (each truncated to max_len tokens; packed into one
  // set of rows, each sequence attending only to itself, as right-padded rows of a causal batch
  // do). grad_weight != 0: also adds grad_weight · d(Σ loss)/d(adapter matrices) into the params'
  // gradients. Dropout (LoraConfig::dropout > 0) draws its masks from dropout_seed when training
  // (grad_weight != 0), never when evaluating.
  SeqLoss run(const std::vector<const Example*>& batch, int max_len, float grad_weight, uint64_t dropout_seed);

  // The logits [T, vocab] of every position of `tokens` with the adapters applied (for tests:
  // the same function Model::forward computes).
  std::vector<float> logits(const std::vector<int32_t>& tokens);

 private:
  struct Acts;
  struct LoraCall;
  // The sequences packed into one call's rows: each starts at position 0 and attends only to itself.
  struct Segment {
    int row0 = 0, n = 0;
    size_t probs0 = 0;  // offset of its [T, T] attention weights per head (times the head count)
  };
  void set_segments(const std::vector<int>& lengths);
  // RoPE (or its backward) of every segment's rows of x [rows, heads, D].
  void rope_segments(float* x, int heads, int D, const RopeTable& t, bool backward) const;
  // What a forward pass keeps for the backward: the per-layer inputs (PLE, [T, N·Pw]), the inputs
  // of the layers from keep_from on, and every donor layer's roped K and normed V.
  struct Pass {
    std::vector<float> ple;
    std::vector<std::vector<float>> inputs, don_k, don_v;
    // The donor K / V that layer l reads (null: it owns its KV).
    const float* donor_k(const ModelConfig& c, int l) const {
      const int s = c.layers[size_t(l)].kv_source;
      return s >= 0 ? don_k[size_t(s)].data() : nullptr;
    }
    const float* donor_v(const ModelConfig& c, int l) const {
      const int s = c.layers[size_t(l)].kv_source;
      return s >= 0 ? don_v[size_t(s)].data() : nullptr;
    }
  };
  // Embedding and every layer over ids [T] (the current segments); a.x ends as the last layer's output.
  void forward_pass(const int32_t* ids, int T, int keep_from, bool train, uint64_t seed, Pass& ps, Acts& a);
  void embed(const int32_t* ids, int T, std::vector<float>& x, std::vector<float>& ple);
  // One layer's forward from a.x (the layer input, [T, d]); fills the intermediates of `a` and
  // writes the layer output into out. kv_src: the donor's roped K and normed V for a KV-shared
  // layer. train: dropout masks drawn.
  void layer_forward(int l, int T, Acts& a, const std::vector<float>& ple, const float* kv_k, const float* kv_v,
                     bool train, uint64_t seed, float* out);
  // Back through layer l, whose intermediates `a` holds (layer_forward): dx [T, d] holds
  // d loss / d(layer output) and becomes d loss / d(layer input) (at the lowest adapted layer, where
  // nothing below needs it, it is left partial). A KV-shared layer adds the gradients of the donor's
  // K / V it read (kv_k, kv_v) into dk_src / dv_src (null: the donor is not adapted); a donor adds
  // dk_own / dv_own (what the layers above sent it; null: none) to its own.
  void layer_backward(int l, int T, Acts& a, const float* kv_k, const float* kv_v, std::vector<float>& dx,
                      float* dk_src, float* dv_src, const float* dk_own, const float* dv_own);
  // y [T, W.rows] = x·Wᵀ + the adapter's delta of x (m null: none).
  void linear(const float* x, int T, const WeightView& W, const LoraModule* m, bool train, uint64_t seed,
              LoraCall& c, std::vector<float>& y);
  // Its backward: the adapter's gradients, and dx [T, W.cols] += dy·W + the adapter's input
  // gradient (dx null: the adapter's gradients only).
  void linear_bwd(const float* x, int T, const WeightView& W, LoraModule* m, const LoraCall& c, const float* dy,
                  float* dx);
  // y[T, out] += lora delta of x; a.t (and the dropout mask) kept for the backward.
  void lora_fwd(const LoraModule* m, const float* x, int T, bool train, uint64_t seed, LoraCall& c, float* y);
  // Gradients of one adapted module given dy; adds d/dx into dx when dx is not null.
  void lora_bwd(LoraModule* m, const float* x, int T, const LoraCall& c, const float* dy, float* dx);

  const ModelConfig& cfg_;
  const ModelWeights& w_;
  LoraParams& p_;
  std::vector<RopeTable> rope_;
  std::vector<bool> donor_;  // layers whose KV later layers share
  std::vector<Segment> segs_;
  size_t probs_size_ = 0;  // Σ n² over the segments
};

}  // namespace g4::train
