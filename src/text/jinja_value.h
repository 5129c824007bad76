// Value model of the Jinja interpreter (see jinja_template.h for why we have our own Jinja).
//
// A Value mirrors the Python objects a chat template sees after transformers'
// `_plain_template_data`: None, bool, int, float, str, list, dict (insertion-ordered, string keys),
// plus jinja2's Undefined, jinja2.utils.Namespace and callables (macros, globals, bound methods).
// Printing and comparison follow Python: str(1.0) == "1.0", str(True) == "True", 1 == 1.0 == True.
// Lists, dicts and namespaces are shared by reference like Python objects; the interpreter never
// mutates lists or dicts (HF renders in an ImmutableSandboxedEnvironment), only namespaces.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace g4::jinja {

// A render or parse failure; `line` is the 1-based template line (0: unknown).
struct JinjaError : std::runtime_error {
  JinjaError(const std::string& m, int l = 0) : std::runtime_error(m), line(l) {}
  int line;
};

// Size bounds of one render's values (the interpreter and the builtins check them where values
// are made): a hostile template ends with an error instead of taking the machine's memory.
constexpr size_t kMaxStringBytes = size_t(16) << 20;  // any string value, and the output
constexpr size_t kMaxListItems = size_t(1) << 20;     // any list (range(), repetition, ...)
// Containers nested inside one another that str / repr / == / < / tojson walk (a list holding
// itself is circular: repr prints it as [...] as Python does, the others stop with an error).
constexpr int kMaxNesting = 200;

struct Value;
struct Dict;
struct CallArgs;
using List = std::vector<Value>;
using NativeFn = std::function<Value(CallArgs&)>;

enum class Type : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Func };

struct Value {
  Type type = Type::Undefined;
  bool b = false;
  bool tuple = false;              // a List that Python would hold as a tuple (prints "(a, b)")
  int64_t i = 0;
  double f = 0;
  std::string s;                   // String payload; for Undefined: what was undefined (for errors)
  std::shared_ptr<List> list;      // List
  std::shared_ptr<Dict> dict;      // Dict and Namespace
  std::shared_ptr<NativeFn> fn;    // Func

  Value() = default;
  static Value undefined(std::string hint = "") { Value v; v.s = std::move(hint); return v; }
  static Value none() { Value v; v.type = Type::None; return v; }
  static Value boolean(bool x) { Value v; v.type = Type::Bool; v.b = x; return v; }
  static Value integer(int64_t x) { Value v; v.type = Type::Int; v.i = x; return v; }
  static Value number(double x) { Value v; v.type = Type::Float; v.f = x; return v; }
  static Value string(std::string x) { Value v; v.type = Type::String; v.s = std::move(x); return v; }
  static Value make_list(List items = {});
  static Value make_tuple(List items);
  static Value make_dict();
  static Value make_namespace();
  static Value function(NativeFn f);

  bool is_undefined() const { return type == Type::Undefined; }
  bool is_none() const { return type == Type::None; }
  bool is_string() const { return type == Type::String; }
  bool is_list() const { return type == Type::List; }
  bool is_dict() const { return type == Type::Dict; }
  bool is_number() const { return type == Type::Bool || type == Type::Int || type == Type::Float; }
  bool is_integral() const { return type == Type::Bool || type == Type::Int; }  // Python int incl. bool
  double as_double() const { return type == Type::Float ? f : type == Type::Bool ? (b ? 1 : 0) : double(i); }
  int64_t as_int() const { return type == Type::Bool ? (b ? 1 : 0) : i; }
};

// Insertion-ordered string-keyed dict (JSON object key order is kept, as Python's json does).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& k) const;
  Value* find(const std::string& k);
  void set(const std::string& k, Value v);  // replaces in place or appends
};

// Arguments of a call: positional then keyword, plus the line for error messages.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  int line = 0;
  // Python-style binding: the i-th positional or keyword `name`, else `def` (undefined when absent).
  Value get(size_t i, const char* name, Value def = Value()) const;
  bool has(size_t i, const char* name) const;
};

// Python semantics.
bool truthy(const Value& v);
std::string to_str(const Value& v);        // str(v); Undefined prints as ""
std::string repr(const Value& v);          // repr(v)
std::string py_repr_string(const std::string& s);
std::string py_float_repr(double d);       // repr(float): shortest round-trip, Python layout
bool equals(const Value& a, const Value& b);
// Python `<`: -1/0/1; throws JinjaError for unorderable types.
int compare(const Value& a, const Value& b);
std::string type_name(const Value& v);     // Python type name: 'str', 'int', 'dict', ...

// JSON bridge. Objects keep key order; integers stay integers (uint64 beyond int64 -> float).
Value from_json(const nlohmann::ordered_json& j);
// json.dumps(v, ensure_ascii, indent, separators, sort_keys) as HF's `tojson` filter calls it.
// indent < 0 means None; indent_str, when non-empty, is a string indent.
struct DumpOptions {
  bool ensure_ascii = false;
  int indent = -1;
  std::string indent_str;
  bool has_separators = false;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
std::string json_dumps(const Value& v, const DumpOptions& o);

// UTF-8 helpers (Python str indexes code points).
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace g4::jinja
