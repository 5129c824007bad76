// Gemma 4 tool calls as an XGrammar structural tag; see tool_call_grammar.h.
#include "grammar/tool_call_grammar.h"

#include "text/tool_calls.h"

namespace g4 {
namespace {

using ojson = nlohmann::ordered_json;

const char* const kChannelOpen = "<|channel>";
const char* const kChannelClose = "<channel|>";

// One `<|tool_call>call:NAME{...}<tool_call|>` block. Argument strings and keys may not contain
// the markers (a `<tool_call|>` inside a string would end the call at the parser).
ojson call_tag(const ojson& function) {
  const ojson* params = function.contains("parameters") && function["parameters"].is_object()
                            ? &function["parameters"] : nullptr;
  return {{"type", "tag"},
          {"begin", std::string(kToolCallOpen) + "call:" + function["name"].get<std::string>()},
          {"content", {{"type", "json_schema"},
                       {"json_schema", params ? *params : ojson{{"type", "object"}}},
                       {"style", "gemma"},
                       {"max_whitespace_cnt", 1},  // the template writes none; a wandering model gets one
                       {"excludes", ojson::array({kChannelOpen, kChannelClose, std::string(kToolCallOpen),
                                                  std::string(kToolCallClose)})}}},
          {"end", std::string(kToolCallClose)}};
}

}  // namespace

std::string gemma4_tool_call_structural_tag(const ToolCallGrammarSpec& spec) {
  ojson calls;
  if (!spec.name.empty()) {
    for (const ojson& t : spec.tools)
      if (t["function"]["name"] == spec.name) calls = call_tag(t["function"]);
  } else {
    ojson tags = ojson::array();
    for (const ojson& t : spec.tools) tags.push_back(call_tag(t["function"]));
    calls = {{"type", "tags_with_separator"}, {"tags", tags}, {"separator", ""}, {"at_least_one", true},
             {"stop_after_first", !spec.parallel}};
  }
  ojson format = calls;
  if (spec.thinking) {
    const ojson thought = {{"type", "tag"},
                           {"begin", std::string(kChannelOpen) + "thought\n"},
                           {"content", {{"type", "any_text"},
                                        {"excludes", ojson::array({kChannelOpen, kChannelClose,
                                                                   std::string(kToolCallOpen)})}}},
                           {"end", kChannelClose}};
    const ojson optional_thought = {{"type", "optional"}, {"content", thought}};
    format = {{"type", "sequence"}, {"elements", ojson::array({optional_thought, calls})}};
  }
  return ojson{{"type", "structural_tag"}, {"format", format}}.dump();
}

const std::vector<std::string>& gemma4_tool_markup_tokens() {
  static const std::vector<std::string> t = {std::string(kToolCallOpen), std::string(kToolCallClose),
                                             std::string(kGemmaQuote), kChannelOpen, kChannelClose};
  return t;
}

}  // namespace g4
