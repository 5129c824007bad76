// The grammar module (grammar/grammar.h) on the tiny tokenizer of tests/text: which tokens the mask
// leaves, how accepted tokens advance the matcher, the stop tokens once the grammar is complete,
// and errors for grammars that do not compile. Expected token sets are derived by hand from the
// grammars and the tokenizer's vocabulary (tokenizer_fixture.h).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "../text/tokenizer_fixture.h"
#include "grammar/grammar.h"
#include "grammar/tool_call_grammar.h"
#include "text/tool_calls.h"

namespace g4 {
namespace {

using testing::byte_id;
constexpr int kEos = 1;
constexpr int kPadded = 300;  // the model's logit width: ids past the tokenizer never match

class GrammarTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!grammar_engine_available()) GTEST_SKIP() << "this build has no grammar engine (G4_XGRAMMAR_DIR unset)";
    auto tok = Tokenizer::from_json(testing::tiny_tokenizer_json().dump());
    ASSERT_TRUE(tok) << tok.message();
    tok_ = std::make_unique<Tokenizer>(std::move(tok.value()));
    auto c = GrammarCompiler::create(*tok_, kPadded);
    ASSERT_TRUE(c) << c.message();
    compiler_ = c.value();
  }
  // The ids the matcher allows next.
  static std::set<int> allowed(GrammarMatcher& m) {
    std::vector<float> logits(kPadded, 0.f);
    m.mask(logits.data(), kPadded);
    std::set<int> ids;
    for (int i = 0; i < kPadded; ++i)
      if (!std::isinf(logits[size_t(i)])) ids.insert(i);
    return ids;
  }
  std::unique_ptr<Tokenizer> tok_;
  std::shared_ptr<GrammarCompiler> compiler_;
};

TEST_F(GrammarTest, MaskKeepsExactlyTheTokensThatStartAWordOfTheGrammar) {
  auto g = compiler_->ebnf("root ::= \"ab\" | \"c\"");
  ASSERT_TRUE(g) << g.message();
  GrammarMatcher m(g.value(), {kEos});
  // "a", "ab", "c" as words or bytes; not "abc" (no word of the grammar starts with it), no special.
  EXPECT_EQ(allowed(m), (std::set<int>{byte_id('a'), byte_id('c'), testing::kA, testing::kC, testing::kAB}));
  ASSERT_TRUE(m.accept(testing::kA));
  EXPECT_FALSE(m.complete());
  EXPECT_EQ(allowed(m), (std::set<int>{byte_id('b'), testing::kB}));
  EXPECT_FALSE(m.accept(testing::kC));  // refused, and the matcher did not move
  ASSERT_TRUE(m.accept(byte_id('b')));
  EXPECT_TRUE(m.complete());
  EXPECT_EQ(allowed(m), (std::set<int>{kEos}));  // complete: only the stop token
  EXPECT_FALSE(m.terminated());
  EXPECT_TRUE(m.accept(kEos));
  // Past the stop token nothing may follow: the mask says so (XGrammar itself throws) and leaves
  // the logits alone, and every token is refused.
  EXPECT_TRUE(m.terminated());
  std::vector<float> logits(kPadded, 0.5f);
  EXPECT_FALSE(m.mask(logits.data(), kPadded));
  EXPECT_EQ(logits, std::vector<float>(kPadded, 0.5f));
  EXPECT_FALSE(m.accept(testing::kA));
  EXPECT_FALSE(m.accept(kEos));
}

TEST_F(GrammarTest, JsonSchemaEnumIsSpelledOutTokenByToken) {
  auto g = compiler_->json_schema(R"({"enum": ["ab", "c"]})", true);
  ASSERT_TRUE(g) << g.message();
  GrammarMatcher m(g.value(), {kEos});
  EXPECT_EQ(allowed(m), (std::set<int>{byte_id('"')}));
  for (int t : {byte_id('"'), int(testing::kAB), byte_id('"')}) ASSERT_TRUE(m.accept(t)) << t;
  EXPECT_TRUE(m.complete());
}

// A string with length bounds: never a raw control character (JSON forbids them in strings;
// XGrammar's own bounded-string rule let them through), and nothing but the closing quote past the
// bound.
TEST_F(GrammarTest, BoundedStringsRefuseControlCharacters) {
  for (const char* schema : {R"({"type": "string", "maxLength": 3})", R"({"type": "string", "minLength": 1, "maxLength": 3})",
                             R"({"type": "object", "properties": {"s": {"type": "string", "maxLength": 3}}, "required": ["s"]})"}) {
    SCOPED_TRACE(schema);
    auto g = compiler_->json_schema(schema, true);
    ASSERT_TRUE(g) << g.message();
    GrammarMatcher m(g.value(), {kEos});
    if (std::string(schema).find("object") != std::string::npos) {
      for (char c : std::string(R"({"s":)")) ASSERT_TRUE(m.accept(byte_id(c))) << c;
      if (allowed(m).count(byte_id(' '))) ASSERT_TRUE(m.accept(byte_id(' ')));  // XGrammar's ": " separator
    }
    ASSERT_TRUE(m.accept(byte_id('"')));
    for (int n = 0; n < 3; ++n) {
      const std::set<int> ok = allowed(m);
      for (int b = 0; b < 0x20; ++b) EXPECT_EQ(ok.count(byte_id(char(b))), 0u) << "control byte " << b << " after " << n;
      EXPECT_EQ(ok.count(byte_id('x')), 1u);
      ASSERT_TRUE(m.accept(byte_id('x')));
    }
    EXPECT_EQ(allowed(m).count(byte_id('x')), 0u);  // the bound: only the closing quote
    EXPECT_TRUE(m.accept(byte_id('"')));
  }
}

TEST_F(GrammarTest, AnyJsonAllowsAnObjectAndRefusesText) {
  auto g = compiler_->json_object();
  ASSERT_TRUE(g) << g.message();
  GrammarMatcher m(g.value(), {kEos});
  const std::set<int> first = allowed(m);
  EXPECT_TRUE(first.count(byte_id('{')));
  EXPECT_FALSE(first.count(testing::kA));  // a bare word is not JSON
  EXPECT_FALSE(first.count(kEos));
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(first.count(i)) << "special token " << i;
}

TEST_F(GrammarTest, BadGrammarsAreErrorsNotCrashes) {
  auto a = compiler_->json_schema(R"({"type": "no-such-type"})", true);
  EXPECT_FALSE(a);
  auto b = compiler_->json_schema("{not json", true);
  EXPECT_FALSE(b);
  auto c = compiler_->ebnf("root ::= = broken");
  EXPECT_FALSE(c);
  EXPECT_FALSE(c.message().empty());
}

TEST_F(GrammarTest, SameSchemaCompilesOnceAndIsShared) {
  auto a = compiler_->json_schema(R"({"type": "integer"})", true);
  auto b = compiler_->json_schema(R"({"type": "integer"})", true);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a.value().get(), b.value().get());
}

// Forced tool calls (tool_call_grammar.h) on the tiny tokenizer with Gemma 4's markup added as
// special tokens: each marker is allowed as its one token (or spelled in bytes), the arguments
// follow the function's schema in Gemma's style, and the decoded text parses as the call.
class ToolCallGrammarTest : public ::testing::Test {
 protected:
  enum : int { kCallOpen = testing::kPlainS1 + 1, kCallClose, kQuote };
  void SetUp() override {
    if (!grammar_engine_available()) GTEST_SKIP() << "this build has no grammar engine (G4_XGRAMMAR_DIR unset)";
    nlohmann::json j = testing::tiny_tokenizer_json();
    int id = kCallOpen;
    for (const char* m : {"<|tool_call>", "<tool_call|>", "<|\"|>"}) {
      j["model"]["vocab"][m] = id;
      j["added_tokens"].push_back({{"id", id++}, {"content", m}, {"special", true}, {"normalized", false},
                                   {"lstrip", false}, {"rstrip", false}, {"single_word", false}});
    }
    auto tok = Tokenizer::from_json(j.dump());
    ASSERT_TRUE(tok) << tok.message();
    tok_ = std::make_unique<Tokenizer>(std::move(tok.value()));
    auto c = GrammarCompiler::create(*tok_, kPadded, gemma4_tool_markup_tokens());
    ASSERT_TRUE(c) << c.message();
    tools_ = nlohmann::ordered_json::parse(R"([
      {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
        "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": false}}},
      {"type": "function", "function": {"name": "g", "parameters": {"type": "object",
        "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": false}}}])");
    compiler_ = c.value();
  }
  std::shared_ptr<const CompiledGrammar> compile(const std::string& name, bool parallel) {
    auto g = compiler_->structural_tag(gemma4_tool_call_structural_tag({tools_, name, parallel, false}));
    EXPECT_TRUE(g) << g.message();
    return g ? g.value() : nullptr;
  }
  // Accepts `text` byte by byte; `ids` collects what was accepted.
  static bool spell(GrammarMatcher& m, const std::string& text, std::vector<int>& ids) {
    for (unsigned char c : text) {
      if (!m.accept(byte_id(c))) return false;
      ids.push_back(byte_id(c));
    }
    return true;
  }
  std::unique_ptr<Tokenizer> tok_;
  std::shared_ptr<GrammarCompiler> compiler_;
  nlohmann::ordered_json tools_;
};

TEST_F(ToolCallGrammarTest, NamedFunctionIsTheOnlyAnswer) {
  auto g = compile("f", true);
  ASSERT_TRUE(g);
  GrammarMatcher m(g, {kEos});
  std::vector<int> ids;
  EXPECT_FALSE(m.accept(testing::kA));  // no text before the call
  ASSERT_TRUE(m.accept(kCallOpen));     // the marker as its one token
  ids.push_back(kCallOpen);
  EXPECT_FALSE(m.accept(byte_id('x')));
  ASSERT_TRUE(spell(m, "call:", ids));
  EXPECT_FALSE(m.accept(byte_id('g')));  // only the named function
  ASSERT_TRUE(spell(m, "f{a:", ids));
  EXPECT_FALSE(m.accept(byte_id('1')));  // a's schema: a string, Gemma-quoted
  ASSERT_TRUE(m.accept(kQuote));
  ids.push_back(kQuote);
  ASSERT_TRUE(spell(m, "xy", ids));
  ASSERT_TRUE(m.accept(kQuote));
  ids.push_back(kQuote);
  EXPECT_FALSE(m.accept(byte_id(',')));  // no properties beyond the schema's
  ASSERT_TRUE(spell(m, "}", ids));
  ASSERT_TRUE(m.accept(kCallClose));
  ids.push_back(kCallClose);
  EXPECT_TRUE(m.complete());
  EXPECT_TRUE(m.accept(kEos));
  // What the server's parser reads back from the decoded text.
  ToolCallSplit split = split_gemma4_tool_calls(tok_->decode(ids));
  ASSERT_EQ(split.calls.size(), 1u) << tok_->decode(ids);
  EXPECT_EQ(split.calls[0].name, "f");
  EXPECT_EQ(split.calls[0].arguments_json(), R"({"a":"xy"})");
  EXPECT_EQ(split.content, "");
}

TEST_F(ToolCallGrammarTest, RequiredTakesAnyToolOnceOrMore) {
  for (bool parallel : {true, false}) {
    auto g = compile("", parallel);
    ASSERT_TRUE(g);
    GrammarMatcher m(g, {kEos});
    std::vector<int> ids;
    EXPECT_FALSE(m.accept(kEos));  // at least one call
    ASSERT_TRUE(spell(m, "<|tool_call>call:g{n:12}<tool_call|>", ids)) << "the markers spelled in bytes";
    EXPECT_TRUE(m.complete());
    EXPECT_EQ(m.accept(kCallOpen), parallel) << "a second call only with parallel calls";
    if (parallel) {
      ASSERT_TRUE(spell(m, "call:f{a:", ids));
      ASSERT_TRUE(m.accept(kQuote) && m.accept(kQuote) && spell(m, "}", ids) && m.accept(kCallClose));
    }
    EXPECT_TRUE(m.accept(kEos));
  }
}

TEST_F(ToolCallGrammarTest, PlainCompilersNeverSeeTheMarkup) {
  auto plain = GrammarCompiler::create(*tok_, kPadded);
  ASSERT_TRUE(plain);
  auto g = plain.value()->json_schema(R"({"type": "string"})", true);
  ASSERT_TRUE(g);
  GrammarMatcher m(g.value(), {kEos});
  ASSERT_TRUE(m.accept(byte_id('"')));
  EXPECT_FALSE(m.accept(kQuote));  // a special token is not text for a plain grammar
  EXPECT_FALSE(m.accept(kCallOpen));
}

}  // namespace
}  // namespace g4
