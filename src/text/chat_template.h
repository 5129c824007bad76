// Chat templates: OpenAI-style messages (+ tools) -> prompt text, rendered exactly as
// transformers' `tokenizer.apply_chat_template(..., tokenize=False)` does:
//   1. _normalize_chat_messages: drop message keys whose value is null;
//   2. _alias_reasoning_fields: a message with reasoning under `reasoning_content`, `thinking`
//      or `reasoning` gets it under `thinking` (first key) and `reasoning_content` (kept/last);
//   3. template variables: the special tokens (bos_token, eos_token, ...), then the extra kwargs
//      (enable_thinking when set), messages, tools (None when absent), documents=None,
//      add_generation_prompt;
//   4. the jinja2 interpreter of jinja_template.h (trim_blocks, lstrip_blocks).
#pragma once
#include <map>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/jinja_template.h"

namespace g4 {

struct ChatRenderOptions {
  bool add_generation_prompt = true;
  std::optional<bool> enable_thinking;         // unset: the variable is not defined at all
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();  // more template kwargs
  std::string bos_token = "<bos>";
  std::string eos_token = "<eos>";
  std::map<std::string, std::string> other_special_tokens;  // unk_token, pad_token, ...
};

class ChatTemplate {
 public:
  // `origin` names the template in error messages ("FILE line N: ...").
  static Result<ChatTemplate> from_string(const std::string& source, const std::string& origin = "chat template");
  static Result<ChatTemplate> from_file(const std::string& path);
  // A model directory: chat_template.jinja, else chat_template.json {"chat_template": ...}, else
  // tokenizer_config.json's chat_template (a string, or a list of {name, template}: "default").
  // Also reads bos_token/eos_token from tokenizer_config.json into `tokens` when given.
  static Result<ChatTemplate> from_model_dir(const std::string& dir, ChatRenderOptions* tokens = nullptr);

  // messages: JSON array of message objects; tools: JSON array or null.
  Result<std::string> render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                             const ChatRenderOptions& options) const;

  const std::string& source() const { return source_; }
  const std::string& origin() const { return origin_; }

 private:
  std::string source_, origin_;
  jinja::Template tpl_;
};

}  // namespace g4
