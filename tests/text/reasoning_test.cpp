// Reasoning / answer split while streaming (text/reasoning.h).
#include <gtest/gtest.h>

#include <random>

#include "text/reasoning.h"
#include "text/tool_calls.h"

using g4::ReasoningEvent;
using g4::ReasoningSplitter;

namespace {

struct Split {
  std::string reasoning, content;
  int switches = 0;  // number of kind changes across all events
};

Split run(ReasoningSplitter& s, const std::vector<std::string>& pieces) {
  Split r;
  int last = -1;
  auto take = [&](std::vector<ReasoningEvent> ev) {
    for (auto& e : ev) {
      EXPECT_FALSE(e.text.empty());
      (e.kind == ReasoningEvent::kReasoning ? r.reasoning : r.content) += e.text;
      if (last != -1 && last != e.kind) ++r.switches;
      last = e.kind;
    }
  };
  for (auto& p : pieces) take(s.feed(p));
  take(s.finish());
  return r;
}

Split run_text(const std::string& text, std::vector<size_t> cuts, ReasoningSplitter::Options o = {}) {
  std::vector<std::string> pieces;
  size_t prev = 0;
  for (size_t c : cuts) {
    pieces.push_back(text.substr(prev, c - prev));
    prev = c;
  }
  pieces.push_back(text.substr(prev));
  ReasoningSplitter s(o);
  return run(s, pieces);
}

}  // namespace

TEST(Reasoning, BasicSplit) {
  auto r = run_text("<|channel>thought\nLet me think.\nStep 2.<channel|>The answer is 4.", {});
  EXPECT_EQ(r.reasoning, "Let me think.\nStep 2.");
  EXPECT_EQ(r.content, "The answer is 4.");
  EXPECT_EQ(r.switches, 1);
}

TEST(Reasoning, EverySplitPoint) {
  const std::string text =
      "Intro <|chan <|channel>thought\nplan: a<b, <channel| not yet\n<channel|>Answer <|channel>x";
  const std::string want_r = "plan: a<b, <channel| not yet\n";
  const std::string want_c = "Intro <|chan Answer <|channel>x";
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); ++b) {
      auto r = run_text(text, {a, b});
      ASSERT_EQ(r.reasoning, want_r) << a << "," << b;
      ASSERT_EQ(r.content, want_c) << a << "," << b;
    }
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  auto r = run_text(text, every);
  EXPECT_EQ(r.reasoning, want_r);
  EXPECT_EQ(r.content, want_c);
}

TEST(Reasoning, NeverClosedIsAllReasoning) {
  auto r = run_text("<|channel>thought\nstill thinking <chan", {20, 30});
  EXPECT_EQ(r.reasoning, "still thinking <chan");
  EXPECT_EQ(r.content, "");
  ReasoningSplitter s;
  s.feed("<|channel>thought");
  EXPECT_TRUE(s.in_reasoning());
  EXPECT_TRUE(s.finish().empty());  // opened, nothing inside: no events
}

TEST(Reasoning, EmptyThoughtBlock) {
  // The large models' template with thinking off ends the prompt with an empty, closed block;
  // the model may also emit one itself.
  auto r = run_text("<|channel>thought\n<channel|>Hi!", {3, 18});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hi!");
  r = run_text("<|channel>thought<channel|>Hi!", {});
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Hi!");
}

TEST(Reasoning, NoReasoningAtAll) {
  auto r = run_text("Just an answer with <| and < and <channel|> stray marker.", {5, 21});
  EXPECT_EQ(r.content, "Just an answer with <| and < and <channel|> stray marker.");
  EXPECT_EQ(r.reasoning, "");
}

TEST(Reasoning, StartsInReasoningWhenPromptOpenedIt) {
  EXPECT_TRUE(g4::prompt_opens_reasoning("<|turn>model\n<|channel>thought\n"));
  EXPECT_FALSE(g4::prompt_opens_reasoning("<|turn>model\n<|channel>thought\n<channel|>"));
  EXPECT_FALSE(g4::prompt_opens_reasoning("<|turn>model\n"));
  ReasoningSplitter::Options o;
  o.start_in_reasoning = true;
  auto r = run_text("abc<channel|>def", {4}, o);
  EXPECT_EQ(r.reasoning, "abc");
  EXPECT_EQ(r.content, "def");
}

TEST(Reasoning, ToolCallInsideReasoningEndsIt) {
  std::string text = "<|channel>thought\nneed weather<|tool_call>call:w{c:1}<tool_call|>";
  for (size_t a = 0; a <= text.size(); ++a) {
    auto r = run_text(text, {a});
    ASSERT_EQ(r.reasoning, "need weather") << a;
    ASSERT_EQ(r.content, "<|tool_call>call:w{c:1}<tool_call|>") << a;
    auto calls = g4::split_gemma4_tool_calls(r.content);
    ASSERT_EQ(calls.calls.size(), 1u);
    EXPECT_EQ(calls.content, "");
  }
}

TEST(Reasoning, SeveralBlocks) {
  auto r = run_text("<|channel>thought\nA<channel|>x<|channel>thought\nB<channel|>y", {10, 40});
  EXPECT_EQ(r.reasoning, "AB");
  EXPECT_EQ(r.content, "xy");
  EXPECT_EQ(r.switches, 3);
}

TEST(Reasoning, ToolCallTextIsNotInterpreted) {
  // A string argument that mentions the channel markers stays inside the tool call (content).
  std::string call = "<|tool_call>call:echo{s:<|\"|>say <|channel>thought\nhi<channel|><|\"|>}<tool_call|>";
  std::string text = "<|channel>thought\nok<channel|>" + call + " done";
  for (size_t a = 0; a <= text.size(); ++a) {
    auto r = run_text(text, {a});
    ASSERT_EQ(r.reasoning, "ok") << a;
    ASSERT_EQ(r.content, call + " done") << a;
  }
  auto calls = g4::split_gemma4_tool_calls(call);
  ASSERT_EQ(calls.calls.size(), 1u);
  EXPECT_EQ(calls.calls[0].arguments["s"], "say <|channel>thought\nhi<channel|>");
}

// Random texts of marker fragments: streaming in random pieces equals one feed, and the
// concatenation of all events plus the stripped markers accounts for every byte.
TEST(Reasoning, RandomTextsStreamLikeWhole) {
  const std::vector<std::string> frags = {"<|channel>thought", "<|channel>", "thought", "\n",
                                          "<channel|>", "<channel|", "<|tool_call>",
                                          "<tool_call|>", "a", " ", "<", "|>", "é"};
  std::mt19937 g(7);
  for (int it = 0; it < 3000; ++it) {
    std::string text;
    int n = 1 + int(g() % 25);
    for (int j = 0; j < n; ++j) text += frags[g() % frags.size()];
    auto whole = run_text(text, {});
    std::vector<size_t> cuts;
    for (size_t i = 1 + g() % 5; i < text.size(); i += 1 + g() % 5) cuts.push_back(i);
    auto r = run_text(text, cuts);
    ASSERT_EQ(r.reasoning, whole.reasoning) << text;
    ASSERT_EQ(r.content, whole.content) << text;
    ASSERT_LE(whole.reasoning.size() + whole.content.size(), text.size());
    if (text.find("<|channel>thought") == std::string::npos) {
      ASSERT_EQ(whole.content, text);
    }
  }
}
