// jinja2 built-ins (jinja2/filters.py, jinja2/tests.py, jinja2/sandbox.py getattr/getitem,
// jinja2/defaults.py globals); the Python str/dict methods the sandbox allows are in jinja_pystr.cpp.
#include "text/jinja_builtins.h"
#include "text/jinja_pystr.h"
#include "text/utf8.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <optional>

namespace g4::jinja {

[[noreturn]] void undefined_error(const Value& u) {
  throw JinjaError(u.s.empty() ? "value is undefined" : u.s);
}

namespace {

using namespace py;  // NOLINT: the str helpers the built-ins share (jinja_pystr.h)

// ---- filter helpers ----
Value attr_path(const Value& v, const Value& attribute) {
  // jinja2 make_attrgetter: "a.b" walks attributes; integers index.
  if (attribute.is_integral()) return get_item(v, attribute);
  std::string path = to_str(attribute);
  Value cur = v;
  size_t st = 0;
  for (;;) {
    size_t dot = path.find('.', st);
    std::string part = path.substr(st, dot == std::string::npos ? std::string::npos : dot - st);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = get_item(cur, numeric ? Value::integer(std::stoll(part)) : Value::string(part));
    if (dot == std::string::npos) break;
    st = dot + 1;
  }
  return cur;
}

// Sort key for dictsort/sort: lower-cased strings unless case_sensitive (jinja2 ignore_case).
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(py_lower(v.s));
  return v;
}

CallArgs shift_args(const CallArgs& a, size_t from) {
  CallArgs r;
  r.line = a.line;
  for (size_t k = from; k < a.pos.size(); ++k) r.pos.push_back(a.pos[k]);
  r.kw = a.kw;
  return r;
}

Value select_impl(const Value& v, CallArgs& a, bool attr_mode, bool want) {
  // jinja2 select_or_reject: (attr,) test name, test args; no test -> truthiness.
  size_t off = 0;
  Value attr;
  if (attr_mode) {
    attr = a.get(0, nullptr);
    off = 1;
  }
  bool has_test = a.pos.size() > off;
  std::string test = has_test ? to_str(a.pos[off]) : "";
  CallArgs targs = shift_args(a, off + 1);
  targs.kw.clear();
  List out;
  if (!truthy(v)) return Value::make_list();  // jinja2 select_or_reject: `if value:` guard
  for (auto& item : iterate(v)) {
    Value x = attr_mode ? attr_path(item, attr) : item;
    bool ok = has_test ? apply_test(test, x, targs) : truthy(x);
    if (ok == want) out.push_back(item);
  }
  return Value::make_list(std::move(out));
}

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&#34;"; break;
      case '\'': o += "&#39;"; break;
      default: o += c;
    }
  }
  return o;
}

// Python round-half-even at `prec` decimals (round(x, n)).
double py_round(double x, int prec) {
  double m = std::pow(10.0, prec);
  double y = x * m;
  double r = std::nearbyint(y);  // default rounding mode: half to even
  return r / m;
}

bool parse_int_str(const std::string& s0, int64_t& out) {
  std::string s = py_strip(s0, Value::none(), true, true);
  if (s.empty()) return false;
  size_t i = 0;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') { neg = s[0] == '-'; i = 1; }
  if (i >= s.size()) return false;
  int64_t v = 0;
  for (; i < s.size(); ++i) {
    if (s[i] == '_') continue;
    if (s[i] < '0' || s[i] > '9') return false;
    v = v * 10 + (s[i] - '0');
  }
  out = neg ? -v : v;
  return true;
}
bool parse_float_str(const std::string& s0, double& out) {
  std::string s = py_strip(s0, Value::none(), true, true);
  if (s.empty()) return false;
  char* end = nullptr;
  out = std::strtod(s.c_str(), &end);
  return end && *end == 0;
}

}  // namespace

size_t py_space_at(const std::string& s, size_t i) { return i < s.size() ? ws_len(s, i) : 0; }

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (chars.is_none() || chars.is_undefined()) {
    size_t w;
    if (left)
      while (b < e && (w = ws_len(s, b))) b += w;
    if (right)
      while (e > b && (w = ws_len_back(s, e)) && e - w >= b) e -= w;
    return s.substr(b, e - b);
  }
  auto set = utf8_chars(need_str(chars, "strip"));
  auto in_set = [&](const std::string& c) { return std::find(set.begin(), set.end(), c) != set.end(); };
  auto cs = utf8_chars(s);
  size_t bi = 0, ei = cs.size();
  if (left)
    while (bi < ei && in_set(cs[bi])) ++bi;
  if (right)
    while (ei > bi && in_set(cs[ei - 1])) --ei;
  std::string o;
  for (size_t k = bi; k < ei; ++k) o += cs[k];
  return o;
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return {};
    case Type::List: return *v.list;
    case Type::Dict: {
      std::vector<Value> o;
      for (auto& kv : v.dict->items) o.push_back(Value::string(kv.first));
      return o;
    }
    case Type::String: {
      std::vector<Value> o;
      for (auto& c : utf8_chars(v.s)) o.push_back(Value::string(c));
      return o;
    }
    default: fail("'" + type_name(v) + "' object is not iterable");
  }
}

bool contains(const Value& c, const Value& item) {
  switch (c.type) {
    case Type::String:
      if (!item.is_string()) fail("'in <string>' requires string as left operand, not " + type_name(item));
      return c.s.find(item.s) != std::string::npos;
    case Type::List:
      for (auto& x : *c.list)
        if (equals(x, item)) return true;
      return false;
    case Type::Dict:
      if (item.is_list() || item.is_dict() || item.type == Type::Namespace) fail("unhashable type: '" + type_name(item) + "'");
      return item.is_string() && c.dict->find(item.s) != nullptr;
    case Type::Undefined: return false;
    default: fail("argument of type '" + type_name(c) + "' is not iterable");
  }
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.type) {
    case Type::Undefined: undefined_error(obj);
    case Type::Dict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      if (is_unsafe_dict_method(name))
        return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
      if (const Value* v = obj.dict->find(name)) return *v;
      return undef_attr(obj, name);
    }
    case Type::Namespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return undef_attr(obj, name);
    case Type::String: return str_method(obj.s, name);
    case Type::List:
      if (is_unsafe_list_method(name))
        return Value::undefined("access to attribute '" + name + "' of 'list' object is unsafe.");
      if (name == "index" || name == "count") {
        auto l = obj.list;
        bool idx = name == "index";
        return bound([l, idx](CallArgs& a) {
          Value x = a.get(0, "value");
          int64_t n = 0;
          for (size_t k = 0; k < l->size(); ++k) {
            if (equals((*l)[k], x)) {
              if (idx) return Value::integer(int64_t(k));
              ++n;
            }
          }
          if (idx) fail("value is not in list");
          return Value::integer(n);
        });
      }
      return undef_attr(obj, name);
    default: return undef_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.type) {
    case Type::Undefined: undefined_error(obj);
    case Type::Dict:
      if (key.is_string()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        return get_attr(obj, key.s);
      }
      return Value::undefined("'dict object' has no attribute " + repr(key));
    case Type::List:
    case Type::String:
      if (key.is_integral()) {
        int64_t n = obj.is_list() ? int64_t(obj.list->size()) : 0;
        std::vector<std::string> chars;
        if (obj.is_string()) {
          chars = utf8_chars(obj.s);
          n = int64_t(chars.size());
        }
        int64_t i = key.as_int();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("'" + type_name(obj) + " object' has no attribute " + to_str(key));
        return obj.is_list() ? (*obj.list)[i] : Value::string(chars[i]);
      }
      if (key.is_string()) return get_attr(obj, key.s);
      fail(type_name(obj) + " indices must be integers or slices, not " + type_name(key));
    default:
      if (key.is_string()) return get_attr(obj, key.s);
      return Value::undefined("'" + type_name(obj) + " object' has no attribute " + repr(key));
  }
}

Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) undefined_error(obj);
  std::vector<Value> items;
  if (obj.is_list()) {
    items = *obj.list;
  } else if (obj.is_string()) {
    items = iterate(obj);
  } else {
    // jinja2 compiles slices to plain Python subscription (no sandbox getitem), so this raises.
    fail("'" + type_name(obj) + "' object is not subscriptable");
  }
  auto opt = [](const Value& v, const char* w) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_integral()) fail(std::string("slice ") + w + " must be an integer or None");
    return v.as_int();
  };
  int64_t n = int64_t(items.size());
  int64_t st = opt(step, "step").value_or(1);
  if (st == 0) fail("slice step cannot be zero");
  // CPython PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> x, int64_t def) {
    if (!x) return def;
    int64_t v = *x;
    if (v < 0) {
      v += n;
      if (v < 0) v = st < 0 ? -1 : 0;
    } else if (v >= n) {
      v = st < 0 ? n - 1 : n;
    }
    return v;
  };
  int64_t b = adjust(opt(start, "start"), st < 0 ? n - 1 : 0);
  int64_t e = adjust(opt(stop, "stop"), st < 0 ? -1 : n);
  List out;
  if (st > 0) {
    for (int64_t i = b; i < e; i += st) out.push_back(items[i]);
  } else {
    for (int64_t i = b; i > e; i += st) out.push_back(items[i]);
  }
  if (obj.is_string()) {
    std::string s;
    for (auto& c : out) s += c.s;
    return Value::string(s);
  }
  Value r = Value::make_list(std::move(out));
  r.tuple = obj.tuple;
  return r;
}

Value arith(const std::string& op, const Value& a, const Value& b) {
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  auto bad = [&]() -> Value {
    fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool fl = a.type == Type::Float || b.type == Type::Float;
    if (op == "/") {
      if (b.as_double() == 0) fail("division by zero");
      return Value::number(a.as_double() / b.as_double());
    }
    if (fl) {
      double x = a.as_double(), y = b.as_double();
      if (op == "+") return Value::number(x + y);
      if (op == "-") return Value::number(x - y);
      if (op == "*") return Value::number(x * y);
      if (op == "**") return Value::number(std::pow(x, y));
      if (y == 0) fail("float division by zero");
      if (op == "//") return Value::number(std::floor(x / y));
      if (op == "%") {
        double m = std::fmod(x, y);
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value::number(m);
      }
    } else {
      int64_t x = a.as_int(), y = b.as_int(), r = 0;
      // Python ints are unbounded; we stop at int64 with an error instead of wrapping.
      auto overflow = [&]() -> Value { fail("integer overflow in " + op + " (beyond 64 bits)"); };
      if (op == "+") return __builtin_add_overflow(x, y, &r) ? overflow() : Value::integer(r);
      if (op == "-") return __builtin_sub_overflow(x, y, &r) ? overflow() : Value::integer(r);
      if (op == "*") return __builtin_mul_overflow(x, y, &r) ? overflow() : Value::integer(r);
      if (op == "**") {
        if (y < 0) return Value::number(std::pow(double(x), double(y)));
        r = 1;
        for (int64_t k = 0; k < y; ++k) {
          if (__builtin_mul_overflow(r, x, &r)) return overflow();
          if (r == 0 || r == 1) break;  // 0**y, 1**y
          if (r == -1) { r = (y % 2) ? -1 : 1; break; }
        }
        return Value::integer(r);
      }
      if (y == 0) fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) return overflow();
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) { q -= 1; m += y; }
      if (op == "//") return Value::integer(q);
      if (op == "%") return Value::integer(m);
    }
    return bad();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.is_list() && b.is_list()) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l));
    }
  }
  if (op == "*") {
    const Value& seq = a.is_integral() ? b : a;
    const Value& cnt = a.is_integral() ? a : b;
    if (cnt.is_integral() && (seq.is_string() || seq.is_list())) {
      int64_t n = std::max<int64_t>(0, cnt.as_int());
      size_t unit = seq.is_string() ? seq.s.size() : seq.list->size();
      const uint64_t cap = seq.is_string() ? kMaxStringBytes : kMaxListItems;
      if (unit && uint64_t(n) > cap / unit) fail("repeated sequence too large");
      if (seq.is_list()) {  // copies of its strings count too
        uint64_t bytes = 0;
        for (const Value& x : *seq.list) bytes += x.s.size();
        if (bytes && uint64_t(n) > kMaxStringBytes / bytes) fail("repeated sequence too large");
      }
      if (seq.is_string()) {
        std::string s;
        for (int64_t k = 0; k < n; ++k) s += seq.s;
        return Value::string(s);
      }
      List l;
      for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq.list->begin(), seq.list->end());
      return Value::make_list(std::move(l));
    }
  }
  if (op == "%" && a.is_string()) fail("printf-style string formatting ('%') is not supported");
  return bad();
}

bool apply_test(const std::string& name, const Value& v, CallArgs& a) {
  const Type t = v.type;
  if (name == "defined") return t != Type::Undefined;
  if (name == "undefined") return t == Type::Undefined;
  if (name == "none") return t == Type::None;
  if (name == "boolean") return t == Type::Bool;
  if (name == "true") return t == Type::Bool && v.b;
  if (name == "false") return t == Type::Bool && !v.b;
  if (name == "integer") return t == Type::Int;
  if (name == "float") return t == Type::Float;
  if (name == "number") return t == Type::Int || t == Type::Float || t == Type::Bool;
  if (name == "string") return t == Type::String;
  if (name == "mapping") return t == Type::Dict;
  // Python: sequence = has __len__ and __getitem__: str, list, dict and jinja2's Undefined.
  if (name == "sequence") return t == Type::String || t == Type::List || t == Type::Dict || t == Type::Undefined;
  if (name == "iterable") return t == Type::String || t == Type::List || t == Type::Dict || t == Type::Undefined;
  if (name == "callable") return t == Type::Func;
  if (name == "lower") return py_islower(to_str(v));
  if (name == "upper") return py_isupper(to_str(v));
  if (name == "odd" || name == "even") {
    if (!v.is_integral()) fail("test '" + name + "' expects an integer");
    int64_t m = ((v.as_int() % 2) + 2) % 2;
    return name == "odd" ? m == 1 : m == 0;
  }
  if (name == "divisibleby") {
    // value % num == 0 with Python numbers (floats allowed, zero raises).
    return equals(arith("%", v, a.get(0, "num")), Value::integer(0));
  }
  Value o = a.get(0, "other");
  if (name == "eq" || name == "equalto" || name == "==") return equals(v, o);
  if (name == "ne" || name == "!=") return !equals(v, o);
  if (name == "lt" || name == "lessthan" || name == "<") return compare(v, o) < 0;
  if (name == "le" || name == "<=") return compare(v, o) <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, o) > 0;
  if (name == "ge" || name == ">=") return compare(v, o) >= 0;
  if (name == "in") return contains(a.get(0, "seq"), v);
  if (name == "sameas") {
    if (v.type != o.type) return false;
    if (t == Type::None || t == Type::Undefined) return true;
    if (t == Type::Bool) return v.b == o.b;
    if (t == Type::List) return v.list == o.list;
    if (t == Type::Dict || t == Type::Namespace) return v.dict == o.dict;
    return equals(v, o);
  }
  fail("no test named '" + name + "'");
}

Value apply_filter(const std::string& name, const Value& v, CallArgs& a) {
  if (name == "safe") return v;
  if (name == "string") return Value::string(to_str(v));
  if (name == "trim") return Value::string(py_strip(to_str(v), a.get(0, "chars", Value::none()), true, true));
  if (name == "upper") return Value::string(py_upper(to_str(v)));
  if (name == "lower") return Value::string(py_lower(to_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "default" || name == "d") {
    bool boolean = truthy(a.get(1, "boolean", Value::boolean(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return a.get(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "length" || name == "count") {
    switch (v.type) {
      case Type::Undefined: return Value::integer(0);
      case Type::String: return Value::integer(int64_t(utf8_length(v.s)));
      case Type::List: return Value::integer(int64_t(v.list->size()));
      case Type::Dict: case Type::Namespace: return Value::integer(int64_t(v.dict->items.size()));
      default: fail("object of type '" + type_name(v) + "' has no len()");
    }
  }
  if (name == "list") return Value::make_list(iterate(v));
  if (name == "first") {
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    auto items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "join") {
    Value attr = a.get(1, "attribute", Value::none());
    std::string sep = to_str(a.get(0, "d", Value::string("")));
    std::string o;
    bool first = true;
    for (auto& x : iterate(v)) {
      if (!first) o += sep;
      first = false;
      o += to_str(attr.is_none() ? x : attr_path(x, attr));
    }
    return Value::string(o);
  }
  if (name == "replace") {
    Value cnt = a.get(2, "count", Value::none());
    return Value::string(replace_all(to_str(v), to_str(a.get(0, "old")), to_str(a.get(1, "new")),
                                     cnt.is_none() ? -1 : to_int_arg(cnt, "replace")));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (!v.is_dict()) fail("items filter expects a mapping, got " + type_name(v));
    return pairs_of(*v.dict);
  }
  if (name == "dictsort") {
    if (!v.is_dict()) fail("dictsort expects a mapping, got " + type_name(v));
    bool cs = truthy(a.get(0, "case_sensitive", Value::boolean(false)));
    std::string by = to_str(a.get(1, "by", Value::string("key")));
    bool rev = truthy(a.get(2, "reverse", Value::boolean(false)));
    if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
    int pos = by == "key" ? 0 : 1;
    List items = *pairs_of(*v.dict).list;
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      int c = compare(sort_key((*x.list)[pos], cs), sort_key((*y.list)[pos], cs));
      return rev ? c > 0 : c < 0;
    });
    return Value::make_list(std::move(items));
  }
  if (name == "sort") {
    bool rev = truthy(a.get(0, "reverse", Value::boolean(false)));
    bool cs = truthy(a.get(1, "case_sensitive", Value::boolean(false)));
    Value attr = a.get(2, "attribute", Value::none());
    List items = iterate(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = attr.is_none() ? x : attr_path(x, attr), ky = attr.is_none() ? y : attr_path(y, attr);
      int c = compare(sort_key(kx, cs), sort_key(ky, cs));
      return rev ? c > 0 : c < 0;
    });
    return Value::make_list(std::move(items));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = utf8_chars(v.s);
      std::string o;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) o += *it;
      return Value::string(o);
    }
    List items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "unique") {
    bool cs = truthy(a.get(0, "case_sensitive", Value::boolean(false)));
    List out, seen;
    for (auto& x : iterate(v)) {
      Value k = sort_key(x, cs);
      bool dup = false;
      for (auto& s : seen) dup |= equals(s, k);
      if (!dup) {
        seen.push_back(k);
        out.push_back(x);
      }
    }
    return Value::make_list(std::move(out));
  }
  if (name == "map") {
    List out;
    if (!truthy(v)) return Value::make_list();  // jinja2 sync_do_map: `if value:` guard
    Value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
      Value def = a.get(99, "default");
      for (auto& x : iterate(v)) {
        Value r = attr_path(x, attr);
        out.push_back(r.is_undefined() && !def.is_undefined() ? def : r);
      }
    } else {
      if (a.pos.empty()) fail("map requires a filter argument");
      std::string f = to_str(a.pos[0]);
      CallArgs rest = shift_args(a, 1);
      for (auto& x : iterate(v)) out.push_back(apply_filter(f, x, rest));
    }
    return Value::make_list(std::move(out));
  }
  if (name == "select" || name == "reject") return select_impl(v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") return select_impl(v, a, true, name == "selectattr");
  if (name == "attr") {
    // jinja2 do_attr: getattr only (no item fallback), so a dict yields only its methods.
    std::string n = to_str(a.get(0, "name"));
    if (v.is_dict()) {
      Value m = dict_method(v, n);
      return m.is_undefined() ? undef_attr(v, n) : m;
    }
    return get_attr(v, n);
  }
  if (name == "tojson") {
    // transformers' override: json.dumps(x, ensure_ascii=False, indent, separators, sort_keys).
    DumpOptions o;
    o.ensure_ascii = truthy(a.get(0, "ensure_ascii", Value::boolean(false)));
    Value ind = a.get(1, "indent", Value::none());
    if (ind.is_integral()) o.indent = int(std::max<int64_t>(0, ind.as_int()));
    else if (ind.is_string()) o.indent_str = ind.s, o.indent = ind.s.empty() ? 0 : -1;
    else if (!ind.is_none()) fail("tojson indent must be an integer or string");
    Value seps = a.get(2, "separators", Value::none());
    if (seps.is_list() && seps.list->size() == 2) {
      o.has_separators = true;
      o.item_sep = to_str((*seps.list)[0]);
      o.key_sep = to_str((*seps.list)[1]);
    } else if (!seps.is_none()) {
      fail("tojson separators must be a pair of strings");
    }
    o.sort_keys = truthy(a.get(3, "sort_keys", Value::boolean(false)));
    if (v.is_undefined()) undefined_error(v);
    return Value::string(json_dumps(v, o));
  }
  if (name == "escape" || name == "e" || name == "forceescape") return Value::string(html_escape(to_str(v)));
  if (name == "int") {
    Value def = a.get(0, "default", Value::integer(0));
    if (v.is_undefined()) undefined_error(v);
    if (v.is_integral()) return Value::integer(v.as_int());
    if (v.type == Type::Float) return Value::integer(int64_t(std::trunc(v.f)));
    if (v.is_string()) {
      int64_t i;
      double d;
      if (parse_int_str(v.s, i)) return Value::integer(i);
      if (parse_float_str(v.s, d)) return Value::integer(int64_t(std::trunc(d)));
    }
    return def;
  }
  if (name == "float") {
    Value def = a.get(0, "default", Value::number(0.0));
    if (v.is_undefined()) undefined_error(v);
    if (v.is_number()) return Value::number(v.as_double());
    double d;
    if (v.is_string() && parse_float_str(v.s, d)) return Value::number(d);
    return def;
  }
  if (name == "abs") {
    if (v.type == Type::Float) return Value::number(std::fabs(v.f));
    if (v.is_integral()) return Value::integer(std::llabs(v.as_int()));
    fail("bad operand type for abs(): '" + type_name(v) + "'");
  }
  if (name == "round") {
    int prec = int(to_int_arg(a.get(0, "precision", Value::integer(0)), "round"));
    std::string method = to_str(a.get(1, "method", Value::string("common")));
    if (!v.is_number()) fail("round expects a number");
    double x = v.as_double(), m = std::pow(10.0, prec);
    if (method == "common") {
      if (v.is_integral() && prec >= 0) return Value::integer(v.as_int());
      return Value::number(py_round(x, prec));
    }
    if (method == "ceil") return Value::number(std::ceil(x * m) / m);
    if (method == "floor") return Value::number(std::floor(x * m) / m);
    fail("method must be common, ceil or floor");
  }
  if (name == "sum") {
    Value attr = a.get(0, "attribute", Value::none());
    Value acc = a.get(1, "start", Value::integer(0));
    for (auto& x : iterate(v)) acc = arith("+", acc, attr.is_none() ? x : attr_path(x, attr));
    return acc;
  }
  if (name == "min" || name == "max") {
    bool cs = truthy(a.get(0, "case_sensitive", Value::boolean(false)));
    Value attr = a.get(1, "attribute", Value::none());
    auto items = iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    Value best = items[0];
    for (size_t k = 1; k < items.size(); ++k) {
      Value kx = attr.is_none() ? items[k] : attr_path(items[k], attr);
      Value kb = attr.is_none() ? best : attr_path(best, attr);
      int c = compare(sort_key(kx, cs), sort_key(kb, cs));
      if (name == "min" ? c < 0 : c > 0) best = items[k];
    }
    return best;
  }
  if (name == "indent") {
    // jinja2 do_indent (3.1): appends "\n" then works on splitlines().
    Value w = a.get(0, "width", Value::integer(4));
    std::string ind = w.is_string() ? w.s : std::string(size_t(std::max<int64_t>(0, to_int_arg(w, "indent"))), ' ');
    bool first = truthy(a.get(1, "first", Value::boolean(false)));
    bool blank = truthy(a.get(2, "blank", Value::boolean(false)));
    if (!v.is_string()) {
      if (v.is_undefined()) undefined_error(v);
      fail("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
    }
    std::string s = v.s + "\n";
    CallArgs none;
    Value lines_v = str_method(s, "splitlines");
    std::vector<Value> lines = *(*lines_v.fn)(none).list;
    std::string rv;
    if (blank) {
      for (size_t k = 0; k < lines.size(); ++k) rv += (k ? "\n" + ind : "") + lines[k].s;
    } else {
      rv = lines.empty() ? "" : lines[0].s;
      for (size_t k = 1; k < lines.size(); ++k) rv += "\n" + (lines[k].s.empty() ? "" : ind + lines[k].s);
    }
    if (first) rv = ind + rv;
    return Value::string(rv);
  }
  if (name == "wordcount") {
    // len(re.findall(r"\w+", s)) with Unicode \w approximated: letters and digits are word
    // characters, the punctuation/symbol/emoji blocks are not.
    std::string s = to_str(v);
    int64_t n = 0;
    bool in_word = false;
    for (size_t i = 0; i < s.size();) {
      size_t st = i;
      unsigned char c = s[i];
      uint32_t cp = c;
      int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      if (len > 1 && st + len <= s.size()) {
        cp = c & (0xff >> (len + 1));
        for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[st + k]) & 0x3f);
      }
      i = std::min(s.size(), st + len);
      bool w = cp < 0x80 ? (is_alpha_ascii(char(cp)) || (cp >= '0' && cp <= '9') || cp == '_')
                         : !((cp >= 0x80 && cp <= 0xbf) || cp == 0xd7 || cp == 0xf7 || (cp >= 0x2000 && cp <= 0x2bff) ||
                             (cp >= 0x3000 && cp <= 0x303f) || (cp >= 0xfe30 && cp <= 0xfe4f) ||
                             (cp >= 0xff00 && cp <= 0xff0f) || (cp >= 0x1f000 && cp <= 0x1faff));
      n += w && !in_word;
      in_word = w;
    }
    return Value::integer(n);
  }
  fail("no filter named '" + name + "'");
}

void add_globals(Dict& d) {
  d.set("range", Value::function([](CallArgs& a) {
    auto num = [](const Value& v) {
      if (!v.is_integral()) fail("range() arguments must be integers, got " + type_name(v));
      return v.as_int();
    };
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = num(a.pos[0]);
    } else if (a.pos.size() == 2 || a.pos.size() == 3) {
      start = num(a.pos[0]);
      stop = num(a.pos[1]);
      if (a.pos.size() == 3) step = num(a.pos[2]);
    } else {
      fail("range expected 1 to 3 arguments");
    }
    if (step == 0) fail("range() arg 3 must not be zero");
    List l;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      l.push_back(Value::integer(i));
      if (l.size() > kMaxListItems) fail("range too big");
    }
    return Value::make_list(std::move(l));
  }));
  auto make_mapping = [](CallArgs& a, Value out) {
    if (!a.pos.empty()) {
      const Value& init = a.pos[0];
      if (init.is_dict()) {
        for (auto& kv : init.dict->items) out.dict->set(kv.first, kv.second);
      } else {
        for (auto& p : iterate(init)) {
          if (!p.is_list() || p.list->size() != 2 || !(*p.list)[0].is_string())
            fail("dictionary update sequence element has wrong shape");
          out.dict->set((*p.list)[0].s, (*p.list)[1]);
        }
      }
    }
    for (auto& kv : a.kw) out.dict->set(kv.first, kv.second);
    return out;
  };
  d.set("namespace", Value::function([make_mapping](CallArgs& a) {
    Value ns = make_mapping(a, Value::make_namespace());
    for (auto& kv : ns.dict->items)
      if (!kv.first.empty() && kv.first[0] == '_')
        fail("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + kv.first + "'");
    return ns;
  }));
  d.set("dict", Value::function([make_mapping](CallArgs& a) { return make_mapping(a, Value::make_dict()); }));
  d.set("raise_exception", Value::function([](CallArgs& a) -> Value {
    throw JinjaError("raise_exception: " + to_str(a.get(0, "message")));
  }));
  d.set("strftime_now", Value::function([](CallArgs& a) {
    std::string fmt = need_str(a.get(0, "format"), "strftime_now");
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[512];
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  }));
}

}  // namespace g4::jinja
