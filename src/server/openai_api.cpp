// OpenAI-compatible endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models.
// Streaming uses server-sent events ending with "data: [DONE]".
#include <array>
#include <chrono>
#include <cstdio>

#include "server/context.h"
#include "server/live_generation.h"

namespace g4::server {
namespace {

using std::chrono::milliseconds;

ojson usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

ojson tool_call_json(const ToolCall& c, int index, bool with_index) {
  ojson j = {{"id", new_id("call_")}, {"type", "function"},
             {"function", {{"name", c.name}, {"arguments", c.arguments_json()}}}};
  if (with_index) j["index"] = index;
  return j;
}

std::string sse(const ojson& j) {
  return "data: " + j.dump(-1, ' ', false, ojson::error_handler_t::replace) + "\n\n";
}

// A token as the logprobs of the OpenAI APIs show it: its text (one token decoded alone; a lone
// byte-fallback token is its byte) and that text's bytes.
std::pair<std::string, ojson> token_piece(const Tokenizer& tok, int id) {
  const std::string& v = tok.token_text(id);
  unsigned byte = 0;
  if (v.size() == 6 && std::sscanf(v.c_str(), "<0x%2X>", &byte) == 1) return {v, ojson::array({int(byte)})};
  const int one[1] = {id};
  std::string text = tok.decode(one);
  ojson bytes = ojson::array();
  for (unsigned char c : text) bytes.push_back(int(c));
  return {std::move(text), std::move(bytes)};
}

// The logprobs of a choice (or of one streamed chunk): chat's {"content": [...]}, completions'
// {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (offsets continue from *offset).
ojson logprobs_json(const std::vector<TokenLogprob>& lps, bool chat, const Tokenizer& tok, int* offset) {
  if (chat) {
    ojson content = ojson::array();
    for (const TokenLogprob& t : lps) {
      auto [text, bytes] = token_piece(tok, t.token);
      ojson top = ojson::array();
      for (const auto& [id, lp] : t.top) {
        auto [tt, tb] = token_piece(tok, id);
        top.push_back({{"token", tt}, {"logprob", lp}, {"bytes", tb}});
      }
      content.push_back({{"token", text}, {"logprob", t.logprob}, {"bytes", bytes}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  ojson tokens = ojson::array(), lp = ojson::array(), top = ojson::array(), offsets = ojson::array();
  for (const TokenLogprob& t : lps) {
    auto [text, bytes] = token_piece(tok, t.token);
    tokens.push_back(text);
    lp.push_back(t.logprob);
    ojson alts = ojson::object();
    for (const auto& [id, v] : t.top) alts[token_piece(tok, id).first] = v;
    top.push_back(alts);
    offsets.push_back(*offset);
    *offset += int(text.size());
  }
  return {{"tokens", tokens}, {"token_logprobs", lp}, {"top_logprobs", top}, {"text_offset", offsets}};
}

void handle(Context& ctx, const http::Request& hreq, http::Response& res, bool chat) {
  const char* endpoint = chat ? "/v1/chat/completions" : "/v1/completions";
  TextRequest r;
  r.sampling = ctx.sampling_defaults;  // the model's generation_config for what the request leaves out
  ApiError e;
  if (ctx.stopping.load()) {  // draining: running requests finish, new ones are refused
    ctx.metrics.count(endpoint, 503);
    return send_openai_error(res, {503, "server_error", "the server is shutting down", ""});
  }
  auto guard = std::make_shared<InflightGuard>(ctx.inflight);
  ojson body;
  if (parse_body(hreq, body, e)) {
    if (auto err = read_openai_request(body, chat, ctx.bundle.model->config().vocab, r)) e = *err;
    else if (auto aerr = select_adapter(ctx, body, r)) e = *aerr;
    else if (auto cerr = compile_constraint(ctx, r)) e = *cerr;
  }
  if (!e.message.empty()) {
    ctx.metrics.count(endpoint, e.status);
    return send_openai_error(res, e);
  }
  // n choices: n generations of the same prompt, seeds seed, seed + 1, ... when the request set
  // one (each prefills the prompt itself; they batch together in the engine).
  std::vector<std::shared_ptr<LiveGeneration>> gens;
  for (int i = 0; i < r.n; ++i) {
    TextRequest ri = r;
    if (ri.sampling.has_seed) ri.sampling.seed += uint64_t(i);
    auto started = LiveGeneration::start(ctx.engine, ctx.bundle, ri, ctx.opt.default_max_tokens,
                                         ctx.opt.allow_special_in_content);
    if (auto* err = std::get_if<ApiError>(&started)) {
      for (auto& g : gens) g->cancel();
      ctx.metrics.count(endpoint, err->status);
      return send_openai_error(res, *err);
    }
    gens.push_back(std::get<std::shared_ptr<LiveGeneration>>(started));
  }
  const std::string id = new_id(chat ? "chatcmpl-" : "cmpl-");
  const long created = unix_time();
  const std::string object = chat ? "chat.completion" : "text_completion";
  ctx.metrics.count(endpoint, 200);
  // One usage for the request: the prompt once, the completions of every choice.
  auto usage_of = [](const std::vector<std::shared_ptr<LiveGeneration>>& gs) {
    Usage u = gs[0]->usage();
    for (size_t i = 1; i < gs.size(); ++i) u.completion_tokens += gs[i]->usage().completion_tokens;
    return usage_json(u);
  };
  const Tokenizer* tok = ctx.bundle.tokenizer.get();

  if (!r.stream) {
    ojson choices = ojson::array();
    for (size_t i = 0; i < gens.size(); ++i) {
      LiveGeneration& gen = *gens[i];
      std::string content, reasoning;
      ojson calls = ojson::array();
      std::vector<TextEvent> evs;
      while (gen.next(evs, milliseconds(100))) {
        if (hreq.is_connection_closed()) {  // the client went away: free the slots
          for (auto& g : gens) g->cancel();
          return;
        }
        for (auto& te : evs) {
          if (te.kind == TextEvent::kContent) content += te.text;
          if (te.kind == TextEvent::kReasoning) reasoning += te.text;
          if (te.kind == TextEvent::kToolCall) calls.push_back(tool_call_json(te.call, int(calls.size()), false));
        }
        evs.clear();
      }
      if (gen.reason() == FinishReason::Error) {
        for (auto& g : gens) g->cancel();
        return send_openai_error(res, {500, "server_error", gen.error(), ""});
      }
      ojson choice = {{"index", i}, {"finish_reason", gen.finish_reason()}, {"logprobs", nullptr}};
      if (r.logprobs >= 0) {
        int offset = 0;
        choice["logprobs"] = logprobs_json(gen.take_logprobs(), chat, *tok, &offset);
      }
      if (chat) {
        ojson msg = {{"role", "assistant"}, {"content", calls.empty() || !content.empty() ? ojson(content) : ojson()}};
        if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
        if (!calls.empty()) msg["tool_calls"] = calls;
        choice["message"] = msg;
      } else {
        choice["text"] = content;
      }
      choices.push_back(std::move(choice));
    }
    ojson out = {{"id", id}, {"object", object}, {"created", created}, {"model", ctx.model_id},
                 {"choices", choices}, {"usage", usage_of(gens)}};
    res.set_content(out.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
    return;
  }

  // Streaming: one SSE event per batch of a choice's text, the choices interleaved; the client
  // going away cancels every generation.
  const bool include_usage = r.include_usage;
  auto chunk = [id, created, model = ctx.model_id, chat](size_t index, ojson delta_or_text, ojson finish) {
    ojson c = {{"index", index}, {"finish_reason", finish}};
    if (chat) c["delta"] = std::move(delta_or_text); else c["text"] = std::move(delta_or_text);
    return ojson{{"id", id}, {"object", chat ? "chat.completion.chunk" : "text_completion"},
                 {"created", created}, {"model", model}, {"choices", ojson::array({c})}};
  };
  // Per choice: 0 nothing sent yet, 1 streaming, 2 done; tool calls sent (their index); the
  // completions logprobs' text offset so far.
  struct ChoiceState {
    int phase = 0, calls = 0, offset = 0;
  };
  auto states = std::make_shared<std::vector<ChoiceState>>(gens.size());
  const bool want_lp = r.logprobs >= 0;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [gens, chunk, states, chat, include_usage, guard, want_lp, tok, usage_of](size_t, http::DataSink& sink) -> bool {
        auto cancel_all = [&]() {
          for (auto& g : gens) g->cancel();
        };
        auto send = [&](const std::string& s) {
          if (!sink.is_writable() || !sink.write(s.data(), s.size())) {
            cancel_all();
            return false;
          }
          return true;
        };
        bool sent_all = true;
        for (const ChoiceState& st : *states) sent_all = sent_all && st.phase == 2;
        if (sent_all) return false;  // everything was sent
        bool all_done = true;
        for (size_t i = 0; i < gens.size(); ++i) {
          LiveGeneration& gen = *gens[i];
          ChoiceState& st = (*states)[i];
          if (st.phase == 2) continue;
          if (st.phase == 0) {
            st.phase = 1;
            if (chat && !send(sse(chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr)))) return false;
          }
          std::vector<TextEvent> evs;
          const bool more = gen.next(evs, milliseconds(gens.size() > 1 ? 10 : 50));
          if (!sink.is_writable()) {  // the client went away
            cancel_all();
            return false;
          }
          std::vector<ojson> out;
          for (auto& te : evs) {
            ojson delta;
            if (te.kind == TextEvent::kContent) {
              delta = chat ? ojson{{"content", te.text}} : ojson(te.text);
            } else if (te.kind == TextEvent::kReasoning) {
              if (!chat) continue;
              delta = {{"reasoning_content", te.text}};
            } else {
              delta = {{"tool_calls", ojson::array({tool_call_json(te.call, st.calls++, true)})}};
            }
            out.push_back(chunk(i, delta, nullptr));
          }
          if (want_lp) {  // this round's tokens ride on its last chunk (or on one of their own)
            std::vector<TokenLogprob> lps = gen.take_logprobs();
            if (!lps.empty()) {
              if (out.empty()) out.push_back(chunk(i, chat ? ojson{{"content", ""}} : ojson(""), nullptr));
              out.back()["choices"][0]["logprobs"] = logprobs_json(lps, chat, *tok, &st.offset);
            }
          }
          for (const ojson& c : out)
            if (!send(sse(c))) return false;
          if (!more || gen.finished()) {
            st.phase = 2;
            if (gen.reason() == FinishReason::Error) {
              send(sse({{"error", {{"message", gen.error()}, {"type", "server_error"}}}}));
              cancel_all();
              for (ChoiceState& other : *states) other.phase = 2;
              send("data: [DONE]\n\n");
              sink.done();
              return true;
            }
            if (!send(sse(chunk(i, chat ? ojson::object() : ojson(""), gen.finish_reason())))) return false;
          } else {
            all_done = false;
          }
        }
        if (all_done) {
          if (include_usage) {
            ojson u = chunk(0, ojson::object(), nullptr);
            u["choices"] = ojson::array();
            u["usage"] = usage_of(gens);
            if (!send(sse(u))) return false;
          }
          send("data: [DONE]\n\n");
          sink.done();
        }
        return true;
      },
      [gens](bool) {
        for (auto& g : gens) g->cancel();
      });
}

ojson model_json(const Context& ctx) {
  return {{"id", ctx.model_id}, {"object", "model"}, {"created", unix_time()}, {"owned_by", "local"}};
}

}  // namespace

bool request_prompt_ids(Context& ctx, const ojson& body, std::vector<int32_t>* ids, bool* chat, ApiError* e) {
  TextRequest r;
  const ojson* text = nullptr;
  for (const char* key : {"content", "prompt"})
    if (auto it = body.find(key); it != body.end() && !it->is_null()) text = &*it;
  if (body.contains("messages")) {
    if (auto err = read_openai_request(body, true, ctx.bundle.model->config().vocab, r)) {
      *e = *err;
      return false;
    }
  } else if (!text || !text->is_string()) {
    *e = ApiError{400, "invalid_request_error", "give 'content' (or 'prompt') as a string, or 'messages'", "content"};
    return false;
  } else {
    r.chat = false;
    r.prompt = text->get<std::string>();
  }
  auto built = LiveGeneration::prompt_ids(ctx.engine, ctx.bundle, r, ctx.opt.allow_special_in_content);
  if (auto* err = std::get_if<ApiError>(&built)) {
    *e = *err;
    return false;
  }
  *ids = std::move(std::get<std::vector<int32_t>>(built));
  *chat = r.chat;
  return true;
}

namespace {

// POST /tokenize (llama-server's and vLLM's): {"content" | "prompt": text} or {"messages": [...]}
// (the chat prompt as /v1/chat/completions builds it); "add_special" / "add_special_tokens"
// (default true) keep the leading <bos> of a text prompt. Answers {"tokens", "count", "max_model_len"}.
void tokenize(Context& ctx, const http::Request& hreq, http::Response& res) {
  ApiError e;
  ojson body;
  std::vector<int32_t> ids;
  bool chat = false;
  if (parse_body(hreq, body, e) && request_prompt_ids(ctx, body, &ids, &chat, &e)) {
    bool add_special = true;
    for (const char* key : {"add_special", "add_special_tokens"})
      if (auto it = body.find(key); it != body.end() && it->is_boolean()) add_special = it->get<bool>();
    const int bos = ctx.bundle.tokenizer->bos_id();
    if (!chat && !add_special && !ids.empty() && ids[0] == bos) ids.erase(ids.begin());
    res.set_content(ojson{{"tokens", ids}, {"count", ids.size()},
                          {"max_model_len", ctx.engine.options().max_context}}.dump(), "application/json");
    ctx.metrics.count("/tokenize", 200);
    return;
  }
  ctx.metrics.count("/tokenize", e.status);
  send_openai_error(res, e);
}

// POST /detokenize: {"tokens": [ids]} -> {"content": text, "prompt": text} (llama-server's and
// vLLM's field names), special tokens kept.
void detokenize(Context& ctx, const http::Request& hreq, http::Response& res) {
  ApiError e;
  ojson body;
  if (parse_body(hreq, body, e)) {
    const int vocab = ctx.bundle.model->config().vocab;
    std::vector<int> ids;
    auto it = body.find("tokens");
    if (it == body.end() || !it->is_array()) {
      e = ApiError{400, "invalid_request_error", "'tokens' must be an array of token ids", "tokens"};
    } else {
      for (const auto& v : *it) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
          e = ApiError{400, "invalid_request_error",
                       "'tokens' holds ids in 0.." + std::to_string(vocab - 1) + " only", "tokens"};
          break;
        }
        ids.push_back(int(v.get<int64_t>()));
      }
    }
    if (e.message.empty()) {
      const std::string text = ctx.bundle.tokenizer->decode(ids);
      res.set_content(ojson{{"content", text}, {"prompt", text}}.dump(-1, ' ', false, ojson::error_handler_t::replace),
                      "application/json");
      ctx.metrics.count("/detokenize", 200);
      return;
    }
  }
  ctx.metrics.count("/detokenize", e.status);
  send_openai_error(res, e);
}

}  // namespace

void register_openai_routes(http::Server& svr, Context& ctx) {
  svr.Post("/v1/chat/completions", [&ctx](const http::Request& q, http::Response& r) { handle(ctx, q, r, true); });
  svr.Post("/v1/completions", [&ctx](const http::Request& q, http::Response& r) { handle(ctx, q, r, false); });
  svr.Get("/v1/models", [&ctx](const http::Request&, http::Response& res) {
    ojson out = {{"object", "list"}, {"data", ojson::array({model_json(ctx)})}};
    for (ojson& m : adapter_models(ctx)) out["data"].push_back(std::move(m));
    res.set_content(out.dump(), "application/json");
    ctx.metrics.count("/v1/models", 200);
  });
  // /v1/models/{id}: the one model this server has (other ids: 404 through the error handler).
  svr.Get("/v1/models/" + ctx.model_id, [&ctx](const http::Request&, http::Response& res) {
    res.set_content(model_json(ctx).dump(), "application/json");
    ctx.metrics.count("/v1/models", 200);
  });
  svr.Post("/tokenize", [&ctx](const http::Request& q, http::Response& r) { tokenize(ctx, q, r); });
  svr.Post("/detokenize", [&ctx](const http::Request& q, http::Response& r) { detokenize(ctx, q, r); });
}

}  // namespace g4::server
