// Separates Gemma 4 reasoning (`<|channel>thought\n ... <channel|>`) from the answer while
// streaming decoded text.
//
// Mirrors the reasoning part of mlx-lm's TextStateMachine (generate.py make_text_state_machine):
// matching is on TEXT, so markers split across pieces (or merged with neighbouring text) are
// found; marker text is stripped; text that may be the start of a marker is held back and
// released as soon as it cannot be. Transitions:
//   content   --"<|channel>thought"-->  reasoning
//   reasoning --"<channel|>"-------->  content
//   reasoning --"<|tool_call>"------>  tool (the channel ends; mlx-lm: reasoning -> tool)
//   content   --"<|tool_call>"------>  tool
//   tool      --"<tool_call|>"------>  content
// Tool-call text (markers included) is passed through as CONTENT, untouched, for the tool-call
// parser downstream; markers inside it (e.g. in a string argument) are not interpreted.
// Differences from mlx-lm, on purpose: the single "\n" right after "<|channel>thought" is dropped
// (it is part of the marker in the chat template); a never-closed channel stays reasoning until
// finish(); an empty thought block produces no event. A stray "<channel|>" in content is kept as
// text, like mlx-lm.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace g4 {

struct ReasoningEvent {
  enum Kind { kReasoning, kContent };
  Kind kind;
  std::string text;  // never empty
  bool operator==(const ReasoningEvent&) const = default;
};

class ReasoningSplitter {
 public:
  struct Options {
    std::string open = "<|channel>thought";
    std::string close = "<channel|>";
    bool drop_newline_after_open = true;
    std::string tool_call_open = "<|tool_call>";  // either empty: no tool state
    std::string tool_call_close = "<tool_call|>";
    bool start_in_reasoning = false;  // the prompt already opened the channel
  };
  ReasoningSplitter() : ReasoningSplitter(Options{}) {}
  explicit ReasoningSplitter(Options o);

  // Feeds a piece of decoded text; returns the events now final (consecutive same-kind text
  // merged).
  std::vector<ReasoningEvent> feed(std::string_view piece);
  // End of stream: releases held-back text to the current channel (an unfinished marker is
  // plain text of that channel).
  std::vector<ReasoningEvent> finish();

  bool in_reasoning() const { return state_ == State::kAfterOpen || state_ == State::kReasoning; }
  bool saw_reasoning_marker() const { return saw_open_; }

 private:
  enum class State { kContent, kAfterOpen, kReasoning, kInTool };
  void emit(std::vector<ReasoningEvent>& out, ReasoningEvent::Kind k, std::string_view t);

  Options o_;
  State state_;
  std::string held_;
  bool saw_open_ = false;
};

// True when rendered prompt text leaves the model inside an open thought channel (its last
// "<|channel>thought" comes after its last "<channel|>"), i.e. generation starts in reasoning.
// Mirrors mlx-lm server.py's initial-state choice.
bool prompt_opens_reasoning(std::string_view prompt_text,
                            std::string_view open = "<|channel>thought",
                            std::string_view close = "<channel|>");

}  // namespace g4
