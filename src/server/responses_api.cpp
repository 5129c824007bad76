// OpenAI's Responses API: POST /v1/responses (a response object, or its server-sent event
// sequence: response.created, output items added, text / reasoning / function-call argument
// deltas, items done, response.completed), GET and DELETE /v1/responses/{id} for stored ones.
// Requests run through the chat machinery (responses_request.h); the answer's reasoning, text
// and tool calls become reasoning, message and function_call output items, in that order.
#include <chrono>
#include <memory>

#include "server/context.h"
#include "server/live_generation.h"
#include "server/responses_request.h"

namespace g4::server {
namespace {

using std::chrono::milliseconds;
constexpr const char* kEndpoint = "/v1/responses";

struct Answer {
  std::string reasoning, text;
  ojson calls = ojson::array();  // function_call items
};

ojson text_part(const std::string& text) {
  return {{"type", "output_text"}, {"text", text}, {"annotations", ojson::array()}, {"logprobs", ojson::array()}};
}
ojson message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"type", "message"}, {"id", id}, {"status", status}, {"role", "assistant"},
          {"content", ojson::array({text_part(text)})}};
}
ojson reasoning_item(const std::string& id, const std::string& text) {
  return {{"type", "reasoning"}, {"id", id}, {"summary", ojson::array()},
          {"content", ojson::array({{{"type", "reasoning_text"}, {"text", text}}})}};
}
ojson call_item(const ToolCall& c) {
  return {{"type", "function_call"}, {"id", new_id("fc_")}, {"call_id", new_id("call_")}, {"name", c.name},
          {"arguments", c.arguments_json()}, {"status", "completed"}};
}

// What a response echoes of its request, and where it stands.
struct Echo {
  std::string id, model;
  long created = 0;
  ojson request;  // the Responses body
};

ojson response_json(const Echo& e, const std::string& status, const ojson& output, const LiveGeneration* gen) {
  const ojson& b = e.request;
  auto field = [&](const char* k, ojson dflt) { return b.contains(k) ? b[k] : dflt; };
  ojson r = {{"id", e.id}, {"object", "response"}, {"created_at", e.created}, {"status", status},
             {"error", nullptr}, {"incomplete_details", nullptr}, {"instructions", field("instructions", nullptr)},
             {"max_output_tokens", field("max_output_tokens", nullptr)}, {"model", e.model}, {"output", output},
             {"parallel_tool_calls", field("parallel_tool_calls", true)},
             {"previous_response_id", field("previous_response_id", nullptr)},
             {"reasoning", {{"effort", b.contains("reasoning") && b["reasoning"].is_object()
                                           ? b["reasoning"].value("effort", ojson()) : ojson()},
                            {"summary", nullptr}}},
             {"store", field("store", true)}, {"temperature", field("temperature", nullptr)},
             {"text", field("text", ojson{{"format", {{"type", "text"}}}})}, {"tool_choice", field("tool_choice", "auto")},
             {"tools", field("tools", ojson::array())}, {"top_p", field("top_p", nullptr)}, {"truncation", "disabled"},
             {"metadata", field("metadata", ojson::object())}, {"usage", nullptr}};
  if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
  if (gen) {
    const Usage& u = gen->usage();
    r["usage"] = {{"input_tokens", u.prompt_tokens}, {"input_tokens_details", {{"cached_tokens", u.cached_tokens}}},
                  {"output_tokens", u.completion_tokens}, {"output_tokens_details", {{"reasoning_tokens", 0}}},
                  {"total_tokens", u.prompt_tokens + u.completion_tokens}};
  }
  return r;
}

// The output items of a finished answer (message ids given, so streamed ids stay the same).
ojson output_of(const Answer& a, const std::string& reasoning_id, const std::string& message_id) {
  ojson out = ojson::array();
  if (!a.reasoning.empty()) out.push_back(reasoning_item(reasoning_id, a.reasoning));
  if (!a.text.empty() || a.calls.empty()) out.push_back(message_item(message_id, a.text, "completed"));
  for (const ojson& c : a.calls) out.push_back(c);
  return out;
}

// Stores the turn (when the request allows): its conversation and the answer as an assistant turn.
void store_turn(Context& ctx, const Echo& e, ojson conversation, const Answer& a, const ojson& response) {
  if (e.request.contains("store") && e.request["store"] == false) return;  // a boolean (responses_to_chat)
  ojson msg = {{"role", "assistant"}, {"content", a.text}};
  if (!a.calls.empty()) {
    msg["tool_calls"] = ojson::array();
    for (const ojson& c : a.calls)
      msg["tool_calls"].push_back({{"id", c["call_id"]}, {"type", "function"},
                                   {"function", {{"name", c["name"]}, {"arguments", c["arguments"]}}}});
  }
  conversation.push_back(std::move(msg));
  ctx.responses.put(e.id, ResponseStore::Entry{std::move(conversation), response});
}

std::string event(const std::string& type, int& seq, ojson fields) {
  fields["type"] = type;
  fields["sequence_number"] = seq++;
  return "event: " + type + "\ndata: " + fields.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

void handle(Context& ctx, const http::Request& hreq, http::Response& res) {
  ApiError e;
  if (ctx.stopping.load()) {
    ctx.metrics.count(kEndpoint, 503);
    return send_openai_error(res, {503, "server_error", "the server is shutting down", ""});
  }
  auto guard = std::make_shared<InflightGuard>(ctx.inflight);
  TextRequest r;
  r.sampling = ctx.sampling_defaults;
  ojson body, chat, conversation;
  if (parse_body(hreq, body, e)) {
    if (auto err = responses_to_chat(body, ctx.responses, chat, conversation)) {
      e = *err;
    } else if (auto err2 = read_openai_request(chat, true, ctx.bundle.model->config().vocab, r)) {
      e = *err2;
      e.param = responses_param(e.param);
    } else if (auto aerr = select_adapter(ctx, body, r)) {
      e = *aerr;
    } else if (auto err3 = compile_constraint(ctx, r)) {
      e = *err3;
      e.param = responses_param(e.param);
    }
  }
  if (e.message.empty()) {
    auto started = LiveGeneration::start(ctx.engine, ctx.bundle, r, ctx.opt.default_max_tokens,
                                         ctx.opt.allow_special_in_content);
    if (auto* err = std::get_if<ApiError>(&started)) {
      e = *err;
    } else {
      auto gen = std::get<std::shared_ptr<LiveGeneration>>(started);
      ctx.metrics.count(kEndpoint, 200);
      auto echo = std::make_shared<Echo>(Echo{new_id("resp_"), ctx.model_id, unix_time(), body});
      const std::string reasoning_id = new_id("rs_"), message_id = new_id("msg_");
      if (!r.stream) {
        Answer a;
        std::vector<TextEvent> evs;
        while (gen->next(evs, milliseconds(100))) {
          if (hreq.is_connection_closed()) return gen->cancel();
          for (auto& te : evs) {
            if (te.kind == TextEvent::kContent) a.text += te.text;
            if (te.kind == TextEvent::kReasoning) a.reasoning += te.text;
            if (te.kind == TextEvent::kToolCall) a.calls.push_back(call_item(te.call));
          }
          evs.clear();
        }
        if (gen->reason() == FinishReason::Error) return send_openai_error(res, {500, "server_error", gen->error(), ""});
        const std::string status = gen->reason() == FinishReason::Length ? "incomplete" : "completed";
        ojson out = response_json(*echo, status, output_of(a, reasoning_id, message_id), gen.get());
        store_turn(ctx, *echo, std::move(conversation), a, out);
        res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
        return;
      }
      // Streaming. Items open one at a time: reasoning, then the message; a tool call is
      // announced whole (added, its arguments as one delta, done).
      struct State {
        int seq = 0, phase = 0;  // phase 0: nothing sent, 1: streaming, 2: done
        std::string open;        // "", "reasoning" or "message": the item whose text is streaming
        int index = -1;          // output index of the open item
        Answer a;
        ojson conversation;
      };
      auto st = std::make_shared<State>();
      st->conversation = std::move(conversation);
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [&ctx, gen, echo, st, guard, reasoning_id, message_id](size_t, http::DataSink& sink) -> bool {
            if (st->phase == 2) return false;
            std::string out;
            auto close_open = [&]() {
              if (st->open == "message") {
                out += event("response.output_text.done", st->seq,
                             {{"item_id", message_id}, {"output_index", st->index}, {"content_index", 0},
                              {"text", st->a.text}});
                out += event("response.content_part.done", st->seq,
                             {{"item_id", message_id}, {"output_index", st->index}, {"content_index", 0},
                              {"part", text_part(st->a.text)}});
                out += event("response.output_item.done", st->seq,
                             {{"output_index", st->index}, {"item", message_item(message_id, st->a.text, "completed")}});
              } else if (st->open == "reasoning") {
                out += event("response.reasoning_text.done", st->seq,
                             {{"item_id", reasoning_id}, {"output_index", st->index}, {"content_index", 0},
                              {"text", st->a.reasoning}});
                out += event("response.output_item.done", st->seq,
                             {{"output_index", st->index}, {"item", reasoning_item(reasoning_id, st->a.reasoning)}});
              }
              st->open.clear();
            };
            auto open_item = [&](const std::string& kind) {
              if (st->open == kind) return;
              close_open();
              st->open = kind;
              ++st->index;
              if (kind == "message") {
                out += event("response.output_item.added", st->seq,
                             {{"output_index", st->index}, {"item", {{"type", "message"}, {"id", message_id},
                                                                    {"status", "in_progress"}, {"role", "assistant"},
                                                                    {"content", ojson::array()}}}});
                out += event("response.content_part.added", st->seq,
                             {{"item_id", message_id}, {"output_index", st->index}, {"content_index", 0},
                              {"part", text_part("")}});
              } else {
                out += event("response.output_item.added", st->seq,
                             {{"output_index", st->index}, {"item", {{"type", "reasoning"}, {"id", reasoning_id},
                                                                    {"summary", ojson::array()}}}});
              }
            };
            if (st->phase == 0) {
              st->phase = 1;
              const ojson pending = response_json(*echo, "in_progress", ojson::array(), nullptr);
              out += event("response.created", st->seq, {{"response", pending}});
              out += event("response.in_progress", st->seq, {{"response", pending}});
            }
            std::vector<TextEvent> evs;
            const bool more = gen->next(evs, milliseconds(50));
            for (auto& te : evs) {
              if (te.kind == TextEvent::kReasoning) {
                open_item("reasoning");
                st->a.reasoning += te.text;
                out += event("response.reasoning_text.delta", st->seq,
                             {{"item_id", reasoning_id}, {"output_index", st->index}, {"content_index", 0},
                              {"delta", te.text}});
              } else if (te.kind == TextEvent::kContent) {
                open_item("message");
                st->a.text += te.text;
                out += event("response.output_text.delta", st->seq,
                             {{"item_id", message_id}, {"output_index", st->index}, {"content_index", 0},
                              {"delta", te.text}});
              } else {
                close_open();
                ojson item = call_item(te.call);
                st->a.calls.push_back(item);
                ojson added = item;
                added["arguments"] = "";
                added["status"] = "in_progress";
                const int at = ++st->index;
                out += event("response.output_item.added", st->seq, {{"output_index", at}, {"item", added}});
                out += event("response.function_call_arguments.delta", st->seq,
                             {{"item_id", item["id"]}, {"output_index", at}, {"delta", item["arguments"]}});
                out += event("response.function_call_arguments.done", st->seq,
                             {{"item_id", item["id"]}, {"output_index", at}, {"name", item["name"]},
                              {"arguments", item["arguments"]}});
                out += event("response.output_item.done", st->seq, {{"output_index", at}, {"item", item}});
              }
            }
            if (!more || gen->finished()) {
              close_open();
              st->phase = 2;
              if (gen->reason() == FinishReason::Error) {
                ojson failed = response_json(*echo, "failed", ojson::array(), gen.get());
                failed["error"] = {{"code", "server_error"}, {"message", gen->error()}};
                out += event("response.failed", st->seq, {{"response", failed}});
              } else {
                const bool cut = gen->reason() == FinishReason::Length;
                // Streamed items in streamed order (the message may precede a call; reasoning first).
                ojson items = output_of(st->a, reasoning_id, message_id);
                ojson done = response_json(*echo, cut ? "incomplete" : "completed", items, gen.get());
                store_turn(ctx, *echo, st->conversation, st->a, done);
                out += event(cut ? "response.incomplete" : "response.completed", st->seq, {{"response", done}});
              }
            }
            if (!out.empty() && (!sink.is_writable() || !sink.write(out.data(), out.size()))) {
              gen->cancel();
              return false;
            }
            if (st->phase == 2) sink.done();
            return true;
          },
          [gen](bool) { gen->cancel(); });
      return;
    }
  }
  ctx.metrics.count(kEndpoint, e.status);
  send_openai_error(res, e);
}

// GET / DELETE /v1/responses/{id}.
void stored(Context& ctx, const http::Request& req, http::Response& res, bool erase) {
  const std::string id = req.path.substr(std::char_traits<char>::length("/v1/responses/"));
  auto entry = ctx.responses.get(id);
  if (!entry || (erase && !ctx.responses.erase(id))) {
    ctx.metrics.count(kEndpoint, 404);
    return send_openai_error(res, {404, "invalid_request_error", "no stored response '" + id + "'", "response_id"});
  }
  ctx.metrics.count(kEndpoint, 200);
  const ojson out = erase ? ojson{{"id", id}, {"object", "response.deleted"}, {"deleted", true}} : entry->response;
  res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
}

}  // namespace

void register_responses_routes(http::Server& svr, Context& ctx) {
  svr.Post(kEndpoint, [&ctx](const http::Request& q, http::Response& r) { handle(ctx, q, r); });
  svr.Get("/v1/responses/*", [&ctx](const http::Request& q, http::Response& r) { stored(ctx, q, r, false); });
  svr.Delete("/v1/responses/*", [&ctx](const http::Request& q, http::Response& r) { stored(ctx, q, r, true); });
}

}  // namespace g4::server
