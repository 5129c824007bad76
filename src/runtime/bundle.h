// Everything needed to talk to a model in text: the model, its tokenizer, its own chat template
// (when it ships one), and the token ids that end a turn.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "io/gguf.h"
#include "model/model.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "vision/vision_encoder.h"

namespace g4 {

struct ModelBundle {
  std::unique_ptr<Model> model;
  std::shared_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;  // absent: a base model (complete text instead)
  ChatRenderOptions render_defaults;          // bos/eos strings for the template
  std::vector<int32_t> stop_ids;              // eos ids of config/generation_config + end of turn
  std::string path;                           // what was loaded
  std::string format;                         // "safetensors" | "gguf"
  std::string name;                           // a display name (directory or file name)
  // The vision encoder when the checkpoint has one (gemma4 config with vision_config and the
  // tower's weights), else null. Declared after `model`: it runs on the model's backend.
  std::unique_ptr<VisionEncoder> vision;
};

// The chat template a GGUF file carries (tokenizer.chat_template; none when absent), and in
// `tokens` (when given) the bos / eos token texts the template sees.
Result<std::optional<ChatTemplate>> gguf_chat_template(const GgufFile& f, const Tokenizer& tok,
                                                       ChatRenderOptions* tokens);

// Loads model + tokenizer + chat template from `path` (empty: the default starter model).
// `progress` receives one-line messages while loading (may be null); opt: the device backend's
// options.
Result<ModelBundle> load_bundle(const std::string& path, const std::string& backend,
                                void (*progress)(const std::string&) = nullptr, const BackendOptions& opt = {});

// Token ids of a raw text prompt: BOS first when the tokenizer wants one (and the text does not
// already start with it); special-token strings in the text are NOT parsed.
std::vector<int32_t> encode_raw_prompt(const ModelBundle& b, const std::string& text);
// Token ids of a rendered chat prompt (special-token strings parsed, no BOS added: the template
// writes it).
std::vector<int32_t> encode_chat_prompt(const ModelBundle& b, const std::string& rendered);

}  // namespace g4
