// What continues a LoRA training run exactly where it stopped: the iterations done, the batch
// order's generator and position, the optimizer's moments, the gradients accumulated since the
// last update and the report counters. Saved beside each adapter checkpoint (and when a run is
// interrupted); with the adapter weights saved at the same iteration, a resumed run gives the
// adapter an uninterrupted run gives, bit for bit.
//
// File (little-endian): "G4TRAIN1", u64 header bytes, the header as JSON (iteration, counters,
// generator, batch position, fingerprint, the float arrays' lengths), then the arrays' floats in
// the header's order. Written atomically (core/atomic_file.h).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "train/dataset.h"

namespace g4::train {

struct TrainState {
  int iteration = 0;  // iterations done
  std::string rng;    // NumpyLegacyRng::save()
  BatchIterator::Position batches;
  std::vector<std::vector<float>> opt_m, opt_v;  // Optimizer moments
  std::vector<std::vector<float>> grads;         // ga, gb of each module, in order
  double losses = 0.0, train_time = 0.0;         // the report's running sums
  long n_tokens = 0, trained_tokens = 0;
  int steps = 0;
  // What must match for the state to continue a run: data, batch size, seed, accumulation,
  // optimizer, learning rate, adapter shapes (trainer.cpp). A mismatch is refused, naming it.
  nlohmann::ordered_json fingerprint;
};

// The state file that goes with an adapter file: DIR/NNNNNNN_adapters.safetensors ->
// DIR/NNNNNNN_training_state.bin; any other DIR/NAME -> DIR/training_state.bin.
std::string train_state_path(const std::string& adapter_file);

Status save_train_state(const std::string& path, const TrainState& s);
// Errors name the file: unreadable, not such a file, cut short, lengths that do not add up.
Result<TrainState> load_train_state(const std::string& path);

}  // namespace g4::train
