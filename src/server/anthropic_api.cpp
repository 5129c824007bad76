// Anthropic Messages API: POST /v1/messages (streaming with its event sequence, and not),
// text / image (base64) / tool_use / tool_result / thinking blocks, translated to and from the chat template's
// OpenAI-style messages.
#include <chrono>

#include "server/context.h"
#include "server/data_url.h"
#include "server/live_generation.h"

namespace g4::server {
namespace {

using std::chrono::milliseconds;

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

bool read_request(Context& ctx, const httplib::Request& hreq, TextRequest& r, ApiError& e) {
  ojson body;
  if (!parse_body(hreq, body, e)) return false;
  std::optional<long> mt;
  if (auto err = read_int(body, "max_tokens", 1, 1L << 30, mt)) return e = *err, false;
  if (!mt) return e = bad("max_tokens", "'max_tokens' is required"), false;
  r.max_tokens = int(*mt);
  std::optional<double> d;
  std::optional<long> i;
  if (auto err = read_number(body, "temperature", 0, 1, d)) return e = *err, false;
  r.sampling.temperature = d ? float(*d) : 1.0f;  // the Messages API default
  d.reset();
  if (auto err = read_number(body, "top_p", 0, 1, d)) return e = *err, false;
  if (d) r.sampling.top_p = float(*d);
  if (auto err = read_int(body, "top_k", 0, 1L << 30, i)) return e = *err, false;
  if (i) r.sampling.top_k = int(*i);
  if (auto s = body.find("stop_sequences"); s != body.end() && !s->is_null()) {
    if (!s->is_array()) return e = bad("stop_sequences", "'stop_sequences' must be an array of strings"), false;
    for (auto& x : *s) {
      if (!x.is_string() || x.get<std::string>().empty())
        return e = bad("stop_sequences", "'stop_sequences' must be non-empty strings"), false;
      r.stop.push_back(x.get<std::string>());
    }
  }
  std::optional<bool> st;
  if (auto err = read_bool(body, "stream", st)) return e = *err, false;
  r.stream = st.value_or(false);
  if (auto t = body.find("thinking"); t != body.end() && t->is_object())
    r.thinking = str_of(*t, "type") == "enabled";
  if (auto err = to_template_messages(body, r.messages, r.images)) return e = *err, false;
  if (auto t = body.find("tools"); t != body.end() && !t->is_null()) {
    if (!t->is_array()) return e = bad("tools", "'tools' must be an array"), false;
    r.tools = ojson::array();
    for (auto& tool : *t) {
      if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string())
        return e = bad("tools", "each tool needs a 'name'"), false;
      r.tools.push_back({{"type", "function"},
                         {"function", {{"name", tool["name"]}, {"description", str_of(tool, "description")},
                                       {"parameters", tool.value("input_schema", ojson::object())}}}});
    }
    if (auto tc = body.find("tool_choice"); tc != body.end() && tc->is_object() && str_of(*tc, "type") == "none")
      r.tools = nullptr;
  }
  r.chat = true;
  return true;
}

std::string stop_reason(const LiveGeneration& g) {
  if (g.tool_calls() > 0) return "tool_use";
  if (g.stopped_by_string()) return "stop_sequence";
  return g.reason() == FinishReason::Length ? "max_tokens" : "end_turn";
}

ojson usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens}, {"output_tokens", u.completion_tokens},
          {"cache_read_input_tokens", u.cached_tokens}, {"cache_creation_input_tokens", 0}};
}

std::string event(const char* name, const ojson& data) {
  return std::string("event: ") + name + "\ndata: " + data.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

void handle(Context& ctx, const httplib::Request& hreq, httplib::Response& res) {
  TextRequest r;
  ApiError e;
  if (ctx.stopping.load()) {  // draining: running requests finish, new ones are refused
    ctx.metrics.count("/v1/messages", 503);
    return send_anthropic_error(res, {503, "overloaded_error", "the server is shutting down", ""});
  }
  auto guard = std::make_shared<InflightGuard>(ctx.inflight);
  if (!read_request(ctx, hreq, r, e)) {
    ctx.metrics.count("/v1/messages", e.status);
    return send_anthropic_error(res, e);
  }
  auto started = LiveGeneration::start(ctx.engine, ctx.bundle, r, ctx.opt.default_max_tokens);
  if (auto* err = std::get_if<ApiError>(&started)) {
    ctx.metrics.count("/v1/messages", err->status);
    return send_anthropic_error(res, *err);
  }
  auto gen = std::get<std::shared_ptr<LiveGeneration>>(started);
  ctx.metrics.count("/v1/messages", 200);
  const std::string id = new_id("msg_");
  if (!r.stream) {
    ojson content = ojson::array();
    auto append = [&](const char* type, const char* field, const std::string& t) {
      if (!content.empty() && content.back()["type"] == type) {
        content.back()[field] = content.back()[field].get<std::string>() + t;
      } else {
        ojson b = {{"type", type}, {field, t}};
        if (std::string(type) == "thinking") b["signature"] = "";
        content.push_back(b);
      }
    };
    std::vector<TextEvent> evs;
    while (gen->next(evs, milliseconds(100))) {
      for (auto& te : evs) {
        if (te.kind == TextEvent::kContent) append("text", "text", te.text);
        if (te.kind == TextEvent::kReasoning) append("thinking", "thinking", te.text);
        if (te.kind == TextEvent::kToolCall)
          content.push_back({{"type", "tool_use"}, {"id", new_id("toolu_")}, {"name", te.call.name}, {"input", te.call.arguments}});
      }
      evs.clear();
    }
    if (gen->reason() == FinishReason::Error) return send_anthropic_error(res, {500, "api_error", gen->error(), ""});
    ojson out = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", ctx.model_id},
                 {"content", content}, {"stop_reason", stop_reason(*gen)}, {"stop_sequence", nullptr},
                 {"usage", usage_json(gen->usage())}};
    res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }
  // Streaming: message_start, then per block content_block_start / _delta* / _stop, then
  // message_delta (stop_reason, usage) and message_stop.
  struct St { int phase = 0; int index = -1; std::string open; };
  auto st = std::make_shared<St>();
  const std::string model = ctx.model_id;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [gen, st, id, model, guard](size_t, httplib::DataSink& sink) -> bool {
        auto send = [&](const std::string& s) {
          if (!sink.is_writable() || !sink.write(s.data(), s.size())) {
            gen->cancel();
            return false;
          }
          return true;
        };
        auto close_block = [&]() {
          if (st->open.empty()) return true;
          st->open.clear();
          return send(event("content_block_stop", {{"type", "content_block_stop"}, {"index", st->index}}));
        };
        auto open_block = [&](const std::string& kind, const ojson& block) {
          if (st->open == kind && kind != "tool_use") return true;
          if (!close_block()) return false;
          st->open = kind;
          ++st->index;
          return send(event("content_block_start", {{"type", "content_block_start"}, {"index", st->index}, {"content_block", block}}));
        };
        if (st->phase == 0) {
          st->phase = 1;
          ojson msg = {{"id", id}, {"type", "message"}, {"role", "assistant"}, {"model", model},
                       {"content", ojson::array()}, {"stop_reason", nullptr}, {"stop_sequence", nullptr},
                       {"usage", {{"input_tokens", 0}, {"output_tokens", 0}}}};
          if (!send(event("message_start", {{"type", "message_start"}, {"message", msg}}))) return false;
        }
        if (st->phase == 2) return false;
        std::vector<TextEvent> evs;
        const bool more = gen->next(evs, milliseconds(50));
        if (!sink.is_writable()) {
          gen->cancel();
          return false;
        }
        for (auto& te : evs) {
          if (te.kind == TextEvent::kContent) {
            if (!open_block("text", {{"type", "text"}, {"text", ""}})) return false;
            if (!send(event("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index},
                                                    {"delta", {{"type", "text_delta"}, {"text", te.text}}}}))) return false;
          } else if (te.kind == TextEvent::kReasoning) {
            if (!open_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}})) return false;
            if (!send(event("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index},
                                                    {"delta", {{"type", "thinking_delta"}, {"thinking", te.text}}}}))) return false;
          } else {
            if (!open_block("tool_use", {{"type", "tool_use"}, {"id", new_id("toolu_")}, {"name", te.call.name}, {"input", ojson::object()}}))
              return false;
            if (!send(event("content_block_delta", {{"type", "content_block_delta"}, {"index", st->index},
                                                    {"delta", {{"type", "input_json_delta"}, {"partial_json", te.call.arguments_json()}}}})))
              return false;
            if (!close_block()) return false;
          }
        }
        if (!more || gen->finished()) {
          st->phase = 2;
          if (gen->reason() == FinishReason::Error) {
            send(event("error", {{"type", "error"}, {"error", {{"type", "api_error"}, {"message", gen->error()}}}}));
          } else {
            if (!close_block()) return false;
            ojson u = usage_json(gen->usage());
            if (!send(event("message_delta", {{"type", "message_delta"},
                                              {"delta", {{"stop_reason", stop_reason(*gen)}, {"stop_sequence", nullptr}}},
                                              {"usage", u}}))) return false;
            send(event("message_stop", {{"type", "message_stop"}}));
          }
          sink.done();
        }
        return true;
      },
      [gen](bool) { gen->cancel(); });
}

}  // namespace

void register_anthropic_routes(httplib::Server& svr, Context& ctx) {
  svr.Post("/v1/messages", [&ctx](const httplib::Request& q, httplib::Response& r) { handle(ctx, q, r); });
}

}  // namespace g4::server
