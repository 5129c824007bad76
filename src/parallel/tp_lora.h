// LoRA adapters under tensor parallelism: one rank's shard of an adapter, split as that rank's
// ShardedWeightSource splits the adapted projection (parallel/tp_source.h split_of):
// - column-parallel (q, k, v, gate, up): lora_b's output rows; lora_a whole, so each rank's delta
//   is its rows of the whole delta;
// - row-parallel (o, down): lora_a's input columns; lora_b whole: each rank's delta is a partial
//   sum that the projection's all-reduce adds up with the base's partial products (linearity);
// - replicated (the per-layer-input gate and projection): whole.
// The values are copied, never changed: the shards' products sum to the whole adapter's.
#pragma once
#include <memory>

#include "core/status.h"
#include "model/lora.h"
#include "parallel/tp_source.h"

namespace g4 {

// `whole`'s matrices must be host memory (an adapter loaded on a host backend); the shard's are
// placed on `be`.
Result<std::unique_ptr<LoraAdapter>> shard_lora_adapter(const LoraAdapter& whole, const ShardedWeightSource& src,
                                                        Backend& be);

}  // namespace g4
