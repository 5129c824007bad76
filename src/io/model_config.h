// config.json (+ generation_config.json) -> ModelConfig (one LayerSpec per layer) + QuantConfig.
//
// Accepted layouts (spec §1.1): flat `gemma4_text` (also `gemma4_unified_text`), and nested
// `gemma4` / `gemma4_unified` with the text model under `text_config`, following mlx-lm's wrapper
// (gemma4.ModelArgs.__post_init__): the top-level vocab_size (default 262144) overrides
// text_config's; num_attention_heads / num_key_value_heads default to 8 / 1 only when missing.
// Missing optional fields take mlx-lm's gemma4_text.ModelArgs defaults; hidden_size,
// num_hidden_layers and intermediate_size are required. Errors are one line naming the file and
// the field ("<dir>/config.json: missing required field 'hidden_size'").
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/config.h"

namespace g4 {

// config.json's `quantization` block (or `quantization_config`), spec §3.5.
struct QuantConfig {
  bool present = false;   // the config has a quantization block
  int bits = 0;           // block defaults
  int group_size = 0;
  // Per-module entries, keyed by CANONICAL module name (see canonical_name). `quantized == false`
  // for a `false` entry; `true` entries carry the block defaults; dict entries their own values
  // (missing bits/group_size take MLX's affine defaults 4 / 64).
  std::map<std::string, ModuleQuant, std::less<>> overrides;
  // Entries for modules outside the text model (vision/audio towers), ignored.
  std::vector<std::string> ignored;

  const ModuleQuant* find(std::string_view canonical) const {
    auto it = overrides.find(canonical);
    return it == overrides.end() ? nullptr : &it->second;
  }
};

struct LoadedConfig {
  ModelConfig model;
  QuantConfig quant;
  bool multimodal = false;  // nested (gemma4 / gemma4_unified) config
};

// Parses config.json text plus, when `generation_json` is non-empty, generation_config.json text.
// `config_label` / `gen_label` name the files in errors.
Result<LoadedConfig> parse_config(std::string_view config_json, std::string_view generation_json = {},
                                  const std::string& config_label = "config.json",
                                  const std::string& gen_label = "generation_config.json");

// Reads <dir>/config.json and, when present, <dir>/generation_config.json.
Result<LoadedConfig> load_config(const std::string& dir);

// Maps a stored tensor name or an mlx-lm module path to the canonical name of
// io/weight_source.h by stripping "language_model.model.", "model.language_model.", "model." or
// "language_model."; returns nullopt for vision/audio tower names (mlx-lm gemma4.Model.sanitize
// drops vision_tower, multi_modal_projector, audio_tower, embed_audio, embed_vision,
// vision_embedder).
std::optional<std::string> canonical_name(std::string_view stored);

// Every tensor the text model reads, with the shape the config implies: `matrix` entries are
// modules (matrix()/stacked_matrix(): count > 0 means stacked [count, rows, cols]); vector entries
// are full tensor names with `rows` elements. Mirrors the module tree of mlx-lm gemma4_text.
// `optional` entries may be absent (layer_scalar: Gemma 3 GGUF has none; lm_head of an untied
// config: the loader falls back to embed_tokens).
struct ExpectedTensor {
  std::string name;
  bool matrix = false;
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  bool optional = false;
};
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c);

}  // namespace g4
