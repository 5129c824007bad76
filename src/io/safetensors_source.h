// WeightSource over safetensors checkpoints (mlx-community sanitized names or Hugging Face
// originals). The one load-time mapping step (mlx-lm gemma4.Model.sanitize +
// gemma4_text.Model.sanitize, done as name lookups instead of copies):
//   language_model.model.X | model.language_model.X | model.X | X      -> canonical X
//   language_model.lm_head.weight | lm_head.weight                      -> lm_head.weight
//   vision_tower / audio_tower / embed_vision / embed_audio / vision_embedder /
//   multi_modal_projector (with or without "model.")                   -> dropped
//   HF layers.i.experts.gate_up_proj [E, 2I, d]  -> experts.switch_glu.gate_proj = rows [0, I) and
//                                                   up_proj = rows [I, 2I) of each expert, as views
//   HF layers.i.experts.down_proj [E, d, I]      -> experts.switch_glu.down_proj
// A module is MLX-affine quantized when config.json's quantization block names it with a dict
// (or true), or, when it is not named there, when `<module>.scales` exists (mlx-lm load_model);
// bits and group size are inferred from the shapes (in = scales.shape[-1] * g,
// b = 32 * weight.shape[-1] / in) and must agree with an explicit config entry.
#pragma once
#include <map>
#include <optional>
#include <memory>
#include <string>

#include "io/model_config.h"
#include "io/tensor_store.h"
#include "io/weight_source.h"

namespace g4 {

// Which tensors a source serves: the text model (canonical_name), or the vision tower and its
// embedder (vision_tensor_name: "vision_tower.*", "vision_embedder.*" (12B) and "embed_vision.*",
// with any "model." prefix removed).
enum class TensorSet { Text, Vision };

// "vision_tower.X" / "vision_embedder.X" / "embed_vision.X" for those tensors (with or without
// "model."), else nullopt.
std::optional<std::string> vision_tensor_name(std::string_view stored);

class SafetensorsSource final : public WeightSource {
 public:
  // Errors: two stored tensors mapping to one canonical name.
  static Result<std::unique_ptr<SafetensorsSource>> create(std::shared_ptr<TensorStore> store, QuantConfig quant,
                                                           TensorSet set = TensorSet::Text);

  bool has(std::string_view canonical) const override;
  Result<WeightView> matrix(std::string_view module, int64_t rows, int64_t cols) const override;
  Result<WeightView> stacked_matrix(std::string_view module, int64_t index, int64_t count, int64_t rows,
                                    int64_t cols) const override;
  Result<std::vector<float>> vector(std::string_view tensor, int64_t n) const override;
  std::string describe() const override;

  // Bytes stored for a canonical module (weight + scales + biases) or tensor; 0 when absent.
  // For a gate/up half of an HF gate_up_proj this is half of the stored tensor.
  uint64_t stored_bytes(std::string_view canonical) const;
  // The stored name a canonical tensor name resolves to ("" when absent).
  std::string stored_name(std::string_view canonical_tensor) const;
  const TensorStore& store() const { return *store_; }
  const QuantConfig& quant() const { return quant_; }

 private:
  struct Entry {
    StoredTensor t;
    int split = 0;  // 0: whole tensor; 1: first half of axis -2 (gate); 2: second half (up)
  };
  const Entry* find(std::string_view canonical) const;
  Result<WeightView> view(std::string_view module, int64_t index, int64_t count, int64_t rows, int64_t cols) const;

  std::shared_ptr<TensorStore> store_;
  QuantConfig quant_;
  std::map<std::string, Entry, std::less<>> canon_;
  std::string naming_;  // e.g. "language_model.model.*" (for messages)
};

}  // namespace g4
