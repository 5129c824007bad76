// One request's generation as the HTTP layer sees it: the prompt built from a TextRequest
// (chat template or raw text), submitted to the engine, and its tokens turned into TextEvents
// (runtime/text_stream.h) that a handler pulls, streaming or not. Cancelling (client gone, stop
// string) frees the engine slot within one step.
#pragma once
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <utility>
#include <variant>

#include "runtime/bundle.h"
#include "runtime/text_stream.h"
#include "server/api_types.h"

namespace g4::server {

struct Usage {
  int prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
// One generated token's reported log-probability and its most likely alternatives.
struct TokenLogprob {
  int token;
  float logprob;
  std::vector<std::pair<int, float>> top;
};

class LiveGeneration {
 public:
  // Builds the prompt and submits it. Errors: template failures (400), prompt + max_tokens over
  // the context (400), queue full (429). Chat prompts: the text of the client's messages and
  // tools is never read as control tokens (a "<end_of_turn>" in a message stays text), only the
  // template's own markup is; `allow_special_in_content` parses special tokens in the whole
  // rendered prompt instead (--allow-special-in-content).
  static std::variant<std::shared_ptr<LiveGeneration>, ApiError> start(
      Engine& engine, const ModelBundle& bundle, const TextRequest& req, int default_max_tokens,
      bool allow_special_in_content);
  // The prompt `start` would submit for req (template, tokenization, image tokens), without
  // submitting it: its length is what /v1/messages/count_tokens answers.
  static std::variant<GenerationSpec, ApiError> build_prompt(Engine& engine, const ModelBundle& bundle,
                                                             const TextRequest& req, bool allow_special_in_content,
                                                             TextStreamOptions* stream_options);
  // build_prompt's token ids alone (/v1/messages/count_tokens, /tokenize).
  static std::variant<std::vector<int32_t>, ApiError> prompt_ids(Engine& engine, const ModelBundle& bundle,
                                                                 const TextRequest& req, bool allow_special_in_content);
  ~LiveGeneration();

  // Waits up to `wait` for more output; appends new events to `out`. Returns false once the
  // generation has finished and everything was delivered.
  bool next(std::vector<TextEvent>& out, std::chrono::milliseconds wait);
  void cancel();

  bool finished() const { return done_delivered_; }
  FinishReason reason() const { return reason_; }
  bool stopped_by_string() const { return stream_.stopped(); }
  const std::string& stop_sequence() const { return stream_.stopped_by(); }
  // Prompt tokens submitted (known at start; usage() has the engine's count once it reports).
  int prompt_size() const { return prompt_size_; }
  int tool_calls() const { return stream_.tool_calls(); }
  const Usage& usage() const { return usage_; }
  // The logprobs of the tokens delivered since the last call (TextRequest::logprobs >= 0): the
  // generated tokens fed to the text stream (not the stop token, nothing after a stop string).
  std::vector<TokenLogprob> take_logprobs() { return std::exchange(logprobs_, {}); }
  const std::string& error() const { return error_; }
  // OpenAI finish_reason: "length" when max_tokens cut the answer, else "tool_calls" when it made
  // calls, else "stop".
  std::string finish_reason() const;

 private:
  LiveGeneration(Engine& e, const ModelBundle& b, TextStreamOptions o);
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<TokenEvent> events;
  };
  Engine& engine_;
  const ModelBundle& bundle_;
  std::shared_ptr<Queue> q_;
  TextStream stream_;
  std::vector<int32_t> stop_ids_;
  int prompt_size_ = 0;
  std::vector<TokenLogprob> logprobs_;
  bool want_logprobs_ = false;
  uint64_t id_ = 0;
  bool cancelled_ = false;
  bool done_delivered_ = false;
  FinishReason reason_ = FinishReason::None;
  Usage usage_;
  std::string error_;
};

}  // namespace g4::server
