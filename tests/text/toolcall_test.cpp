// Gemma 4 tool-call parser: against mlx-lm's parse_tool_call recordings
// (tests/fixtures/sampler/gemma4_tool_calls.json, tools/record_sampler_cases.py), hand-checked
// hard cases, and the streaming parser under every split of the text.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "text/tool_calls.h"

using g4::ToolCall;
using g4::ToolCallEvent;
using g4::ToolCallStream;
using ojson = nlohmann::ordered_json;

namespace {

ojson load_cases() {
  std::ifstream f(std::string(G4_SOURCE_DIR) + "/tests/fixtures/sampler/gemma4_tool_calls.json");
  std::stringstream ss;
  ss << f.rdbuf();
  return ojson::parse(ss.str(), nullptr, false);
}

const std::string Q = "<|\"|>";
std::string wrap(const std::string& block) { return "<|tool_call>" + block + "<tool_call|>"; }

// Feeds `text` in the given pieces; returns (text, calls) with adjacent text merged.
struct Streamed {
  std::string text;
  std::vector<ToolCall> calls;
  std::vector<size_t> call_at;  // text length when each call was emitted (ordering check)
};
Streamed stream_pieces(const std::vector<std::string>& pieces) {
  ToolCallStream s;
  Streamed r;
  auto take = [&](std::vector<ToolCallEvent> ev) {
    for (auto& e : ev) {
      if (e.kind == ToolCallEvent::kText) {
        EXPECT_FALSE(e.text.empty());
        r.text += e.text;
      } else {
        r.calls.push_back(e.call);
        r.call_at.push_back(r.text.size());
      }
    }
  };
  for (auto& p : pieces) take(s.feed(p));
  take(s.finish());
  return r;
}

}  // namespace

TEST(ToolCallMlx, MatchesMlxLmParser) {
  ojson cases = load_cases();
  ASSERT_FALSE(cases.is_discarded());
  int ok = 0, bad = 0;
  for (auto& c : cases["cases"]) {
    std::string block = c["block"];
    auto r = g4::parse_gemma4_tool_block(block);
    if (c["ok"].get<bool>()) {
      ++ok;
      ASSERT_TRUE(r.is_ok()) << block << ": " << r.message();
      ASSERT_EQ(r->size(), c["calls"].size()) << block;
      for (size_t i = 0; i < r->size(); ++i) {
        EXPECT_EQ((*r)[i].name, c["calls"][i]["name"]) << block;
        // Same values and same key order as Python's dict.
        EXPECT_EQ((*r)[i].arguments.dump(), c["calls"][i]["arguments"].dump()) << block;
      }
      // The whole-text splitter yields the same calls and no leftover text.
      auto split = g4::split_gemma4_tool_calls("Sure." + wrap(block) + "Done.");
      EXPECT_EQ(split.content, "Sure.Done.") << block;
      EXPECT_EQ(split.calls.size(), r->size()) << block;
    } else {
      ++bad;
      EXPECT_FALSE(r.is_ok()) << block;
      // Malformed: kept verbatim as text, never dropped.
      std::string text = "a" + wrap(block) + "b";
      auto split = g4::split_gemma4_tool_calls(text);
      EXPECT_EQ(split.content, text);
      EXPECT_TRUE(split.calls.empty());
    }
  }
  EXPECT_GE(ok, 15);
  EXPECT_GE(bad, 4);
}

TEST(ToolCall, HardCasesByHand) {
  auto r = g4::parse_gemma4_tool_block("call:f{s:" + Q + "a}b{c\"d,e:f\n" + Q +
                                       ",n:[-1,2.5e-3,0,1E2],o:{p:{q:[true,false,null]}}}");
  ASSERT_TRUE(r.is_ok()) << r.message();
  auto& a = (*r)[0].arguments;
  EXPECT_EQ(a["s"], "a}b{c\"d,e:f\n");
  EXPECT_EQ(a["n"][0], -1);
  EXPECT_TRUE(a["n"][0].is_number_integer());
  EXPECT_DOUBLE_EQ(a["n"][1].get<double>(), 0.0025);
  EXPECT_DOUBLE_EQ(a["n"][3].get<double>(), 100.0);
  EXPECT_TRUE(a["o"]["p"]["q"][2].is_null());
  EXPECT_EQ((*r)[0].arguments_json(),
            R"({"s":"a}b{c\"d,e:f\n","n":[-1,0.0025,0,100.0],"o":{"p":{"q":[true,false,null]}}})");
  // A string right next to other tokens, and one that is only a delimiter away from the end.
  r = g4::parse_gemma4_tool_block("call:g{a:" + Q + Q + ",b:" + Q + "<|x|>" + Q + "}");
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ((*r)[0].arguments["a"], "");
  EXPECT_EQ((*r)[0].arguments["b"], "<|x|>");
  // Whitespace tolerated around tokens (mlx-lm needs none; we accept it).
  r = g4::parse_gemma4_tool_block(" call:h{ a : 1 ,\n b : [ 1 , 2 ] } ");
  ASSERT_TRUE(r.is_ok()) << r.message();
  EXPECT_EQ((*r)[0].arguments.dump(), R"({"a":1,"b":[1,2]})");
  // Duplicate keys: last value wins (Python dict semantics).
  r = g4::parse_gemma4_tool_block("call:d{a:1,b:2,a:3}");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ((*r)[0].arguments.dump(), R"({"a":3,"b":2})");
}

TEST(ToolCall, MalformedBlocksAreErrors) {
  for (std::string b : std::vector<std::string>{"call:f{a:1", "call:f{a:01}", "call:f{a:1.}", "call:f{a:.5}",
                        "call:f{a:tru}", "call:f{a:truex}", "call:f{a:[1,2}", "call:f{a:1}}",
                        "call:f{,a:1}", "call:{a:1}", "call:f(a=1)", "call:f{a:NaN}",
                        "call:f{a:" + Q + "x}", "call:f{a:1} trailing words", "", "  ",
                        "call:f{a:\"unterminated}"}) {
    EXPECT_FALSE(g4::parse_gemma4_tool_block(b).is_ok()) << b;
  }
  std::string deep = "call:f{a:" + std::string(300, '[') + std::string(300, ']') + "}";
  EXPECT_FALSE(g4::parse_gemma4_tool_block(deep).is_ok());  // depth limit, no stack overflow
}

TEST(ToolCall, ValueParser) {
  auto v = g4::parse_gemma4_value("{k:" + Q + "v" + Q + ",\"j\":\"x\\ny\\u00e9\"}");
  ASSERT_TRUE(v.is_ok()) << v.message();
  EXPECT_EQ((*v)["j"], "x\ny\xc3\xa9");
  EXPECT_FALSE(g4::parse_gemma4_value("{k:v} extra").is_ok());
  EXPECT_TRUE(g4::parse_gemma4_value("-1.5e+3").is_ok());
  EXPECT_EQ(g4::parse_gemma4_value("-1.5e+3")->get<double>(), -1500.0);
}

TEST(ToolCall, SeveralCallsAndSurroundingText) {
  std::string text = "Let me check.\n" + wrap("call:a{x:1}") + wrap("call:b{y:" + Q + "z" + Q + "}") +
                     "\nand " + wrap("call:bad{x:oops}") + " then " + wrap("call:c{}") + " end";
  auto s = g4::split_gemma4_tool_calls(text);
  ASSERT_EQ(s.calls.size(), 3u);
  EXPECT_EQ(s.calls[0].name, "a");
  EXPECT_EQ(s.calls[1].arguments_json(), R"({"y":"z"})");
  EXPECT_EQ(s.calls[2].name, "c");
  EXPECT_EQ(s.calls[2].arguments_json(), "{}");
  EXPECT_EQ(s.content, "Let me check.\n\nand " + wrap("call:bad{x:oops}") + " then  end");
}

TEST(ToolCall, UnterminatedBlockAtEnd) {
  // mlx-lm parses the tool text it holds when generation ends; so do we if it is complete.
  auto s = g4::split_gemma4_tool_calls("hi " + std::string("<|tool_call>call:f{a:1}"));
  EXPECT_EQ(s.content, "hi ");
  ASSERT_EQ(s.calls.size(), 1u);
  s = g4::split_gemma4_tool_calls("hi <|tool_call>call:f{a:");
  EXPECT_EQ(s.content, "hi <|tool_call>call:f{a:");
  EXPECT_TRUE(s.calls.empty());
  s = g4::split_gemma4_tool_calls("ends with a partial marker <|tool_ca");
  EXPECT_EQ(s.content, "ends with a partial marker <|tool_ca");
}

TEST(ToolCallStream, EverySplitPointGivesTheSameResult) {
  std::string text = "Pre <|tool\n" + wrap("call:get{city:" + Q + "Paris <tool_call| {x}" + Q +
                                           ",n:[1,{m:-2e1}]}") +
                     " mid " + wrap("call:bad{") + wrap("call:two{}") + "post<";
  auto whole = stream_pieces({text});
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.calls[0].arguments_json(), R"({"city":"Paris <tool_call| {x}","n":[1,{"m":-20.0}]})");
  EXPECT_EQ(whole.text, "Pre <|tool\n mid " + wrap("call:bad{") + "post<");
  for (size_t a = 0; a <= text.size(); ++a) {
    for (size_t b = a; b <= text.size(); b += 7) {
      auto r = stream_pieces({text.substr(0, a), text.substr(a, b - a), text.substr(b)});
      ASSERT_EQ(r.text, whole.text) << a << "," << b;
      ASSERT_EQ(r.calls.size(), 2u) << a << "," << b;
      EXPECT_EQ(r.calls[1].name, "two");
      EXPECT_EQ(r.call_at, whole.call_at);
    }
  }
  // One byte at a time.
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  auto r = stream_pieces(bytes);
  EXPECT_EQ(r.text, whole.text);
  EXPECT_EQ(r.calls.size(), 2u);
}

TEST(ToolCallStream, HoldsBackOnlyAPossibleMarker) {
  ToolCallStream s;
  auto ev = s.feed("Hello <|tool");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "Hello ");  // "<|tool" held back
  ev = s.feed("box|>");  // not a marker after all: released
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].text, "<|toolbox|>");
  ev = s.feed("<|tool_call>call:f{a:");
  EXPECT_TRUE(ev.empty());
  EXPECT_TRUE(s.in_call());
  ev = s.feed("1}<tool_call|>tail");
  ASSERT_EQ(ev.size(), 2u);
  EXPECT_EQ(ev[0].kind, ToolCallEvent::kToolCall);
  EXPECT_EQ(ev[0].call.name, "f");
  EXPECT_EQ(ev[1].text, "tail");
  EXPECT_EQ(s.calls_emitted(), 1);
}

TEST(ToolCallStream, LongCallInTinyPiecesIsLinear) {
  // 400 KB of argument text fed 3 bytes at a time must finish quickly: copying the block on
  // every feed would move ~25 GB (seconds); linear handling takes milliseconds.
  auto t0 = std::chrono::steady_clock::now();
  std::string big(400000, 'x');
  std::string text = "<|tool_call>call:w{data:<|\"|>" + big + "<|\"|>}<tool_call|>ok";
  ToolCallStream s;
  std::vector<ToolCallEvent> all;
  for (size_t i = 0; i < text.size(); i += 3) {
    auto ev = s.feed(std::string_view(text).substr(i, 3));
    all.insert(all.end(), ev.begin(), ev.end());
  }
  auto ev = s.finish();
  all.insert(all.end(), ev.begin(), ev.end());
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].call.arguments["data"].get<std::string>().size(), big.size());
  EXPECT_EQ(all[1].text, "ok");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1.5);
}

// Random texts built from marker fragments and argument syntax: streaming in random pieces
// always equals feeding the whole text, nothing crashes, and text without any complete call
// marker comes back verbatim.
TEST(ToolCallStream, RandomTextsStreamLikeWhole) {
  const std::vector<std::string> frags = {"<|tool_call>", "<tool_call|>", "call:", "f", "{", "}",
                                          "a:", "1", ",", Q, "[", "]", "<|", "tool", "|>", " ",
                                          "\n", "x", "-2.5e3", "true", "<", "é"};
  std::mt19937 g(123);
  for (int it = 0; it < 3000; ++it) {
    std::string text;
    int n = 1 + int(g() % 30);
    for (int j = 0; j < n; ++j) text += frags[g() % frags.size()];
    auto whole = stream_pieces({text});
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      size_t len = 1 + g() % 6;
      pieces.push_back(text.substr(i, len));
      i += len;
    }
    auto r = stream_pieces(pieces);
    ASSERT_EQ(r.text, whole.text) << text;
    ASSERT_EQ(r.calls.size(), whole.calls.size()) << text;
    for (size_t k = 0; k < r.calls.size(); ++k)
      ASSERT_EQ(r.calls[k].arguments_json(), whole.calls[k].arguments_json()) << text;
    if (text.find("<|tool_call>") == std::string::npos) {
      ASSERT_EQ(whole.text, text);
    }
    if (whole.calls.empty()) {
      ASSERT_EQ(whole.text, text) << "malformed text must be kept";
    }
  }
}
