// The grammar module (grammar/grammar.h) on the tiny tokenizer of tests/text: which tokens the mask
// leaves, how accepted tokens advance the matcher, the stop tokens once the grammar is complete,
// and errors for grammars that do not compile. Expected token sets are derived by hand from the
// grammars and the tokenizer's vocabulary (tokenizer_fixture.h).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "../text/tokenizer_fixture.h"
#include "grammar/grammar.h"

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
  EXPECT_TRUE(m.accept(kEos));
}

TEST_F(GrammarTest, JsonSchemaEnumIsSpelledOutTokenByToken) {
  auto g = compiler_->json_schema(R"({"enum": ["ab", "c"]})", true);
  ASSERT_TRUE(g) << g.message();
  GrammarMatcher m(g.value(), {kEos});
  EXPECT_EQ(allowed(m), (std::set<int>{byte_id('"')}));
  for (int t : {byte_id('"'), int(testing::kAB), byte_id('"')}) ASSERT_TRUE(m.accept(t)) << t;
  EXPECT_TRUE(m.complete());
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

}  // namespace
}  // namespace g4
