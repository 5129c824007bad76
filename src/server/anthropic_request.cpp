// Anthropic Messages request bodies -> TextRequest: text / image (base64) / tool_use / tool_result /
// thinking blocks translated to the chat template's OpenAI-style messages.
#include "server/api_types.h"
#include "server/data_url.h"

namespace g4::server {
namespace {

ApiError bad(const std::string& param, const std::string& msg) {
  return ApiError{400, "invalid_request_error", msg, param};
}

// o[key] when o is an object and the field is a string, else "" (never throws on client JSON).
std::string str_of(const ojson& o, const char* key) {
  if (!o.is_object()) return "";
  auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// Text of a string or an array of text blocks.
std::optional<ApiError> block_text(const ojson& c, const std::string& where, std::string& out) {
  if (c.is_string()) {
    out = c.get<std::string>();
    return std::nullopt;
  }
  if (!c.is_array()) return bad(where, where + " must be a string or an array of blocks");
  for (const auto& b : c) {
    if (!b.is_object() || str_of(b, "type") != "text" || !b.contains("text") || !b["text"].is_string())
      return bad(where, where + ": only text blocks are allowed here");
    out += b["text"].get<std::string>();
  }
  return std::nullopt;
}

std::optional<ApiError> to_template_messages(const ojson& body, ojson& out, std::vector<ImageInput>& images) {
  out = ojson::array();
  if (auto s = body.find("system"); s != body.end() && !s->is_null()) {
    std::string text;
    if (auto e = block_text(*s, "system", text)) return e;
    out.push_back({{"role", "system"}, {"content", text}});
  }
  auto msgs = body.find("messages");
  if (msgs == body.end() || !msgs->is_array() || msgs->empty())
    return bad("messages", "'messages' must be a non-empty array");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const ojson& m = (*msgs)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return bad(where, where + " needs a string 'role'");
    const std::string role = m["role"].get<std::string>();
    if (role != "user" && role != "assistant")
      return bad(where + ".role", "role must be 'user' or 'assistant'");
    if (!m.contains("content")) return bad(where + ".content", where + " needs 'content'");
    const ojson& c = m["content"];
    if (c.is_string()) {
      out.push_back({{"role", role}, {"content", c}});
      continue;
    }
    if (!c.is_array()) return bad(where + ".content", "content must be a string or an array of blocks");
    std::string text, thinking;
    ojson calls = ojson::array();
    ojson parts = ojson::array();  // text and image parts, when a user message holds images
    for (const auto& b : c) {
      const std::string t = str_of(b, "type");
      if (t == "text") {
        if (!b.contains("text") || !b["text"].is_string()) return bad(where + ".content", "text blocks need 'text'");
        text += b["text"].get<std::string>();
      } else if (t == "image" && role == "user") {
        // {"type": "image", "source": {"type": "base64", "media_type": ..., "data": ...}}
        const std::string pw = where + ".content[" + std::to_string(&b - &c[0]) + "]";
        const ojson src = b.value("source", ojson());
        if (!src.is_object() || str_of(src, "type") != "base64" || !src.contains("data") || !src["data"].is_string())
          return bad(pw, str_of(src, "type") == "url"
                             ? "remote image URLs are not fetched by this server; send the image as base64"
                             : pw + " needs source {type: base64, media_type, data}");
        auto bytes = base64_decode(src["data"].get<std::string>());
        if (!bytes) return bad(pw, pw + ": the base64 data is invalid");
        images.push_back(ImageInput{std::move(*bytes), pw});
        if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
        text.clear();
        parts.push_back({{"type", "image"}});
      } else if (t == "document" || t == "image") {
        return bad(where + ".content", "'" + t + "' blocks are not supported here");
      } else if (t == "thinking" && role == "assistant") {
        thinking += str_of(b, "thinking");
      } else if (t == "redacted_thinking") {
        continue;
      } else if (t == "tool_use" && role == "assistant") {
        if (!b.contains("name") || !b["name"].is_string()) return bad(where + ".content", "tool_use blocks need 'name'");
        calls.push_back({{"id", str_of(b, "id")}, {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", b.value("input", ojson::object())}}}});
      } else if (t == "tool_result" && role == "user") {
        std::string rt;
        if (b.contains("content")) {
          if (auto e = block_text(b["content"], where + ".content.tool_result", rt)) return e;
        }
        out.push_back({{"role", "tool"}, {"tool_call_id", str_of(b, "tool_use_id")}, {"content", rt}});
      } else {
        return bad(where + ".content", "unsupported content block type '" + t + "'");
      }
    }
    if (role == "assistant") {
      ojson a = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) a["reasoning_content"] = thinking;
      if (!calls.empty()) a["tool_calls"] = calls;
      out.push_back(a);
    } else if (!parts.empty()) {
      if (!text.empty()) parts.push_back({{"type", "text"}, {"text", text}});
      out.push_back({{"role", "user"}, {"content", parts}});
    } else if (!text.empty()) {
      out.push_back({{"role", "user"}, {"content", text}});
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_anthropic_request(const ojson& body, TextRequest& r) {
  std::optional<long> mt;
  if (auto err = read_int(body, "max_tokens", 1, 1L << 30, mt)) return *err;
  if (!mt) return bad("max_tokens", "'max_tokens' is required");
  r.max_tokens = int(*mt);
  std::optional<double> d;
  std::optional<long> i;
  if (auto err = read_number(body, "temperature", 0, 1, d)) return *err;
  r.sampling.temperature = d ? float(*d) : 1.0f;  // the Messages API default
  d.reset();
  if (auto err = read_number(body, "top_p", 0, 1, d)) return *err;
  if (d) r.sampling.top_p = float(*d);
  if (auto err = read_int(body, "top_k", 0, 1L << 30, i)) return *err;
  if (i) r.sampling.top_k = int(*i);
  if (auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
    if (!s->is_array()) return bad("stop_sequences", "'stop_sequences' must be an array of strings");
    for (auto& x : *s) {
      if (!x.is_string() || x.get<std::string>().empty())
        return bad("stop_sequences", "'stop_sequences' must be non-empty strings");
      r.stop.push_back(x.get<std::string>());
    }
  }
  std::optional<bool> st;
  if (auto err = read_bool(body, "stream", st)) return *err;
  r.stream = st.value_or(false);
  if (auto t = body.find("thinking"); t != body.end() && t->is_object())
    r.thinking = str_of(*t, "type") == "enabled";
  if (auto err = to_template_messages(body, r.messages, r.images)) return *err;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return bad("tools", "'tools' must be an array");
    r.tools = ojson::array();
    for (auto& tool : *t) {
      if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string())
        return bad("tools", "each tool needs a 'name'");
      r.tools.push_back({{"type", "function"},
                         {"function", {{"name", tool["name"]}, {"description", str_of(tool, "description")},
                                       {"parameters", tool.value("input_schema", ojson::object())}}}});
    }
  }
  if (auto err = read_anthropic_tool_choice(body, r)) return *err;
  r.chat = true;
  return std::nullopt;
}


}  // namespace g4::server
