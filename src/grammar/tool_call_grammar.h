// Gemma 4's tool-call syntax as a grammar: what OpenAI's `tool_choice` "required" or a named
// function (Anthropic's "any" / "tool") forces. The answer is one or more
// `<|tool_call>call:NAME{args}<tool_call|>` blocks (text/tool_calls.h) and nothing else; each
// args object is written in Gemma's own argument style (bare keys, `<|"|>`-delimited strings) and
// is valid for that function's `parameters` JSON Schema, except string lengths: XGrammar's Gemma
// style drops minLength / maxLength (patterns and formats hold). With thinking on, a thought channel
// (`<|channel>thought\n...<channel|>`) may come first. Built as an XGrammar structural tag with
// its Gemma argument style, compiled by a GrammarCompiler that sees the markup tokens as text
// (gemma4_tool_markup_tokens), so a vocabulary with those tokens (Gemma 4) writes each marker as
// its one token and any other spells it in pieces; the tool-call parser reads either.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace g4 {

struct ToolCallGrammarSpec {
  nlohmann::ordered_json tools;  // OpenAI form: [{type: function, function: {name, parameters}}], non-empty
  std::string name;              // non-empty: exactly one call, of this function (one of `tools`)
  bool parallel = true;          // without a name: more than one call allowed (parallel_tool_calls)
  bool thinking = false;         // an optional thought channel before the calls
};

// The structural tag's JSON text (GrammarCompiler::structural_tag). A function without a
// `parameters` object takes any object of arguments.
std::string gemma4_tool_call_structural_tag(const ToolCallGrammarSpec& spec);

// The special tokens a tool-call grammar spells as text (GrammarCompiler::create's text_specials).
const std::vector<std::string>& gemma4_tool_markup_tokens();

}  // namespace g4
