// What one training batch holds in memory on the host (train/lora_train_model.h), estimated before
// training starts so that a batch that cannot fit is refused with the numbers instead of failing
// hours in. Counted (f32), as train/grad_backend.h lays it out: the model's scratch buffers and
// every layer's KV cache for the batch's rows, a gradient buffer beside each, the inputs each
// adapted layer's checkpoint keeps (its residual and per-layer inputs, a shared layer's donor K/V),
// and one layer's recomputed intermediates with their attention weights (heads x Σ n²) and
// temporaries. The model's weights are not counted (they are loaded already).
#pragma once
#include <cstdint>
#include <vector>

#include "core/config.h"

namespace g4::train {

// rows: the tokens of a batch packed together (Σ over its sequences of length - 1); lengths: each
// sequence's rows (for the attention weights); first_layer: the lowest adapted layer.
uint64_t training_batch_bytes(const ModelConfig& c, int first_layer, const std::vector<int>& lengths);

}  // namespace g4::train
