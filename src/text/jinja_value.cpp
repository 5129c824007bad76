// Python semantics for jinja Values: str(), repr(), ==, <, json.dumps. Mirrors CPython's
// object_str/float_repr/unicode_repr and the stdlib json encoder.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

#include <nlohmann/json.hpp>

namespace g4::jinja {

namespace {
// The containers whose repr is being built, innermost last (CPython's Py_ReprEnter): one met again
// inside itself prints as [...] / {...}.
thread_local std::vector<const void*> g_repr_active;
struct ReprEnter {
  const void* p;
  bool again;
  explicit ReprEnter(const void* q)
      : p(q), again(std::find(g_repr_active.begin(), g_repr_active.end(), q) != g_repr_active.end()) {
    if (again) return;
    if (g_repr_active.size() >= size_t(kMaxNesting)) throw JinjaError("values nested too deeply to print");
    g_repr_active.push_back(p);
  }
  ~ReprEnter() {
    if (!again) g_repr_active.pop_back();
  }
  ReprEnter(const ReprEnter&) = delete;
  ReprEnter& operator=(const ReprEnter&) = delete;
};
// Bounds the recursion of ==, < and json.dumps over nested (or circular) containers.
thread_local int g_nesting = 0;
struct NestGuard {
  explicit NestGuard(const char* what) {
    if (g_nesting >= kMaxNesting) throw JinjaError(std::string(what) + ": values nested too deeply (or circular)");
    ++g_nesting;
  }
  ~NestGuard() { --g_nesting; }
  NestGuard(const NestGuard&) = delete;
  NestGuard& operator=(const NestGuard&) = delete;
};
}  // namespace

Value Value::make_list(List items) {
  Value v;
  v.type = Type::List;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_tuple(List items) {
  Value v = make_list(std::move(items));
  v.tuple = true;
  return v;
}
Value Value::make_dict() {
  Value v;
  v.type = Type::Dict;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_namespace() {
  Value v;
  v.type = Type::Namespace;
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::function(NativeFn f) {
  Value v;
  v.type = Type::Func;
  v.fn = std::make_shared<NativeFn>(std::move(f));
  return v;
}

const Value* Dict::find(const std::string& k) const {
  for (auto& kv : items)
    if (kv.first == k) return &kv.second;
  return nullptr;
}
Value* Dict::find(const std::string& k) {
  for (auto& kv : items)
    if (kv.first == k) return &kv.second;
  return nullptr;
}
void Dict::set(const std::string& k, Value v) {
  if (Value* p = find(k)) {
    *p = std::move(v);
  } else {
    items.emplace_back(k, std::move(v));
  }
}

Value CallArgs::get(size_t i, const char* name, Value def) const {
  if (i < pos.size()) return pos[i];
  if (name)
    for (auto& kv : kw)
      if (kv.first == name) return kv.second;
  return def;
}
bool CallArgs::has(size_t i, const char* name) const {
  if (i < pos.size()) return true;
  if (name)
    for (auto& kv : kw)
      if (kv.first == name) return true;
  return false;
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Type::Undefined: case Type::None: return false;
    case Type::Bool: return v.b;
    case Type::Int: return v.i != 0;
    case Type::Float: return v.f != 0;
    case Type::String: return !v.s.empty();
    case Type::List: return !v.list->empty();
    case Type::Dict: return !v.dict->items.empty();
    default: return true;
  }
}

std::string type_name(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::List: return "list";
    case Type::Dict: return "dict";
    case Type::Namespace: return "Namespace";
    default: return "function";
  }
}

// CPython float_repr_style 'short': shortest round-trip digits; fixed notation when the decimal
// point position is in (-4, 16], else d.ddde+XX.
std::string py_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') { out = "-"; p = 1; }
  size_t e = sci.find('e');
  std::string digits;
  for (size_t k = p; k < e; ++k)
    if (sci[k] != '.') digits += sci[k];
  int exp10 = std::atoi(sci.c_str() + e + 1);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  int decpt = exp10 + 1;
  int nd = int(digits.size());
  if (decpt > -4 && decpt <= 16) {
    if (decpt <= 0) {
      out += "0." + std::string(-decpt, '0') + digits;
    } else if (decpt >= nd) {
      out += digits + std::string(decpt - nd, '0') + ".0";
    } else {
      out += digits.substr(0, decpt) + "." + digits.substr(decpt);
    }
  } else {
    out += digits.substr(0, 1);
    if (nd > 1) out += "." + digits.substr(1);
    int x = decpt - 1;
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    out += eb;
  }
  return out;
}

static uint32_t decode_utf8(const std::string& s, size_t& i) {
  unsigned char c = s[i];
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += n;
  return cp;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    size_t st = i;
    decode_utf8(s, i);
    out.push_back(s.substr(st, i - st));
  }
  return out;
}
size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Code points that Python's str.isprintable() rejects, approximated: controls, C1, and the
// separator/format characters that appear in practice.
static bool py_unprintable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7f && cp <= 0xa0) || cp == 0xad) return true;
  if ((cp >= 0x2000 && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202f) ||
      (cp >= 0x205f && cp <= 0x206f) || cp == 0x3000 || cp == 0xfeff || cp == 0x1680)
    return true;
  return false;
}

std::string py_repr_string(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = (has_sq && !has_dq) ? '"' : '\'';
  std::string out(1, q);
  for (size_t i = 0; i < s.size();) {
    size_t st = i;
    uint32_t cp = decode_utf8(s, i);
    char b[16];
    if (cp == static_cast<uint32_t>(q) || cp == '\\') {
      out += '\\';
      out += char(cp);
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (py_unprintable(cp)) {
      if (cp < 0x100) std::snprintf(b, sizeof b, "\\x%02x", cp);
      else std::snprintf(b, sizeof b, "\\u%04x", cp);
      out += b;
    } else {
      out.append(s, st, i - st);
    }
  }
  out += q;
  return out;
}

std::string repr(const Value& v) {
  switch (v.type) {
    case Type::String: return py_repr_string(v.s);
    case Type::List: {
      const ReprEnter enter(v.list.get());
      if (enter.again) return v.tuple ? "(...)" : "[...]";
      std::string o = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) o += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.tuple && v.list->size() == 1) o += ",";
      return o + (v.tuple ? ")" : "]");
    }
    case Type::Dict: {
      const ReprEnter enter(v.dict.get());
      if (enter.again) return "{...}";
      std::string o = "{";
      bool first = true;
      for (auto& kv : v.dict->items) {
        o += (first ? "" : ", ") + py_repr_string(kv.first) + ": " + repr(kv.second);
        first = false;
      }
      return o + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.type) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return v.b ? "True" : "False";
    case Type::Int: return std::to_string(v.i);
    case Type::Float: return py_float_repr(v.f);
    case Type::String: return v.s;
    case Type::List: case Type::Dict: return repr(v);
    case Type::Namespace: {
      const ReprEnter enter(v.dict.get());
      if (enter.again) return "<Namespace {...}>";
      std::string o = "<Namespace {";
      bool first = true;
      for (auto& kv : v.dict->items) {
        o += (first ? "" : ", ") + py_repr_string(kv.first) + ": " + repr(kv.second);
        first = false;
      }
      return o + "}>";
    }
    default: return "<function>";
  }
}

bool equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Type::Float || b.type == Type::Float) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type != b.type) return false;
  const NestGuard nest("==");
  switch (a.type) {
    case Type::Undefined: case Type::None: return true;
    case Type::String: return a.s == b.s;
    case Type::List: {
      if (a.list == b.list) return true;  // the same list (Python compares items by identity first)
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equals((*a.list)[k], (*b.list)[k])) return false;
      return true;
    }
    case Type::Dict: {
      if (a.dict == b.dict) return true;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equals(kv.second, *o)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.fn == b.fn;
  }
}

int compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.type == Type::Float || b.type == Type::Float) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.type == Type::String && b.type == Type::String) {
    int c = a.s.compare(b.s);  // UTF-8 byte order == code point order
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.type == Type::List && b.type == Type::List) {
    const NestGuard nest("<");
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k) {
      if (equals((*a.list)[k], (*b.list)[k])) continue;
      return compare((*a.list)[k], (*b.list)[k]);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  throw JinjaError("'<' not supported between instances of '" + type_name(a) + "' and '" +
                   type_name(b) + "'");
}

Value from_json(const nlohmann::ordered_json& j) {
  using J = nlohmann::ordered_json;
  switch (j.type()) {
    case J::value_t::null: return Value::none();
    case J::value_t::boolean: return Value::boolean(j.get<bool>());
    case J::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case J::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u <= uint64_t(INT64_MAX)) return Value::integer(int64_t(u));
      return Value::number(double(u));
    }
    case J::value_t::number_float: return Value::number(j.get<double>());
    case J::value_t::string: return Value::string(j.get<std::string>());
    case J::value_t::array: {
      List l;
      for (auto& e : j) l.push_back(from_json(e));
      return Value::make_list(std::move(l));
    }
    case J::value_t::object: {
      Value d = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), from_json(it.value()));
      return d;
    }
    default: return Value::none();
  }
}

// json.encoder.py_encode_basestring(_ascii).
static void json_string(const std::string& s, bool ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    size_t st = i;
    uint32_t cp = decode_utf8(s, i);
    char b[16];
    switch (cp) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (cp < 0x20 || (ascii && cp >= 0x7f)) {
          if (cp >= 0x10000) {
            uint32_t v = cp - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 | (v >> 10), 0xdc00 | (v & 0x3ff));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", cp);
          }
          out += b;
        } else {
          out.append(s, st, i - st);
        }
    }
  }
  out += '"';
}

static void dumps_rec(const Value& v, const DumpOptions& o, int level, std::string& out) {
  const NestGuard nest("tojson");
  bool pretty = o.indent >= 0 || !o.indent_str.empty();
  std::string item_sep = o.has_separators ? o.item_sep : (pretty ? "," : ", ");
  const std::string& key_sep = o.key_sep;
  auto newline = [&](int lvl) {
    out += '\n';
    for (int k = 0; k < lvl; ++k) out += o.indent_str.empty() ? std::string(o.indent, ' ') : o.indent_str;
  };
  switch (v.type) {
    case Type::None: out += "null"; return;
    case Type::Bool: out += v.b ? "true" : "false"; return;
    case Type::Int: out += std::to_string(v.i); return;
    case Type::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float_repr(v.f);
      return;
    case Type::String: json_string(v.s, o.ensure_ascii, out); return;
    case Type::List: {
      if (v.list->empty()) { out += "[]"; return; }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += item_sep;
        if (pretty) newline(level + 1);
        dumps_rec((*v.list)[k], o, level + 1, out);
      }
      if (pretty) newline(level);
      out += ']';
      return;
    }
    case Type::Dict: {
      if (v.dict->items.empty()) { out += "{}"; return; }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : v.dict->items) items.push_back(&kv);
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        if (pretty) newline(level + 1);
        json_string(kv->first, o.ensure_ascii, out);
        out += key_sep;
        dumps_rec(kv->second, o, level + 1, out);
      }
      if (pretty) newline(level);
      out += '}';
      return;
    }
    default:
      throw JinjaError("Object of type " + type_name(v) + " is not JSON serializable");
  }
}

std::string json_dumps(const Value& v, const DumpOptions& o) {
  std::string out;
  dumps_rec(v, o, 0, out);
  return out;
}

}  // namespace g4::jinja
