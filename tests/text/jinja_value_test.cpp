// Python value semantics of the jinja interpreter. Expected strings were printed by CPython 3.11
// (repr(float), repr(str), json.dumps) — see the comment on each table.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "text/jinja_value.h"

namespace g4::jinja {
namespace {

TEST(JinjaValue, FloatReprMatchesPython) {
  // python -c "print([repr(x) for x in [...]])"
  const std::pair<double, const char*> cases[] = {
      {0.1, "0.1"}, {1.0, "1.0"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
      {123456789.123, "123456789.123"}, {1e-4, "0.0001"}, {1e-5, "1e-05"}, {-0.0, "-0.0"},
      {300.0, "300.0"}, {1.5e-7, "1.5e-07"}, {2.5e-10, "2.5e-10"},
      {0.30000000000000004, "0.30000000000000004"}, {1e22, "1e+22"}, {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"}, {12345678901234567.0, "1.2345678901234568e+16"},
      {100.0, "100.0"}, {0.001, "0.001"}};
  for (auto& [x, want] : cases) EXPECT_EQ(py_float_repr(x), want) << x;
}

TEST(JinjaValue, StringReprMatchesPython) {
  // repr("it's"), repr('a"b'), repr('both \' and "'), repr('tab\t\n\\ é \x01 \u200b')
  EXPECT_EQ(py_repr_string("it's"), "\"it's\"");
  EXPECT_EQ(py_repr_string("a\"b"), "'a\"b'");
  EXPECT_EQ(py_repr_string("both ' and \""), "'both \\' and \"'");
  EXPECT_EQ(py_repr_string("tab\t\n\\ \xc3\xa9 \x01 \xe2\x80\x8b"), "'tab\\t\\n\\\\ \xc3\xa9 \\x01 \\u200b'");
}

TEST(JinjaValue, StrOfContainersIsPythonRepr) {
  auto j = nlohmann::ordered_json::parse(R"({"b": [1, 2.5, null, true, "x"], "a": {}})");
  Value v = from_json(j);
  EXPECT_EQ(to_str(v), "{'b': [1, 2.5, None, True, 'x'], 'a': {}}");
  EXPECT_EQ(to_str(Value::make_tuple({Value::string("k"), Value::integer(1)})), "('k', 1)");
  EXPECT_EQ(to_str(Value::make_tuple({Value::integer(1)})), "(1,)");
  EXPECT_EQ(to_str(Value::undefined("x")), "");
}

TEST(JinjaValue, JsonDumpsMatchesPython) {
  // json.dumps({'a':[1,{'x':None}],'é':'ü\n'}, ensure_ascii=False, indent=2)
  auto v = from_json(nlohmann::ordered_json::parse(R"({"a":[1,{"x":null}],"é":"ü\n"})"));
  DumpOptions o;
  o.indent = 2;
  EXPECT_EQ(json_dumps(v, o), "{\n  \"a\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"\xc3\xa9\": \"\xc3\xbc\\n\"\n}");
  // json.dumps({'é': '\U0001F600'}, ensure_ascii=True)
  DumpOptions a;
  a.ensure_ascii = true;
  EXPECT_EQ(json_dumps(from_json(nlohmann::ordered_json::parse("{\"\xc3\xa9\": \"\xf0\x9f\x98\x80\"}")), a),
            "{\"\\u00e9\": \"\\ud83d\\ude00\"}");
  EXPECT_EQ(json_dumps(from_json(nlohmann::ordered_json::parse("[1, 2.0, []]")), DumpOptions{}), "[1, 2.0, []]");
}

TEST(JinjaValue, PythonEqualityAndOrdering) {
  EXPECT_TRUE(equals(Value::integer(1), Value::number(1.0)));
  EXPECT_TRUE(equals(Value::boolean(true), Value::integer(1)));
  EXPECT_FALSE(equals(Value::string("1"), Value::integer(1)));
  EXPECT_TRUE(equals(Value::undefined(), Value::undefined()));
  EXPECT_FALSE(equals(Value::none(), Value::undefined()));
  EXPECT_LT(compare(Value::string("a"), Value::string("b")), 0);
  EXPECT_THROW(compare(Value::string("a"), Value::integer(1)), JinjaError);
  EXPECT_FALSE(truthy(Value::make_list()));
  EXPECT_TRUE(truthy(Value::make_namespace()));
  EXPECT_FALSE(truthy(Value::number(0.0)));
}

}  // namespace
}  // namespace g4::jinja
