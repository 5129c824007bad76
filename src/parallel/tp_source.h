// Rank r's part of a checkpoint for tensor parallelism over n ranks, as a WeightSource: the model's
// own loader (model/weights.cpp) reads it with a rank-local ModelConfig and builds the rank's
// weights, so the tensor list and the forward pass stay one definition.
//
// The split (Megatron-style, one all-reduce after each row-parallel projection):
// - Attention: query heads split evenly, rank r holding heads [r·H/n, (r+1)·H/n): q_proj rows
//   (column-parallel), o_proj columns (row-parallel). KV heads split evenly when a layer has at
//   least n of them; a layer with fewer (Gemma 4's full layers) replicates, each rank holding the
//   one KV head its query heads read (n must then be a multiple of the layer's KV heads).
// - Dense MLP: gate/up rows and down columns over the intermediate dimension, in units of down's
//   column block (an MLX matrix with fewer groups than ranks is regrouped to 32 columns:
//   parallel/shard.h shard_cols); ranks may hold unequal widths.
// - Routed experts (expert parallel): experts split by expert, shard_range(E, 1, r, n); an expert
//   held by another rank reads as a view with 0 rows (Backend::moe_experts skips it). The router,
//   norms, embeddings and per-layer-input weights are replicated.
// - The vocabulary head is split by rows in the model (Model::set_communicator), not here: a tied
//   head is the embedding, which every rank needs whole.
// The rank-local config differs from the checkpoint's in n_heads, each layer's n_kv_heads and
// mlp_width only. Column shards are packed copies owned by this source (the Model keeps it alive).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"
#include "io/weight_source.h"
#include "parallel/shard.h"

namespace g4 {

class ShardedWeightSource : public WeightSource {
 public:
  // Plans rank `rank` of `size` for the checkpoint `base` of config `global`. Errors name what
  // does not split: the query or KV heads, or a projection's columns (shape, format and unit).
  static Result<std::shared_ptr<ShardedWeightSource>> make(std::shared_ptr<const WeightSource> base,
                                                           const ModelConfig& global, int rank, int size);

  // The rank-local config the loader and the Model run with.
  const ModelConfig& config() const { return local_; }
  // How this rank holds module `part` of layer `layer` ("self_attn.q_proj", "mlp.down_proj", ...,
  // as matrix() splits it): a range of its output rows (column-parallel), of its input columns
  // (row-parallel), or whole (replicated). LoRA adapters are split by the same ranges
  // (parallel/tp_lora.h).
  struct Split {
    enum class Kind { Whole, Rows, Cols };
    Kind kind = Kind::Whole;
    ShardRange range;  // Rows / Cols: the global range this rank holds
  };
  Split split_of(int layer, std::string_view part) const;
  // The share of matrix `module`'s stored bytes this rank holds, for memory plans that must not read
  // the shards (cli/memory_plan.h): a split module's range over its whole dimension, the vocabulary
  // head's rows (Model::set_communicator splits them), 1 for a replicated one. Routed experts are
  // whole or none: stacked_matrix answers them.
  double held_fraction(std::string_view module) const;
  // Whether this rank's part of matrix `module` is a packed copy (a column shard) rather than a view
  // into the checkpoint.
  bool copies(std::string_view module) const;

  bool has(std::string_view canonical) const override { return base_->has(canonical); }
  Result<WeightView> matrix(std::string_view module, int64_t rows, int64_t cols) const override;
  Result<WeightView> stacked_matrix(std::string_view module, int64_t index, int64_t count, int64_t rows,
                                    int64_t cols) const override;
  Result<std::vector<float>> vector(std::string_view tensor, int64_t n) const override {
    return base_->vector(tensor, n);
  }
  std::string describe() const override;

 private:
  ShardedWeightSource() = default;
  // A packed shard kept for the source's life; returns its view.
  WeightView keep(PackedWeight p) const;
  // The whole dimension a split module of layer l is split along (query heads x head_dim for q / o,
  // KV heads x head_dim for k / v, the MLP width for gate / up / down).
  int64_t split_dim(int l, std::string_view part) const;

  std::shared_ptr<const WeightSource> base_;
  ModelConfig global_, local_;
  int rank_ = 0, size_ = 1;
  ShardRange experts_;  // the routed experts this rank holds (empty without experts)
  std::vector<int64_t> mlp_unit_;  // per layer: the intermediate dimension's split unit
  mutable std::mutex mu_;
  mutable std::vector<PackedWeight> packed_;
};

}  // namespace g4
