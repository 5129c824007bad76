// ChatTemplate: transformers' apply_chat_template pipeline on top of the jinja interpreter.
// Mirrors transformers/utils/chat_template_utils.py (render_jinja_template,
// _alias_reasoning_fields) and tokenization_utils_base.py (apply_chat_template).
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "io/json_bounded.h"

namespace g4 {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return err("%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

Result<ojson> read_json(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::string text, read_text(path));
  std::string why;
  auto j = parse_json_bounded<ojson>(text, JsonLimits{}, why);
  if (!j) return err("%s: invalid JSON: %s", path.c_str(), why.c_str());
  return std::move(*j);
}

// A special token in tokenizer_config.json: "<bos>" or an AddedToken dict {"content": "<bos>"}.
std::optional<std::string> token_text(const ojson& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_string(const std::string& source, const std::string& origin) {
  auto t = jinja::Template::parse(source);
  if (!t) return err("%s %s", origin.c_str(), t.message().c_str());
  ChatTemplate c;
  c.source_ = source;
  c.origin_ = origin;
  c.tpl_ = std::move(t).value();
  return c;
}

Result<ChatTemplate> ChatTemplate::from_file(const std::string& path) {
  G4_ASSIGN_OR_RETURN(std::string text, read_text(path));
  return from_string(text, path);
}

Result<ChatTemplate> ChatTemplate::from_model_dir(const std::string& dir, ChatRenderOptions* tokens) {
  std::error_code ec;
  fs::path d(dir);
  fs::path cfg = d / "tokenizer_config.json";
  ojson config;
  if (fs::exists(cfg, ec)) {
    G4_ASSIGN_OR_RETURN(config, read_json(cfg.string()));
    if (tokens && config.is_object()) {
      if (config.contains("bos_token"))
        if (auto t = token_text(config["bos_token"])) tokens->bos_token = *t;
      if (config.contains("eos_token"))
        if (auto t = token_text(config["eos_token"])) tokens->eos_token = *t;
      for (const char* k : {"unk_token", "pad_token"})
        if (config.contains(k))
          if (auto t = token_text(config[k])) tokens->other_special_tokens[k] = *t;
    }
  }
  // Older checkpoints keep the special tokens in special_tokens_map.json only.
  fs::path stm = d / "special_tokens_map.json";
  if (tokens && fs::exists(stm, ec) && !(config.is_object() && config.contains("bos_token"))) {
    auto sm = read_json(stm.string());
    if (sm && sm->is_object()) {
      if (sm->contains("bos_token"))
        if (auto t = token_text((*sm)["bos_token"])) tokens->bos_token = *t;
      if (sm->contains("eos_token"))
        if (auto t = token_text((*sm)["eos_token"])) tokens->eos_token = *t;
    }
  }
  fs::path jinja_file = d / "chat_template.jinja";
  if (fs::exists(jinja_file, ec)) return from_file(jinja_file.string());
  fs::path json_file = d / "chat_template.json";
  if (fs::exists(json_file, ec)) {
    G4_ASSIGN_OR_RETURN(ojson j, read_json(json_file.string()));
    if (j.is_object() && j.contains("chat_template") && j["chat_template"].is_string())
      return from_string(j["chat_template"].get<std::string>(), json_file.string());
    return err("%s: no string field chat_template", json_file.string().c_str());
  }
  if (config.is_object() && config.contains("chat_template")) {
    const ojson& ct = config["chat_template"];
    if (ct.is_string()) return from_string(ct.get<std::string>(), cfg.string());
    if (ct.is_array()) {
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          return from_string(e["template"].get<std::string>(), cfg.string() + " (default)");
      return err("%s: chat_template list has no 'default' entry", cfg.string().c_str());
    }
    return err("%s: chat_template is neither a string nor a list", cfg.string().c_str());
  }
  return err("%s: no chat_template.jinja, chat_template.json or tokenizer_config.json chat_template", dir.c_str());
}

Result<std::string> ChatTemplate::render(const ojson& messages, const ojson& tools,
                                         const ChatRenderOptions& options) const {
  using jinja::Value;
  if (!messages.is_array()) return err("%s: messages must be a JSON array", origin_.c_str());
  if (messages.empty()) return err("%s: cannot apply a chat template to an empty conversation", origin_.c_str());
  if (!tools.is_null() && !tools.is_array()) return err("%s: tools must be a JSON array or null", origin_.c_str());

  jinja::List chat;
  for (size_t i = 0; i < messages.size(); ++i) {
    const ojson& m = messages[i];
    if (!m.is_object()) return err("%s: message %zu is not an object", origin_.c_str(), i);
    // _normalize_chat_messages: drop keys whose value is None.
    ojson msg = ojson::object();
    for (auto it = m.begin(); it != m.end(); ++it)
      if (!it.value().is_null()) msg[it.key()] = it.value();
    // _alias_reasoning_fields.
    const ojson* reasoning = nullptr;
    for (const char* k : {"reasoning_content", "thinking", "reasoning"})
      if (!reasoning && msg.contains(k) && !msg[k].is_null()) reasoning = &msg[k];
    if (reasoning) {
      ojson r = *reasoning;
      ojson aliased = ojson::object();
      aliased["thinking"] = r;
      for (auto it = msg.begin(); it != msg.end(); ++it) aliased[it.key()] = it.value();
      aliased["reasoning_content"] = r;
      msg = std::move(aliased);
    }
    chat.push_back(jinja::from_json(msg));
  }

  Value ctx = Value::make_dict();
  jinja::Dict& d = *ctx.dict;
  d.set("bos_token", Value::string(options.bos_token));
  d.set("eos_token", Value::string(options.eos_token));
  for (auto& kv : options.other_special_tokens) d.set(kv.first, Value::string(kv.second));
  if (options.enable_thinking) d.set("enable_thinking", Value::boolean(*options.enable_thinking));
  if (options.extra.is_object())
    for (auto it = options.extra.begin(); it != options.extra.end(); ++it) d.set(it.key(), jinja::from_json(it.value()));
  d.set("messages", Value::make_list(std::move(chat)));
  d.set("tools", tools.is_null() ? Value::none() : jinja::from_json(tools));
  d.set("documents", Value::none());
  d.set("add_generation_prompt", Value::boolean(options.add_generation_prompt));

  auto out = tpl_.render(ctx);
  if (!out) return err("%s %s", origin_.c_str(), out.message().c_str());
  return out;
}

}  // namespace g4
