// jinja2's built-in filters, tests, attribute/item lookup and globals, as the sandboxed
// environment of transformers' apply_chat_template exposes them (plus HF's `tojson`,
// `raise_exception`, `strftime_now`). Each helper names the jinja2 function it mirrors.
#pragma once
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace g4::jinja {

// `v | name(args)`. Throws JinjaError for unknown filters and bad arguments.
Value apply_filter(const std::string& name, const Value& v, CallArgs& args);
// `v is name(args)`.
bool apply_test(const std::string& name, const Value& v, CallArgs& args);
// `obj.name` (SandboxedEnvironment.getattr): safe methods first, then keys. Never throws unless
// `obj` is Undefined.
Value get_attr(const Value& obj, const std::string& name);
// `obj[key]` (SandboxedEnvironment.getitem): keys/indices first, then attributes.
Value get_item(const Value& obj, const Value& key);
// obj[start:stop:step] with Python slice rules on lists and strings.
Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Items a for loop or filter iterates over: list elements, dict keys, string characters.
std::vector<Value> iterate(const Value& v);
// Python `a in b`.
bool contains(const Value& container, const Value& item);
// Python binary arithmetic for + - * / // % **.
Value arith(const std::string& op, const Value& a, const Value& b);
// Raise the error an Undefined carries when it is used (UndefinedError).
[[noreturn]] void undefined_error(const Value& u);
// Global names: range, namespace, dict, raise_exception, strftime_now.
void add_globals(Dict& d);

// Python string helpers shared with the lexer and tests.
std::string py_strip(const std::string& s, const Value& chars, bool left, bool right);
// Byte length of the Unicode whitespace code point (str.isspace) at s[i], else 0.
size_t py_space_at(const std::string& s, size_t i);

}  // namespace g4::jinja
