// Turns a generated token stream into what a person or an API client sees: incremental text
// (never broken UTF-8), split into reasoning and answer, with Gemma 4 tool calls parsed out and
// stop strings applied (text from the stop string on is never shown).
// Order per token: detokenize -> stop strings -> reasoning split -> tool-call parsing (answer only).
#pragma once
#include <string>
#include <vector>

#include "text/detokenizer.h"
#include "text/reasoning.h"
#include "text/stop_strings.h"
#include "text/tool_calls.h"

namespace g4 {

struct TextEvent {
  enum Kind { kContent, kReasoning, kToolCall };
  Kind kind;
  std::string text;  // kContent / kReasoning
  ToolCall call;     // kToolCall
};

struct TextStreamOptions {
  std::vector<std::string> stop_strings;
  bool split_reasoning = true;
  bool parse_tool_calls = true;
  bool reasoning_open_in_prompt = false;  // the prompt ended inside an open thought channel
};

class TextStream {
 public:
  TextStream(const Tokenizer& tok, TextStreamOptions opt);
  // Feeds one generated token (the stop token itself should not be fed). Returns new events.
  std::vector<TextEvent> push(int token);
  // End of generation: releases held-back text.
  std::vector<TextEvent> finish();
  // True once a stop string completed (the caller should cancel generation).
  bool stopped() const { return stop_.stopped(); }
  // The stop string that ended the text (empty before a stop).
  const std::string& stopped_by() const;
  int tool_calls() const { return tools_.calls_emitted(); }

 private:
  void route(const std::string& text, bool final, std::vector<TextEvent>& out);
  void content(const std::string& text, bool final, std::vector<TextEvent>& out);
  TextStreamOptions opt_;
  Detokenizer detok_;  // keeps special tokens: the reasoning/tool markers are special tokens
  StopStringMatcher stop_;
  ReasoningSplitter reasoning_;
  ToolCallStream tools_;
};

}  // namespace g4
