// The one load-time mapping step between a checkpoint's own tensor names/layout and the model.
// The model asks for weights by CANONICAL name (mlx-lm's sanitized text-model names, without any
// "model." / "language_model.model." prefix); each source resolves that to its file's tensors.
//
// Canonical module names (matrix / stacked_matrix take these, without ".weight"):
//   embed_tokens, embed_tokens_per_layer, per_layer_model_projection, lm_head,
//   layers.{i}.self_attn.{q,k,v,o}_proj, layers.{i}.mlp.{gate,up,down}_proj,
//   layers.{i}.router.proj, layers.{i}.per_layer_input_gate, layers.{i}.per_layer_projection,
//   layers.{i}.experts.switch_glu.{gate,up,down}_proj   (stacked [E, rows, cols])
// Canonical vector names (vector takes the full tensor name):
//   norm.weight, per_layer_projection_norm.weight, layers.{i}.{input,post_attention,
//   pre_feedforward,post_feedforward}_layernorm.weight, layers.{i}.pre_feedforward_layernorm_2.weight,
//   layers.{i}.post_feedforward_layernorm_{1,2}.weight, layers.{i}.self_attn.{q,k}_norm.weight,
//   layers.{i}.post_per_layer_input_norm.weight, layers.{i}.layer_scalar,
//   layers.{i}.router.scale, layers.{i}.router.per_expert_scale
//
// Every accessor checks the stored shape/dtype against what the caller (the config) expects and
// returns an error naming the file and the stored tensor name when they disagree or are missing.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "quant/weight.h"

namespace g4 {

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // True when the checkpoint has this canonical module (matrix) or tensor (vector).
  virtual bool has(std::string_view canonical) const = 0;

  // A 2-D weight [rows, cols] = [out, in], viewed in place (packed formats stay packed).
  virtual Result<WeightView> matrix(std::string_view module, int64_t rows, int64_t cols) const = 0;

  // Matrix `index` of a stacked [count, rows, cols] weight (MoE experts), viewed in place.
  virtual Result<WeightView> stacked_matrix(std::string_view module, int64_t index, int64_t count,
                                            int64_t rows, int64_t cols) const = 0;

  // A float tensor of n elements (any float dtype), converted to f32.
  virtual Result<std::vector<float>> vector(std::string_view tensor, int64_t n) const = 0;

  // Human-readable description of where the weights come from (for `gemma4 info`).
  virtual std::string describe() const = 0;
};

}  // namespace g4
