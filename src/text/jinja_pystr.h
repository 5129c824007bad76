// Python's str and dict semantics for the jinja sandbox, shared by the built-ins
// (jinja_builtins.cpp): what the methods and filters need of them. Internal to src/text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include "text/jinja_value.h"

namespace g4::jinja::py {

// Throws JinjaError(m).
[[noreturn]] void fail(const std::string& m);
// The Undefined that `obj.name` gives when obj has no such attribute.
Value undef_attr(const Value& obj, const std::string& name);
// v's string, or a JinjaError naming `what` and v's type.
std::string need_str(const Value& v, const char* what);
// Byte length of the Unicode whitespace code point starting at s[i] / ending at s[e - 1], or 0.
size_t ws_len(const std::string& s, size_t i);
size_t ws_len_back(const std::string& s, size_t e);
// str.lower(), str.upper(), str.islower(), str.isupper(), str.capitalize().
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
bool py_islower(const std::string& s);
bool py_isupper(const std::string& s);
std::string py_capitalize(const std::string& s);
bool is_alpha_ascii(char c);
// jinja2's do_title (not str.title()).
std::string jinja_title(const std::string& s);
// str.replace(old, new, count); count < 0: all.
std::string replace_all(const std::string& s, const std::string& old, const std::string& nw, int64_t count);
// A native function as a callable Value (a bound method).
Value bound(NativeFn f);
// An integer argument, or a JinjaError naming `what`.
int64_t to_int_arg(const Value& v, const char* what);
// `s.name` for the str methods the sandbox allows; Undefined for others.
Value str_method(const std::string& s, const std::string& name);
// dict.items() of d as a list of [key, value] pairs.
Value pairs_of(const Dict& d);
// `obj.name` for the dict methods the sandbox allows; an empty Value for others.
Value dict_method(const Value& obj, const std::string& name);
// Methods the sandbox refuses (they modify the object).
bool is_unsafe_dict_method(const std::string& n);
bool is_unsafe_list_method(const std::string& n);

}  // namespace g4::jinja::py
