// The Gemma text model as a differentiable function for LoRA training: the next-token
// cross-entropy loss over token sequences, and its gradient with respect to every adapter matrix
// (LoraParams), in f32 on the host or on a GPU (a GradArith).
//
// There is one forward: the model's own (Model::forward_hidden, model/model.cpp), run over the
// same weights on a GradBackend (train/grad_backend.h), which records its ops and differentiates
// them, with gradient checkpointing per layer. The adapters are applied as the inference model
// applies a loaded adapter (model/lora.h: mlx-lm's LoRALinear, with its dropout when training);
// the LM head and the loss run in vocabulary chunks (GradArith::lm_head_loss), so [T, vocab]
// logits are never held. Tests check its logits against Model::forward with the saved adapter, and its
// gradients against finite differences and mlx-lm's autodiff.
#pragma once
#include <cstdint>
#include <vector>

#include "model/model.h"
#include "train/grad_backend.h"
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
  // `model` must run on a host backend (its weights readable here); both must outlive this. The
  // training forward and backward run on `arith` (backend/grad_arith.h: the device's memory and
  // kernels, the model's weights placed there), or on the host arithmetic when null; the head and
  // the loss too (GradBackend::head_loss).
  LoraTrainModel(const Model& model, LoraParams& params, std::unique_ptr<GradArith> arith = nullptr);
  ~LoraTrainModel();

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
  // The parameters' current values into the adapter's transposed matrices (before each forward).
  void sync_adapter();
  // One forward of the sequences, each in a new cache from position 0 (returned: a recorded
  // forward's backward reads them), every row's final-normed hidden state in model_->normed_rows().
  std::vector<std::unique_ptr<KvCache>> forward(const std::vector<std::vector<int32_t>>& seqs);

  // The final-normed rows of the last forward, [T, hidden], in host memory.
  std::vector<float> normed_rows_host(int T);

  const ModelConfig& cfg_;
  LoraParams& p_;
  const WeightView head_;         // the tied embeddings in `model`'s (host) memory (logits())
  GradBackend* be_ = nullptr;     // owned by model_
  std::unique_ptr<Model> model_;  // the inference model's weights, on be_
  LoraAdapter* adapter_ = nullptr;  // model_'s, holding the parameters as LoraDeltas
  // In be_'s memory: every module's LoraDelta a [rank, in] then b [out, rank] (p_.modules()
  // order, module i's a at offsets_[i]; total_ floats) and their gradients at the same offsets.
  Buf mats_, grads_;
  std::vector<size_t> offsets_;
  size_t total_ = 0;
};

}  // namespace g4::train
