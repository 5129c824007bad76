#include "server/live_generation.h"
#include "server/request_log.h"

#include <algorithm>

namespace g4::server {
LiveGeneration::LiveGeneration(Engine& e, const ModelBundle& b, TextStreamOptions o)
    : engine_(e), bundle_(b), q_(std::make_shared<Queue>()), stream_(*b.tokenizer, std::move(o)) {}

LiveGeneration::~LiveGeneration() {
  if (!done_delivered_) cancel();
}

std::variant<GenerationSpec, ApiError> LiveGeneration::build_prompt(Engine& engine, const ModelBundle& b,
                                                                    const TextRequest& req,
                                                                    bool allow_special_in_content,
                                                                    TextStreamOptions* to) {
  std::vector<int32_t> prompt;
  if (req.chat) {
    if (!b.chat_template)
      return ApiError{400, "invalid_request_error",
                      "this model has no chat template (a base model): use /v1/completions, or start "
                      "the server with --chat-template FILE", "messages"};
    ChatRenderOptions ro = b.render_defaults;
    ro.add_generation_prompt = true;
    if (req.thinking) ro.enable_thinking = *req.thinking;
    auto text = allow_special_in_content
                    ? b.chat_template->render(req.messages, req.tools, ro)
                    : b.chat_template->render(mark_literal_strings(req.messages, *b.tokenizer),
                                              mark_literal_strings(req.tools, *b.tokenizer), ro);
    if (!text) return ApiError{400, "invalid_request_error", "chat template: " + text.message(), "messages"};
    to->reasoning_open_in_prompt = prompt_opens_reasoning(text.value());
    if (allow_special_in_content) {
      prompt = encode_chat_prompt(b, text.value());
    } else {
      const std::vector<int> ids = b.tokenizer->encode_marked(text.value());
      prompt.assign(ids.begin(), ids.end());
    }
  } else {
    to->split_reasoning = false;
    to->parse_tool_calls = false;
    prompt = encode_raw_prompt(b, req.prompt);
  }
  GenerationSpec spec;
  spec.prompt = std::move(prompt);
  if (!req.images.empty()) {
    if (!b.vision)
      return ApiError{400, "invalid_request_error", "this model has no vision encoder: image input is not available",
                      "messages"};
    if (Status st = attach_images(*b.vision, engine, req.images, 0, spec); !st)
      return ApiError{400, "invalid_request_error", st.message(), "messages"};
  }
  return spec;
}

std::variant<std::vector<int32_t>, ApiError> LiveGeneration::prompt_ids(Engine& engine, const ModelBundle& b,
                                                                        const TextRequest& req,
                                                                        bool allow_special_in_content) {
  TextStreamOptions to;
  auto built = build_prompt(engine, b, req, allow_special_in_content, &to);
  if (auto* err = std::get_if<ApiError>(&built)) return *err;
  return std::move(std::get<GenerationSpec>(built).prompt);
}

std::variant<std::shared_ptr<LiveGeneration>, ApiError> LiveGeneration::start(
    Engine& engine, const ModelBundle& b, const TextRequest& req, int default_max_tokens,
    bool allow_special_in_content) {
  if (req.ignore_eos && req.grammar)  // a finished grammar admits nothing but the end token
    return ApiError{400, "invalid_request_error",
                    "ignore_eos cannot be combined with constrained output (response_format, tool_choice, grammar)",
                    "ignore_eos"};
  TextStreamOptions to;
  to.stop_strings = req.stop;
  auto built = build_prompt(engine, b, req, allow_special_in_content, &to);
  if (auto* err = std::get_if<ApiError>(&built)) return *err;
  GenerationSpec spec = std::move(std::get<GenerationSpec>(built));
  std::shared_ptr<LiveGeneration> g(new LiveGeneration(engine, b, to));
  g->prompt_size_ = int(spec.prompt.size());
  g->want_logprobs_ = req.logprobs >= 0;
  spec.sampling = req.sampling;
  spec.logprobs = req.logprobs;
  spec.grammar = req.grammar;
  spec.adapter = req.adapter;
  spec.max_tokens = req.max_tokens > 0 ? req.max_tokens : default_max_tokens;
  // Leave room for the prompt when the client did not ask for a length.
  const int ctx = engine.options().max_context;
  if (req.max_tokens <= 0 && int(spec.prompt.size()) + spec.max_tokens > ctx)
    spec.max_tokens = std::max(1, ctx - int(spec.prompt.size()));
  if (!req.ignore_eos) spec.stop_ids = b.stop_ids;
  g->stop_ids_ = b.stop_ids;  // end tokens never reach the text (with ignore_eos they do not stop it either)
  auto q = g->q_;
  auto id = engine.submit(std::move(spec), [q](const TokenEvent& ev) {
    std::lock_guard<std::mutex> lk(q->mu);
    q->events.push_back(ev);
    q->cv.notify_one();
  });
  if (!id) {
    const std::string& m = id.message();
    if (m.rfind("queue full", 0) == 0) return ApiError{429, "rate_limit_error", "server busy: " + m, ""};
    if (m.find("shutting down") != std::string::npos) return ApiError{503, "server_error", m, ""};
    return ApiError{400, "invalid_request_error", m, ""};
  }
  g->id_ = id.value();
  return g;
}

void LiveGeneration::cancel() {
  if (cancelled_ || id_ == 0) return;
  cancelled_ = true;
  engine_.cancel(id_);
}

bool LiveGeneration::next(std::vector<TextEvent>& out, std::chrono::milliseconds wait) {
  if (done_delivered_) return false;
  std::deque<TokenEvent> evs;
  {
    std::unique_lock<std::mutex> lk(q_->mu);
    q_->cv.wait_for(lk, wait, [&] { return !q_->events.empty(); });
    evs.swap(q_->events);
  }
  for (const TokenEvent& ev : evs) {
    if (ev.token >= 0) {
      const bool is_stop = std::find(stop_ids_.begin(), stop_ids_.end(), ev.token) != stop_ids_.end();
      if (!is_stop && !stream_.stopped()) {
        if (want_logprobs_) logprobs_.push_back({ev.token, ev.logprob, ev.top});
        for (auto& te : stream_.push(ev.token)) out.push_back(std::move(te));
        if (stream_.stopped()) cancel();
      }
    }
    usage_.prompt_tokens = ev.prompt_tokens;
    usage_.cached_tokens = ev.cached_tokens;
    usage_.completion_tokens = ev.completion_tokens;
    note_tokens(ev.prompt_tokens, ev.cached_tokens, ev.completion_tokens);  // for the request log
    if (ev.done) {
      reason_ = ev.reason;
      error_ = ev.error;
      for (auto& te : stream_.finish()) out.push_back(std::move(te));
      done_delivered_ = true;
      return true;
    }
  }
  return true;
}

std::string LiveGeneration::finish_reason() const {
  if (reason_ == FinishReason::Length) return "length";  // cut off, calls or not (OpenAI's order)
  if (stream_.tool_calls() > 0) return "tool_calls";
  if (stream_.stopped()) return "stop";
  return reason_ == FinishReason::Length ? "length" : "stop";
}

}  // namespace g4::server
