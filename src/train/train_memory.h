// What one training batch holds in memory on the host (train/lora_train_model.h), estimated before
// training starts so that a batch that cannot fit is refused with the numbers instead of failing
// hours in. Counted (f32): the inputs kept for the adapted layers, the donor layers' K and V, the
// per-layer inputs, two layers' intermediates (the forward's and the recomputed one's) with their
// attention weights (heads x Σ n² per layer), the backward's gradients of one layer, and the
// final norm and loss rows. The model's weights are not counted (they are loaded already).
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.h"

namespace g4::train {

// rows: the tokens of a batch packed together (Σ over its sequences of length - 1); lengths: each
// sequence's rows (for the attention weights); first_layer: the lowest adapted layer.
uint64_t training_batch_bytes(const ModelConfig& c, int first_layer, const std::vector<int>& lengths);

}  // namespace g4::train
