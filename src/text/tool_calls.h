// Gemma 4 tool calls: `<|tool_call>call:NAME{key:value,...}<tool_call|>` (spec §7.3).
//
// Argument syntax (what the chat template writes and the model imitates): JSON values, except
// that strings are delimited by the `<|"|>` token text (raw, no escapes; anything up to the next
// `<|"|>`, including quotes, braces, commas, colons and newlines) and object keys may be bare.
// Semantics follow mlx-lm tool_parsers/gemma4.py (strings -> JSON strings, bare keys quoted,
// the rest parsed as JSON), implemented as a recursive-descent parser instead of regexes.
// Accepted on top of what mlx-lm accepts: whitespace around bare keys, and `-` in bare keys.
// Also accepted like mlx-lm: `<|"|>`-quoted keys, ordinary JSON "strings" with escapes, several
// `call:` in one block (separated by whitespace or commas). Anything else in a block (text that
// is not a call, unbalanced braces, bare-word values, trailing commas, NaN) makes the whole
// block malformed: it is then kept as plain text (markers included), never dropped.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace g4 {

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // an object; key order as the model wrote it
  // Compact JSON text of the arguments (OpenAI `function.arguments`), UTF-8 kept as is.
  // Invalid UTF-8 inside strings is replaced by U+FFFD rather than throwing.
  std::string arguments_json() const {
    return arguments.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
};

inline constexpr std::string_view kToolCallOpen = "<|tool_call>";
inline constexpr std::string_view kToolCallClose = "<tool_call|>";
inline constexpr std::string_view kGemmaQuote = "<|\"|>";

// Parses one Gemma 4 value (object, array, string, number, literal) that spans all of `text`
// (surrounding whitespace allowed). Errors name the byte offset.
Result<nlohmann::ordered_json> parse_gemma4_value(std::string_view text);

// Parses the text between `<|tool_call>` and `<tool_call|>`: one or more `call:NAME{...}`.
Result<std::vector<ToolCall>> parse_gemma4_tool_block(std::string_view block);

// Whole (non-streamed) model output: tool-call blocks are removed from the text and parsed;
// malformed blocks stay in `content` verbatim. An unterminated block at the end counts as a
// block if it parses (mlx-lm parses the tool text it has when generation ends).
struct ToolCallSplit {
  std::string content;
  std::vector<ToolCall> calls;
};
ToolCallSplit split_gemma4_tool_calls(std::string_view text);

struct ToolCallEvent {
  enum Kind { kText, kToolCall };
  Kind kind;
  std::string text;  // kText: never empty
  ToolCall call;     // kToolCall
};

// Incremental version for streaming: feed decoded text pieces; text outside tool calls is
// emitted as soon as it cannot be the start of `<|tool_call>`; a call is emitted when its
// `<tool_call|>` arrives (or at finish()).
class ToolCallStream {
 public:
  std::vector<ToolCallEvent> feed(std::string_view piece);
  std::vector<ToolCallEvent> finish();
  bool in_call() const { return in_call_; }
  int calls_emitted() const { return n_calls_; }

 private:
  void end_block(std::vector<ToolCallEvent>& out, std::string_view block, bool closed);
  std::string held_;  // outside a call: possible partial "<|tool_call>"; inside: the block so far
  bool in_call_ = false;
  int n_calls_ = 0;
};

}  // namespace g4
