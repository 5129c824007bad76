// Anthropic Messages API: POST /v1/messages (streaming with its event sequence, and not); the
// request body's translation is server/anthropic_request.cpp.
#include <chrono>

#include "server/context.h"
#include "server/live_generation.h"

namespace g4::server {
namespace {

using std::chrono::milliseconds;

std::string stop_reason(const LiveGeneration& g) {
  if (g.reason() == FinishReason::Length) return "max_tokens";  // cut off, tool calls or not
  if (g.tool_calls() > 0) return "tool_use";
  if (g.stopped_by_string()) return "stop_sequence";
  return g.reason() == FinishReason::Length ? "max_tokens" : "end_turn";
}
// The stop sequence that ended the message (with stop_reason "stop_sequence"), else null.
ojson stop_sequence(const LiveGeneration& g) {
  return stop_reason(g) == "stop_sequence" ? ojson(g.stop_sequence()) : ojson(nullptr);
}
// Streams with no event for this long get a ping (Anthropic's keep-alive event).
constexpr auto kPingEvery = std::chrono::seconds(10);

ojson usage_json(const Usage& u) {
  return {{"input_tokens", u.prompt_tokens - u.cached_tokens}, {"output_tokens", u.completion_tokens},
          {"cache_read_input_tokens", u.cached_tokens}, {"cache_creation_input_tokens", 0}};
}

std::string event(const char* name, const ojson& data) {
  return std::string("event: ") + name + "\ndata: " + data.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

void handle(Context& ctx, const http::Request& hreq, http::Response& res) {
  TextRequest r;
  r.sampling = ctx.sampling_defaults;  // the model's generation_config for what the request leaves out
  ApiError e;
  if (ctx.stopping.load()) {  // draining: running requests finish, new ones are refused
    ctx.metrics.count("/v1/messages", 503);
    return send_anthropic_error(res, {503, "overloaded_error", "the server is shutting down", ""});
  }
  auto guard = std::make_shared<InflightGuard>(ctx.inflight);
  ojson body;
  if (parse_body(hreq, body, e)) {
    if (auto err = read_anthropic_request(body, r)) e = *err;
    else if (auto aerr = select_adapter(ctx, body, r)) e = *aerr;
    else if (auto cerr = compile_constraint(ctx, r)) e = *cerr;
  }
  if (!e.message.empty()) {
    ctx.metrics.count("/v1/messages", e.status);
    return send_anthropic_error(res, e);
  }
  auto started = LiveGeneration::start(ctx.engine, ctx.bundle, r, ctx.opt.default_max_tokens,
                                       ctx.opt.allow_special_in_content);
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
      if (hreq.is_connection_closed()) {  // the client went away: free the slot
        gen->cancel();
        return;
      }
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
                 {"content", content}, {"stop_reason", stop_reason(*gen)}, {"stop_sequence", stop_sequence(*gen)},
                 {"usage", usage_json(gen->usage())}};
    res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }
  // Streaming: message_start, then per block content_block_start / _delta* / _stop, then
  // message_delta (stop_reason, usage) and message_stop.
  struct St {
    int phase = 0;
    int index = -1;
    std::string open;
    std::chrono::steady_clock::time_point last_sent;
  };
  auto st = std::make_shared<St>();
  const std::string model = ctx.model_id;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [gen, st, id, model, guard](size_t, http::DataSink& sink) -> bool {
        auto send = [&](const std::string& s) {
          if (!sink.is_writable() || !sink.write(s.data(), s.size())) {
            gen->cancel();
            return false;
          }
          st->last_sent = std::chrono::steady_clock::now();
          return true;
        };
        auto ping = [&]() { return send(event("ping", {{"type", "ping"}})); };
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
                       {"usage", {{"input_tokens", gen->prompt_size()}, {"output_tokens", 0}}}};
          if (!send(event("message_start", {{"type", "message_start"}, {"message", msg}}))) return false;
          if (!ping()) return false;
        }
        if (st->phase == 2) return false;
        std::vector<TextEvent> evs;
        const bool more = gen->next(evs, milliseconds(50));
        if (!sink.is_writable()) {
          gen->cancel();
          return false;
        }
        if (evs.empty() && more && std::chrono::steady_clock::now() - st->last_sent > kPingEvery && !ping())
          return false;
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
                                              {"delta", {{"stop_reason", stop_reason(*gen)}, {"stop_sequence", stop_sequence(*gen)}}},
                                              {"usage", u}}))) return false;
            send(event("message_stop", {{"type", "message_stop"}}));
          }
          sink.done();
        }
        return true;
      },
      [gen](bool) { gen->cancel(); });
}

// POST /v1/messages/count_tokens: the prompt a /v1/messages request with this body would submit
// (system, messages, tools, images through the chat template), counted without generating.
void count_tokens(Context& ctx, const http::Request& hreq, http::Response& res) {
  TextRequest r;
  ApiError e;
  ojson body;
  if (parse_body(hreq, body, e)) {
    if (body.is_object() && !body.contains("max_tokens")) body["max_tokens"] = 1;  // not a field of this endpoint
    if (auto err = read_anthropic_request(body, r)) e = *err;
  }
  if (e.message.empty()) {
    auto ids = LiveGeneration::prompt_ids(ctx.engine, ctx.bundle, r, ctx.opt.allow_special_in_content);
    if (auto* err = std::get_if<ApiError>(&ids)) {
      e = *err;
    } else {
      ctx.metrics.count("/v1/messages/count_tokens", 200);
      res.set_content(ojson{{"input_tokens", std::get<std::vector<int32_t>>(ids).size()}}.dump(), "application/json");
      return;
    }
  }
  ctx.metrics.count("/v1/messages/count_tokens", e.status);
  send_anthropic_error(res, e);
}

}  // namespace

void register_anthropic_routes(http::Server& svr, Context& ctx) {
  svr.Post("/v1/messages", [&ctx](const http::Request& q, http::Response& r) { handle(ctx, q, r); });
  svr.Post("/v1/messages/count_tokens", [&ctx](const http::Request& q, http::Response& r) { count_tokens(ctx, q, r); });
}

}  // namespace g4::server
