// Python's str and dict semantics for the jinja sandbox (jinja_builtins.h): the str / dict methods
// transformers' sandboxed environment allows, Unicode whitespace and case mapping, and the helpers
// the filters share with them.
#include "text/jinja_pystr.h"

#include <algorithm>

#include "text/jinja_builtins.h"
#include "text/utf8.h"

namespace g4::jinja::py {

[[noreturn]] void fail(const std::string& m) { throw JinjaError(m); }

Value undef_attr(const Value& obj, const std::string& name) {
  std::string what = obj.type == Type::None ? "'None'" : "'" + type_name(obj) + " object'";
  return Value::undefined(what + " has no attribute '" + name + "'");
}

std::string need_str(const Value& v, const char* what) {
  if (v.is_undefined()) undefined_error(v);
  if (!v.is_string()) fail(std::string(what) + " expects a string, got " + type_name(v));
  return v.s;
}

// ---- Python whitespace and case helpers (ASCII case mapping; Unicode whitespace) ----
// Length of a Unicode whitespace code point starting at s[i], or 0.
size_t ws_len(const std::string& s, size_t i) {
  unsigned char c = s[i];
  if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return 1;
  if (c == 0xc2 && i + 1 < s.size() && (static_cast<unsigned char>(s[i + 1]) == 0x85 || static_cast<unsigned char>(s[i + 1]) == 0xa0)) return 2;
  if (i + 2 < s.size()) {
    unsigned char c1 = s[i + 1], c2 = s[i + 2];
    if (c == 0xe1 && c1 == 0x9a && c2 == 0x80) return 3;                    // U+1680
    if (c == 0xe2 && c1 == 0x80 && (c2 <= 0x8a || c2 == 0xa8 || c2 == 0xa9 || c2 == 0xaf)) return 3;
    if (c == 0xe2 && c1 == 0x81 && c2 == 0x9f) return 3;                    // U+205F
    if (c == 0xe3 && c1 == 0x80 && c2 == 0x80) return 3;                    // U+3000
  }
  return 0;
}
// Byte length of a whitespace code point ending at s[e-1], or 0.
size_t ws_len_back(const std::string& s, size_t e) {
  for (size_t n = 1; n <= 3 && n <= e; ++n)
    if (ws_len(s, e - n) == n) return n;
  return 0;
}

// ---- Unicode case mapping (Python str.upper/lower) for Latin-1, Latin Extended-A, Greek,
// Cyrillic, Armenian and fullwidth Latin; other scripts are left unchanged.
static uint32_t cp_upper(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c == 0xb5) return 0x39c;
  if (c >= 0xe0 && c <= 0xfe && c != 0xf7) return c - 0x20;
  if (c == 0xff) return 0x178;
  if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177))
    return (c & 1) ? c - 1 : c;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c : c - 1;
  if (c == 0x131) return 'I';
  if (c == 0x17f) return 'S';
  if (c == 0x3c2) return 0x3a3;
  if ((c >= 0x3b1 && c <= 0x3c1) || (c >= 0x3c3 && c <= 0x3cb)) return c - 0x20;
  if (c == 0x3ac) return 0x386;
  if (c >= 0x3ad && c <= 0x3af) return c - 0x25;
  if (c == 0x3cc) return 0x38c;
  if (c == 0x3cd || c == 0x3ce) return c - 0x3f;
  if (c >= 0x430 && c <= 0x44f) return c - 0x20;
  if (c >= 0x450 && c <= 0x45f) return c - 0x50;
  if (c >= 0x460 && c <= 0x481) return (c & 1) ? c - 1 : c;
  if (c >= 0x561 && c <= 0x586) return c - 0x30;
  if (c >= 0xff41 && c <= 0xff5a) return c - 0x20;
  return c;
}
static uint32_t cp_lower(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xc0 && c <= 0xde && c != 0xd7) return c + 0x20;
  if (c == 0x178) return 0xff;
  if ((c >= 0x100 && c <= 0x12f) || (c >= 0x132 && c <= 0x137) || (c >= 0x14a && c <= 0x177))
    return (c & 1) ? c : c + 1;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17e)) return (c & 1) ? c + 1 : c;
  if ((c >= 0x391 && c <= 0x3a1) || (c >= 0x3a3 && c <= 0x3ab)) return c + 0x20;
  if (c == 0x386) return 0x3ac;
  if (c >= 0x388 && c <= 0x38a) return c + 0x25;
  if (c == 0x38c) return 0x3cc;
  if (c == 0x38e || c == 0x38f) return c + 0x3f;
  if (c >= 0x410 && c <= 0x42f) return c + 0x20;
  if (c >= 0x400 && c <= 0x40f) return c + 0x50;
  if (c >= 0x460 && c <= 0x481) return (c & 1) ? c : c + 1;
  if (c >= 0x531 && c <= 0x556) return c + 0x30;
  if (c >= 0xff21 && c <= 0xff3a) return c + 0x20;
  return c;
}
static bool cp_cased(uint32_t c) { return cp_upper(c) != c || cp_lower(c) != c || c == 0xdf; }

// Code point -> UTF-8 (shared encoder in text/utf8.h).
static void put_utf8(std::string& out, uint32_t cp) { utf8::append(out, cp); }
// Code points of a UTF-8 string (invalid bytes pass through as themselves).
static std::vector<uint32_t> code_points(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + n > s.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
    out.push_back(cp);
    i += n;
  }
  return out;
}
static void put_upper(std::string& o, uint32_t c) {
  if (c == 0xdf) o += "SS";
  else put_utf8(o, cp_upper(c));
}
std::string py_lower(const std::string& s) {
  std::string o;
  for (uint32_t c : code_points(s)) put_utf8(o, cp_lower(c));
  return o;
}
std::string py_upper(const std::string& s) {
  std::string o;
  for (uint32_t c : code_points(s)) put_upper(o, c);
  return o;
}
// str.islower()/isupper(): at least one cased character and none of the opposite case.
bool py_islower(const std::string& s) {
  bool cased = false;
  for (uint32_t c : code_points(s)) {
    if (cp_lower(c) != c) return false;
    cased |= cp_upper(c) != c || c == 0xdf;
  }
  return cased;
}
bool py_isupper(const std::string& s) {
  bool cased = false;
  for (uint32_t c : code_points(s)) {
    if (cp_upper(c) != c || c == 0xdf) return false;
    cased |= cp_lower(c) != c;
  }
  return cased;
}
bool is_alpha_ascii(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// str.title(): a cased character after an uncased one is uppercased, other cased ones lowercased.
static std::string py_title(const std::string& s) {
  std::string o;
  bool prev_cased = false;
  for (uint32_t c : code_points(s)) {
    bool cased = cp_cased(c);
    if (cased) {
      if (prev_cased) put_utf8(o, cp_lower(c));
      else put_upper(o, c);
    } else {
      put_utf8(o, c);
    }
    prev_cased = cased;
  }
  return o;
}
// jinja2 do_title: split on runs of [-\s({[<], then word[0].upper() + word[1:].lower().
std::string jinja_title(const std::string& s) {
  auto delim = [](uint32_t c) { return c == '-' || c == ' ' || (c >= 9 && c <= 13) || c == '(' || c == '{' || c == '[' || c == '<'; };
  std::string o;
  bool start = true;
  for (uint32_t c : code_points(s)) {
    if (delim(c)) {
      start = true;
      put_utf8(o, c);
      continue;
    }
    if (start) put_upper(o, c);
    else put_utf8(o, cp_lower(c));
    start = false;
  }
  return o;
}
// str.capitalize(): first character upper (title) case, the rest lower.
std::string py_capitalize(const std::string& s) {
  std::string o;
  bool first = true;
  for (uint32_t c : code_points(s)) {
    if (first) {
      if (c == 0xdf) o += "Ss";
      else put_utf8(o, cp_upper(c));
    } else {
      put_utf8(o, cp_lower(c));
    }
    first = false;
  }
  return o;
}

static std::vector<std::string> split_ws(const std::string& s, int64_t maxsplit) {
  std::vector<std::string> out;
  size_t i = 0, n = s.size();
  while (i < n) {
    size_t w;
    while (i < n && (w = ws_len(s, i))) i += w;
    if (i >= n) break;
    if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
      size_t e = n;
      while (e > i && (w = ws_len_back(s, e))) e -= w;
      out.push_back(s.substr(i, e - i));
      break;
    }
    size_t st = i;
    while (i < n && !ws_len(s, i)) ++i;
    out.push_back(s.substr(st, i - st));
  }
  return out;
}
static std::vector<std::string> split_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> out;
  size_t st = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    size_t f = s.find(sep, st);
    if (f == std::string::npos) break;
    out.push_back(s.substr(st, f - st));
    st = f + sep.size();
  }
  out.push_back(s.substr(st));
  return out;
}
static std::vector<std::string> rsplit_sep(const std::string& s, const std::string& sep, int64_t maxsplit) {
  if (maxsplit < 0) return split_sep(s, sep, -1);
  if (sep.empty()) fail("empty separator");
  std::vector<std::string> out;
  size_t end = s.size();
  while (int64_t(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    size_t f = s.rfind(sep, end - sep.size());
    if (f == std::string::npos) break;
    out.push_back(s.substr(f + sep.size(), end - f - sep.size()));
    end = f;
  }
  out.push_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::string replace_all(const std::string& s, const std::string& old, const std::string& nw, int64_t count) {
  std::string o;
  if (old.empty()) {  // Python inserts `nw` around every character
    auto chars = utf8_chars(s);
    int64_t done = 0;
    for (auto& c : chars) {
      if (count < 0 || done < count) { o += nw; ++done; }
      o += c;
    }
    if (count < 0 || done < count) o += nw;
    return o;
  }
  size_t st = 0;
  int64_t done = 0;
  for (;;) {
    size_t f = (count >= 0 && done >= count) ? std::string::npos : s.find(old, st);
    if (f == std::string::npos) break;
    o.append(s, st, f - st);
    o += nw;
    st = f + old.size();
    ++done;
  }
  o.append(s, st);
  return o;
}

static Value str_list(const std::vector<std::string>& v) {
  List l;
  for (auto& s : v) l.push_back(Value::string(s));
  return Value::make_list(std::move(l));
}

static int64_t cp_index(const std::string& s, size_t byte_off) { return int64_t(utf8_length(s.substr(0, byte_off))); }

Value bound(NativeFn f) { return Value::function(std::move(f)); }

static bool starts_or_ends(const std::string& s, const Value& what, bool start) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return start ? s.compare(0, p.size(), p) == 0 : s.compare(s.size() - p.size(), p.size(), p) == 0;
  };
  if (what.is_list()) {
    for (auto& x : *what.list)
      if (one(need_str(x, start ? "startswith" : "endswith"))) return true;
    return false;
  }
  return one(need_str(what, start ? "startswith" : "endswith"));
}

int64_t to_int_arg(const Value& v, const char* what) {
  if (v.is_integral()) return v.as_int();
  if (v.is_none()) return -1;
  fail(std::string(what) + " expects an integer, got " + type_name(v));
}

// Python str methods allowed by the sandbox.
Value str_method(const std::string& s, const std::string& name) {
  if (name == "startswith" || name == "endswith") {
    bool st = name == "startswith";
    return bound([s, st](CallArgs& a) { return Value::boolean(starts_or_ends(s, a.get(0, "prefix"), st)); });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool l = name != "rstrip", r = name != "lstrip";
    return bound([s, l, r](CallArgs& a) { return Value::string(py_strip(s, a.get(0, "chars", Value::none()), l, r)); });
  }
  if (name == "split" || name == "rsplit") {
    bool rs = name == "rsplit";
    return bound([s, rs](CallArgs& a) {
      Value sep = a.get(0, "sep", Value::none());
      int64_t mx = to_int_arg(a.get(1, "maxsplit", Value::integer(-1)), "split");
      if (sep.is_none()) {
        if (rs && mx >= 0) fail("rsplit() with maxsplit and no separator is not supported");
        return str_list(split_ws(s, mx));
      }
      std::string sp = need_str(sep, "split");
      return str_list(rs ? rsplit_sep(s, sp, mx) : split_sep(s, sp, mx));
    });
  }
  if (name == "upper") return bound([s](CallArgs&) { return Value::string(py_upper(s)); });
  if (name == "lower") return bound([s](CallArgs&) { return Value::string(py_lower(s)); });
  if (name == "title") return bound([s](CallArgs&) { return Value::string(py_title(s)); });
  if (name == "capitalize") return bound([s](CallArgs&) { return Value::string(py_capitalize(s)); });
  if (name == "replace")
    return bound([s](CallArgs& a) {
      int64_t cnt = to_int_arg(a.get(2, "count", Value::integer(-1)), "replace");
      return Value::string(replace_all(s, need_str(a.get(0, "old"), "replace"), need_str(a.get(1, "new"), "replace"), cnt));
    });
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex")
    return bound([s, name](CallArgs& a) {
      std::string sub = need_str(a.get(0, "sub"), name.c_str());
      size_t f = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
      if (f == std::string::npos) {
        if (name.find("index") != std::string::npos) fail("substring not found");
        return Value::integer(-1);
      }
      return Value::integer(cp_index(s, f));
    });
  if (name == "count")
    return bound([s](CallArgs& a) {
      std::string sub = need_str(a.get(0, "sub"), "count");
      if (sub.empty()) return Value::integer(int64_t(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t f = s.find(sub); f != std::string::npos; f = s.find(sub, f + sub.size())) ++n;
      return Value::integer(n);
    });
  if (name == "join")
    return bound([s](CallArgs& a) {
      std::string o;
      bool first = true;
      for (auto& x : iterate(a.get(0, "iterable"))) {
        if (!first) o += s;
        first = false;
        o += need_str(x, "join");
      }
      return Value::string(o);
    });
  if (name == "splitlines")
    return bound([s](CallArgs& a) {
      bool keep = truthy(a.get(0, "keepends", Value::boolean(false)));
      std::vector<std::string> out;
      size_t st = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          size_t e = i;
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          out.push_back(s.substr(st, (keep ? i + 1 : e) - st));
          st = i + 1;
        }
      }
      if (st < s.size()) out.push_back(s.substr(st));
      return str_list(out);
    });
  if (name == "removeprefix" || name == "removesuffix")
    return bound([s, name](CallArgs& a) {
      std::string x = need_str(a.get(0, "prefix"), name.c_str());
      bool pre = name == "removeprefix";
      if (x.size() <= s.size() && (pre ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0))
        return Value::string(pre ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
      return Value::string(s);
    });
  auto pred = [&](auto f) {
    return bound([s, f](CallArgs&) {
      if (s.empty()) return Value::boolean(false);
      for (char c : s)
        if (!f(c)) return Value::boolean(false);
      return Value::boolean(true);
    });
  };
  if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
    return pred([](char c) { return c >= '0' && c <= '9'; });
  if (name == "isalpha") return pred([](char c) { return is_alpha_ascii(c); });
  if (name == "isalnum") return pred([](char c) { return is_alpha_ascii(c) || (c >= '0' && c <= '9'); });
  if (name == "isspace") return pred([](char c) { return c == ' ' || (c >= 9 && c <= 13); });
  if (name == "islower") return bound([s](CallArgs&) { return Value::boolean(py_islower(s)); });
  if (name == "isupper") return bound([s](CallArgs&) { return Value::boolean(py_isupper(s)); });
  if (name == "format") fail("str.format is not supported");
  return Value::undefined("'str object' has no attribute '" + name + "'");
}

Value pairs_of(const Dict& d) {
  List l;
  for (auto& kv : d.items) l.push_back(Value::make_tuple({Value::string(kv.first), kv.second}));
  return Value::make_list(std::move(l));
}

Value dict_method(const Value& obj, const std::string& name) {
  auto d = obj.dict;
  if (name == "items") return bound([d](CallArgs&) { return pairs_of(*d); });
  if (name == "keys")
    return bound([d](CallArgs&) {
      List l;
      for (auto& kv : d->items) l.push_back(Value::string(kv.first));
      return Value::make_list(std::move(l));
    });
  if (name == "values")
    return bound([d](CallArgs&) {
      List l;
      for (auto& kv : d->items) l.push_back(kv.second);
      return Value::make_list(std::move(l));
    });
  if (name == "get")
    return bound([d](CallArgs& a) {
      Value k = a.get(0, "key");
      if (k.is_string())
        if (const Value* v = d->find(k.s)) return *v;
      return a.get(1, "default", Value::none());
    });
  if (name == "copy")
    return bound([d](CallArgs&) {
      Value c = Value::make_dict();
      *c.dict = *d;
      return c;
    });
  return Value();
}

bool is_unsafe_dict_method(const std::string& n) {
  return n == "pop" || n == "popitem" || n == "update" || n == "clear" || n == "setdefault";
}
bool is_unsafe_list_method(const std::string& n) {
  return n == "append" || n == "extend" || n == "insert" || n == "pop" || n == "remove" ||
         n == "clear" || n == "sort" || n == "reverse";
}

}  // namespace g4::jinja::py
