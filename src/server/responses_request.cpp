// The Responses API request as a chat-completions body; see responses_request.h.
#include "server/responses_request.h"

namespace g4::server {
namespace {

ApiError bad(const std::string& param, const std::string& msg) {
  return ApiError{400, "invalid_request_error", msg, param};
}

// A message item's content: a string, or parts (input_text / output_text / refusal as text,
// input_image with a data: URL as an image part).
std::optional<ApiError> convert_content(const ojson& c, const std::string& where, ojson& out) {
  if (c.is_string()) {
    out = c;
    return std::nullopt;
  }
  if (!c.is_array()) return bad(where, "'" + where + "' must be a string or an array of content parts");
  out = ojson::array();
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string at = where + "[" + std::to_string(i) + "]";
    const std::string type = p.is_object() && p.contains("type") && p["type"].is_string() ? p["type"].get<std::string>() : "";
    if (type == "input_text" || type == "output_text" || type == "text") {
      if (!p.contains("text") || !p["text"].is_string()) return bad(at + ".text", "'" + at + ".text' must be a string");
      out.push_back({{"type", "text"}, {"text", p["text"]}});
    } else if (type == "refusal") {
      if (!p.contains("refusal") || !p["refusal"].is_string())
        return bad(at + ".refusal", "'" + at + ".refusal' must be a string");
      out.push_back({{"type", "text"}, {"text", p["refusal"]}});
    } else if (type == "input_image") {
      if (!p.contains("image_url") || !p["image_url"].is_string())
        return bad(at + ".image_url", "'" + at + ".image_url' must be a data: URL (file ids are not supported)");
      out.push_back({{"type", "image_url"}, {"image_url", {{"url", p["image_url"]}}}});
    } else {
      return bad(at + ".type", "'" + at + ".type' must be input_text, output_text, refusal or input_image");
    }
  }
  return std::nullopt;
}

// `input` items appended to `msgs` (chat-completions messages).
std::optional<ApiError> convert_input(const ojson& input, ojson& msgs) {
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return std::nullopt;
  }
  if (!input.is_array()) return bad("input", "'input' must be a string or an array of items");
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& it = input[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) return bad(at, "'" + at + "' must be an object");
    const std::string type = it.contains("type") && it["type"].is_string() ? it["type"].get<std::string>() : "message";
    if (type == "message") {
      const std::string role = it.contains("role") && it["role"].is_string() ? it["role"].get<std::string>() : "";
      if (role != "user" && role != "assistant" && role != "system" && role != "developer")
        return bad(at + ".role", "'" + at + ".role' must be user, assistant, system or developer");
      ojson content;
      if (auto e = convert_content(it.value("content", ojson()), at + ".content", content)) return e;
      msgs.push_back({{"role", role == "developer" ? "system" : role}, {"content", content}});
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"})
        if (!it.contains(k) || !it[k].is_string())
          return bad(at + "." + k, "'" + at + "." + k + "' must be a string");
      const ojson call = {{"id", it["call_id"]}, {"type", "function"},
                          {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      // Consecutive calls join one assistant turn.
      if (!msgs.empty() && msgs.back()["role"] == "assistant" && msgs.back().contains("tool_calls"))
        msgs.back()["tool_calls"].push_back(call);
      else
        msgs.push_back({{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array({call})}});
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string())
        return bad(at + ".call_id", "'" + at + ".call_id' must be a string");
      const ojson& out = it.value("output", ojson());
      ojson text;
      if (out.is_string()) text = out;
      else if (auto e = convert_content(out, at + ".output", text)) return e;
      ojson m = {{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", text}};
      for (const ojson& prev : msgs)  // the function's name, for templates that write it
        if (prev.contains("tool_calls"))
          for (const ojson& c : prev["tool_calls"])
            if (c["id"] == it["call_id"]) m["name"] = c["function"]["name"];
      msgs.push_back(std::move(m));
    } else if (type == "reasoning") {
      continue;  // a previous answer's reasoning: not part of the prompt (as the chat template does)
    } else {
      return bad(at + ".type", "'" + at + ".type' must be message, function_call, function_call_output or reasoning");
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> responses_to_chat(const ojson& body, const ResponseStore& store, ojson& chat,
                                          ojson& conversation) {
  chat = ojson::object();
  conversation = ojson::array();
  if (auto p = body.find("previous_response_id"); p != body.end() && !p->is_null()) {
    if (!p->is_string()) return bad("previous_response_id", "'previous_response_id' must be a string");
    auto prev = store.get(p->get<std::string>());
    if (!prev)
      return ApiError{404, "invalid_request_error",
                      "no stored response '" + p->get<std::string>() + "' (responses live as long as the server)",
                      "previous_response_id"};
    conversation = prev->messages;
  }
  if (!body.contains("input")) return bad("input", "'input' is required");
  if (auto st = body.find("store"); st != body.end() && !st->is_null() && !st->is_boolean())
    return bad("store", "'store' must be a boolean");
  if (auto e = convert_input(body["input"], conversation)) return e;
  ojson msgs = ojson::array();
  if (auto ins = body.find("instructions"); ins != body.end() && !ins->is_null()) {
    if (!ins->is_string()) return bad("instructions", "'instructions' must be a string");
    msgs.push_back({{"role", "system"}, {"content", *ins}});
  }
  for (const ojson& m : conversation) msgs.push_back(m);
  chat["messages"] = std::move(msgs);
  for (const char* k : {"temperature", "top_p", "top_k", "min_p", "seed", "stop", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "stream", "parallel_tool_calls"})
    if (auto v = body.find(k); v != body.end()) chat[k] = *v;
  if (auto v = body.find("max_output_tokens"); v != body.end()) chat["max_tokens"] = *v;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return bad("tools", "'tools' must be an array");
    ojson tools = ojson::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const ojson& tool = (*t)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      if (!tool.is_object() || tool.value("type", ojson()) != "function" || !tool.contains("name") ||
          !tool["name"].is_string())
        return bad(at, "'" + at + "' must be {type: 'function', name, parameters} (only function tools here)");
      tools.push_back({{"type", "function"},
                       {"function", {{"name", tool["name"]}, {"description", tool.value("description", ojson(""))},
                                     {"parameters", tool.value("parameters", ojson::object())}}}});
    }
    chat["tools"] = std::move(tools);
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_object() && c->value("type", ojson()) == "function") {
      if (!c->contains("name") || !(*c)["name"].is_string())
        return bad("tool_choice", "'tool_choice' of type 'function' needs the function's 'name'");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*c)["name"]}}}};
    } else if (c->is_string()) {
      chat["tool_choice"] = *c;
    } else {
      return bad("tool_choice", "'tool_choice' must be none, auto, required or {type: 'function', name}");
    }
  }
  if (auto t = body.find("text"); t != body.end() && t->is_object()) {
    if (auto f = t->find("format"); f != t->end() && f->is_object()) {
      const ojson type = f->value("type", ojson());
      if (type == "json_schema")
        chat["response_format"] = {{"type", "json_schema"},
                                   {"json_schema", {{"name", f->value("name", ojson("schema"))},
                                                    {"schema", f->value("schema", ojson())},
                                                    {"strict", f->value("strict", ojson(false))}}}};
      else if (type == "json_object" || type == "text")
        chat["response_format"] = {{"type", type}};
      else
        return bad("text.format.type", "'text.format.type' must be text, json_object or json_schema");
    }
  }
  if (auto r = body.find("reasoning"); r != body.end() && r->is_object())
    if (auto e = r->find("effort"); e != r->end() && e->is_string()) chat["reasoning_effort"] = *e;
  return std::nullopt;
}

std::string responses_param(const std::string& p) {
  for (auto [from, to] : {std::pair<const char*, const char*>{"messages", "input"}, {"max_tokens", "max_output_tokens"},
                          {"response_format", "text.format"}})
    if (p.rfind(from, 0) == 0) return to + p.substr(std::char_traits<char>::length(from));
  return p;
}

}  // namespace g4::server
