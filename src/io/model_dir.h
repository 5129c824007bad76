// Opening a model from a path given by the user:
//   - a directory with config.json (+ generation_config.json) and *.safetensors (sharded or not):
//     ModelConfig + QuantConfig from the config, a SafetensorsSource over the tensors;
//   - a .gguf file, or a directory holding exactly one .gguf file (and no config.json):
//     open_gguf_model() (io/gguf_model.h).
// Errors are one line naming the path ("<dir>: no model found: ...").
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "io/gguf.h"
#include "io/model_config.h"
#include "io/weight_source.h"
#include "core/config.h"

namespace g4 {

struct OpenedModel {
  ModelConfig config;
  QuantConfig quant;                      // empty (present == false) for GGUF
  std::shared_ptr<WeightSource> weights;
  std::shared_ptr<const GgufFile> gguf;   // GGUF models only (vocab, chat template metadata)
  std::string path;                       // the model directory, or the .gguf file
  std::string format;                     // "safetensors" or "gguf"
  bool multimodal_config = false;         // nested gemma4 / gemma4_unified config.json
};

Result<OpenedModel> open_model(const std::string& path);

// Resolves every tensor of expected_tensors(config) through `w` (shapes and dtypes checked);
// returns the first error. Used by `gemma4 info` and the fixture tests.
Status verify_weights(const ModelConfig& config, const WeightSource& w);

}  // namespace g4
