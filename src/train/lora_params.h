// The trainable state of LoRA fine-tuning: one (lora_a, lora_b) pair per adapted module, in
// mlx-lm's layout and names, with their gradients; saved as mlx-lm's `mlx_lm.lora` saves an
// adapter (adapters.safetensors + adapter_config.json), so `--adapter-path` here and mlx-lm's
// load_adapters both read the result.
//
// Which modules: as mlx-lm's linear_to_lora_layers with its default keys, every linear module of
// the last `num_layers` layers (attention q/k/v/o, MLP gate/up/down, per-layer-input gate and
// projection; model/lora.h kLoraModules), skipping those a layer lacks.
// Initialization as mlx-lm's LoRALinear: lora_a ~ U(-1/√in, 1/√in), lora_b = 0 (this runtime's own
// seeded generator, not MLX's bit stream).
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/config.h"

namespace g4::train {

struct LoraConfig {
  int num_layers = 16;  // the last N layers (-1: all)
  int rank = 8;
  float scale = 20.f;
  float dropout = 0.f;
};

// One adapted module: delta(x) = scale · (dropout(x) · a) · b.
struct LoraModule {
  std::string name;   // full tensor-name stem, e.g. "model.layers.3.self_attn.q_proj"
  int layer = 0;
  std::string module;  // "self_attn.q_proj", ...
  int in = 0, out = 0, rank = 0;
  std::vector<float> a, b;    // [in, rank], [rank, out]
  std::vector<float> ga, gb;  // gradients, same shapes
};

// The modules of one layer (null where not adapted).
struct LayerModules {
  LoraModule *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr;
  LoraModule *gate = nullptr, *up = nullptr, *down = nullptr;
  LoraModule *ple_gate = nullptr, *ple_proj = nullptr;
  bool any() const { return q || k || v || o || gate || up || down || ple_gate || ple_proj; }
};

class LoraParams {
 public:
  // Modules for `cfg` per `lc`, initialized from `seed`. `prefix` is the checkpoint's name of the
  // layer list ("model.layers" for gemma4_text / gemma3, "language_model.model.layers" for
  // gemma4). Errors: num_layers out of range, rank < 1, dropout outside [0, 1). On MoE layers the
  // attention and the dense MLP are adapted; the router and the routed experts stay frozen.
  static Result<LoraParams> create(const ModelConfig& cfg, const LoraConfig& lc, const std::string& prefix,
                                   uint64_t seed);

  // Replaces a and b with an adapter file's (mlx-lm's --resume-adapter-file). Every tensor must
  // name a module being trained, with its shape; errors name the file and tensor.
  Status load(const std::string& safetensors_path);
  // Writes every (lora_a, lora_b) as F32 into a safetensors file (atomically: a temporary file,
  // then rename).
  Status save(const std::string& safetensors_path) const;

  void zero_grads();
  const LoraConfig& config() const { return lc_; }
  std::deque<LoraModule>& modules() { return modules_; }
  const std::deque<LoraModule>& modules() const { return modules_; }
  const LayerModules& layer(int l) const { return layers_[size_t(l)]; }
  // The lowest adapted layer (n_layers when none).
  int first_layer() const { return first_; }
  size_t parameter_count() const;

 private:
  LoraConfig lc_;
  std::deque<LoraModule> modules_;  // stable addresses behind layers_
  std::vector<LayerModules> layers_;
  int first_ = 0;
};

// The checkpoint's layer-list name for adapter tensors, as mlx-lm's model classes name it.
std::string lora_layer_prefix(const ModelConfig& cfg);

}  // namespace g4::train
