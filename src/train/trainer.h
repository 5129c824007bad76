// The LoRA training loop of `mlx_lm.lora --train` (mlx_lm/tuner/trainer.py train / evaluate):
// per iteration one batch (dataset.h's mlx-lm order), the loss Σ CE / targets of the batch and
// its gradients, an optimizer update every grad_accumulation_steps batches (gradients summed,
// then divided by the count); validation at iteration 1, every steps_per_eval and at the end;
// the mean train loss every steps_per_report; the adapter saved every save_every iterations
// (adapters.safetensors and NNNNNNN_adapters.safetensors, each with its training state) and at the
// end.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"
#include "train/dataset.h"
#include "train/lora_train_model.h"
#include "train/optimizer.h"
#include "train/train_state.h"

namespace g4::train {

struct TrainOptions {
  int iters = 1000;
  int batch_size = 4;
  int val_batches = 25;  // -1: the whole validation set
  int steps_per_report = 10;
  int steps_per_eval = 200;
  int save_every = 100;
  int max_seq_length = 2048;
  int grad_accumulation_steps = 1;
  uint32_t seed = 0;
  std::string adapter_dir;  // where adapters.safetensors goes
  // Continue this state (train_state.h), saved by a run of the same data and flags: training starts
  // at its iteration + 1 with its batch order, optimizer moments and gradients (null: from the start).
  const TrainState* resume = nullptr;
  // Set (by a signal handler): the run stops after the iteration under way, saving the adapter and
  // its state as a checkpoint does.
  const std::atomic<bool>* stop = nullptr;
  // Called as validation goes: (0, n) before its n batches, then (i, n) after batch i.
  std::function<void(int, int)> val_progress;
};

// One line of progress; `kind` is "val", "train", "save" or "interrupted" (a save at a stop).
struct Report {
  std::string kind;
  int iteration = 0;
  double loss = 0.0;           // val / train
  double seconds = 0.0;        // val: time taken; train: since the last report
  double tokens_per_sec = 0.0; // train
  double it_per_sec = 0.0;     // train
  long trained_tokens = 0;     // train
  float learning_rate = 0.f;   // train
  std::string path;            // save
};

// Mean loss over a dataset's batches (mlx-lm's evaluate: Σ loss·targets / Σ targets), visiting
// at most num_batches batches (-1: all) in the order `rng` draws. progress(0, n) first, then
// progress(i, n) after each batch.
Result<double> evaluate(LoraTrainModel& m, const Dataset& d, int batch_size, int num_batches, int max_seq_length,
                        NumpyLegacyRng& rng, const std::function<void(int, int)>& progress = {});

// Trains params (through m) on `train`, validating on `valid` (may be empty). report() receives
// each report as it happens; step(it), when given, runs after every iteration. Every save writes
// the adapter and its training state (train_state.h). Returns the iterations done: o.iters, or
// fewer when o.stop was set.
Result<int> train(LoraTrainModel& m, LoraParams& params, Optimizer& opt, const Dataset& train, const Dataset& valid,
             const TrainOptions& o, NumpyLegacyRng& rng, const std::function<void(const Report&)>& report,
             const std::function<void(int)>& step = {});

}  // namespace g4::train
