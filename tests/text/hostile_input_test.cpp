// Hostile text inputs: templates that would run or grow without bound end with an error, and a
// message's own text is never read as control tokens.
#include <gtest/gtest.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "text/chat_template.h"
#include "text/jinja_template.h"
#include "tokenizer_fixture.h"

namespace g4 {
namespace {

using namespace g4::testing;

std::string render_error(const std::string& src, double* seconds, uint64_t max_steps = jinja::Template::kMaxSteps) {
  auto t = jinja::Template::parse(src);
  if (!t) return "PARSE ERROR: " + t.message();
  const auto t0 = std::chrono::steady_clock::now();
  auto r = t->render(jinja::Value::make_dict(), max_steps);
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r ? "" : r.message();
}

TEST(JinjaBudget, NestedLoopsEndWithAnError) {
  double s = 0;
  // An empty loop body still costs a step per iteration (the default budget is measured end to
  // end in ChatTemplateErrorNamesTheTemplate).
  const std::string e = render_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                     &s, 1'000'000);
  EXPECT_NE(e.find("budget of 1000000 steps"), std::string::npos) << e;
  EXPECT_NE(e.find("line 1"), std::string::npos) << e;
  EXPECT_LT(s, 30.0);
}

TEST(JinjaBudget, StringDoublingEndsWithAnError) {
  double s = 0;
  const std::string e = render_error(
      "{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}", &s);
  EXPECT_NE(e.find("a string grew beyond 16 MiB"), std::string::npos) << e;
}

TEST(JinjaBudget, ListDoublingAndRepetitionEndWithAnError) {
  double s = 0;
  std::string e = render_error(
      "{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", &s);
  EXPECT_NE(e.find("a list grew beyond"), std::string::npos) << e;
  e = render_error("{% set big = 'x' * 1000000 %}{{ ([big] * 1000000) | length }}", &s);
  EXPECT_NE(e.find("repeated sequence too large"), std::string::npos) << e;
  e = render_error("{{ range(100000000) | length }}", &s);
  EXPECT_NE(e.find("range too big"), std::string::npos) << e;
}

TEST(JinjaBudget, OutputIsBounded) {
  double s = 0;
  const std::string e = render_error("{% for i in range(1000000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}", &s);
  EXPECT_NE(e.find("the output grew beyond 16 MiB"), std::string::npos) << e;
}

TEST(JinjaBudget, ChatTemplateErrorNamesTheTemplate) {
  auto ct = ChatTemplate::from_string("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                                      "model.gguf (tokenizer.chat_template)");
  ASSERT_TRUE(ct.is_ok()) << ct.message();
  auto r = ct->render(nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), nullptr, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("model.gguf (tokenizer.chat_template)"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("budget"), std::string::npos) << r.message();
}

TEST(LiteralText, SpecialTokensInMarkedTextStayText) {
  Tokenizer t = tiny_tokenizer();
  const std::string user = "ab<start_of_turn>c";
  // Template markup "<start_of_turn>" around marked user text: only the markup is a control token.
  const std::string rendered = "<start_of_turn>" + t.mark_literal(user) + "<start_of_turn>";
  const std::vector<int> got = t.encode_marked(rendered);
  std::vector<int> want = {kStartTurn};
  for (int id : t.encode(user, /*parse_special=*/false)) want.push_back(id);
  want.push_back(kStartTurn);
  EXPECT_EQ(got, want);
  // The plain text encoding of the user's "<start_of_turn>" is not the control token.
  EXPECT_EQ(std::count(got.begin(), got.end(), int(kStartTurn)), 2);
}

TEST(LiteralText, MarksInTheInputAreDropped) {
  Tokenizer t = tiny_tokenizer();
  const std::string mark(Tokenizer::kLiteralMark);
  // A client sending the mark itself cannot turn the template's next token into text.
  const std::string rendered = t.mark_literal("ab" + mark) + "<start_of_turn>";
  const std::vector<int> got = t.encode_marked(rendered);
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.back(), int(kStartTurn));
  EXPECT_EQ(t.decode(got), "ab<start_of_turn>");
}

TEST(LiteralText, UnmarkedTextEncodesAsBefore) {
  Tokenizer t = tiny_tokenizer();
  for (const std::string s : {"<start_of_turn>ab c<s1>xyz", "", "abc\n<eos>"})
    EXPECT_EQ(t.encode_marked(s), t.encode(s, true)) << s;
}

}  // namespace
}  // namespace g4
