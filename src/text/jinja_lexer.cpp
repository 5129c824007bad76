// Jinja lexer; see jinja_lexer.h for the contract. Follows jinja2/lexer.py (3.1.6) rule by rule.
#include "text/jinja_lexer.h"
#include "text/utf8.h"

#include <cstring>

#include "text/jinja_builtins.h"
#include "text/jinja_value.h"

namespace g4::jinja {
namespace {

// Python's \s / str.isspace(): jinja2's lexer regexes and rstrip() are Unicode-aware.
size_t skip_ws(const std::string& s, size_t p) {
  while (size_t n = py_space_at(s, p)) p += n;
  return p;
}
bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_ident(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Code point -> UTF-8 (shared encoder in text/utf8.h).
inline void append_utf8(std::string& out, uint32_t cp) { utf8::append(out, cp); }

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding as jinja2 applies it to string literals.
std::string unescape(const std::string& s, int line) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '\\' || i + 1 >= s.size()) {
      out += c;
      continue;
    }
    char n = s[++i];
    switch (n) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': case 'u': case 'U': {
        int len = n == 'x' ? 2 : n == 'u' ? 4 : 8;
        uint32_t cp = 0;
        for (int k = 0; k < len; ++k) {
          int h = i + 1 + k < s.size() ? hexval(s[i + 1 + k]) : -1;
          if (h < 0) throw JinjaError("invalid \\" + std::string(1, n) + " escape in string literal", line);
          cp = cp * 16 + h;
        }
        i += len;
        append_utf8(out, cp);
        break;
      }
      default:
        if (n >= '0' && n <= '7') {
          uint32_t cp = n - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k)
            cp = cp * 8 + (s[++i] - '0');
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += n;
        }
    }
  }
  return out;
}

struct Lexer {
  const std::string& src;
  const LexOptions& o;
  std::vector<Token> toks;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;

  void advance_to(size_t p) {
    for (size_t k = pos; k < p && k < src.size(); ++k) line += src[k] == '\n';
    pos = p;
  }
  bool at(const char* s) const { return src.compare(pos, std::strlen(s), s) == 0; }

  // Consume a tag end: "+%}", "-%}\s*", "%}\n?" (trim_blocks). `close` is "%}" / "#}" / "}}".
  void consume_end(const std::string& close, bool trims) {
    if (src[pos] == '+') {
      advance_to(pos + 1 + close.size());
    } else if (src[pos] == '-') {
      advance_to(skip_ws(src, pos + 1 + close.size()));
    } else {
      size_t p = pos + close.size();
      if (trims && o.trim_blocks && p < src.size() && src[p] == '\n') ++p;
      advance_to(p);
    }
    line_starting = src[pos - 1] == '\n';
  }

  // Is there a tag end at pos (given the brace balance)?
  bool at_end(const std::string& close) const {
    if (src.compare(pos, close.size(), close) == 0) return true;
    if ((src[pos] == '-' || (src[pos] == '+' && close == "%}")) &&
        src.compare(pos + 1, close.size(), close) == 0)
      return true;
    return false;
  }

  void lex_tag(Tok begin, Tok end, const std::string& close) {
    toks.push_back({begin, "", line});
    std::vector<char> balance;
    for (;;) {
      advance_to(skip_ws(src, pos));
      if (pos >= src.size())
        throw JinjaError(std::string("unexpected end of template, expected '") + close + "'", line);
      if (balance.empty() && at_end(close)) {
        int l = line;
        consume_end(close, end == Tok::BlockEnd);
        toks.push_back({end, "", l});
        return;
      }
      char c = src[pos];
      if (is_ident_start(c)) {
        size_t p = pos;
        while (p < src.size() && is_ident(src[p])) ++p;
        toks.push_back({Tok::Name, src.substr(pos, p - pos), line});
        advance_to(p);
      } else if (is_digit(c)) {
        size_t p = pos;
        std::string num;
        auto digits = [&] {
          while (p < src.size() && (is_digit(src[p]) || (src[p] == '_' && p + 1 < src.size() && is_digit(src[p + 1]))))
            if (src[p++] != '_') num += src[p - 1];
        };
        digits();
        bool is_float = false;
        if (p + 1 < src.size() && src[p] == '.' && is_digit(src[p + 1])) {
          is_float = true;
          num += src[p++];
          digits();
        }
        if (p < src.size() && (src[p] == 'e' || src[p] == 'E')) {
          size_t q = p + 1;
          if (q < src.size() && (src[q] == '+' || src[q] == '-')) ++q;
          if (q < src.size() && is_digit(src[q])) {
            is_float = true;
            num += 'e';
            num.append(src, p + 1, q - p - 1);
            p = q;
            digits();
          }
        }
        toks.push_back({is_float ? Tok::Float : Tok::Int, num, line});
        advance_to(p);
      } else if (c == '\'' || c == '"') {
        size_t p = pos + 1;
        while (p < src.size() && src[p] != c) p += src[p] == '\\' ? 2 : 1;
        if (p >= src.size()) throw JinjaError("unterminated string literal", line);
        toks.push_back({Tok::String, unescape(src.substr(pos + 1, p - pos - 1), line), line});
        advance_to(p + 1);
      } else {
        static const char* ops2[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* o2 : ops2)
          if (at(o2)) op = o2;
        if (op.empty()) {
          if (!std::strchr("+-/*%~[](){}><=.:|,;", c))
            throw JinjaError(std::string("unexpected char '") + c + "'", line);
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) throw JinjaError("unexpected '" + op + "'", line);
          if (balance.back() != op[0])
            throw JinjaError("unexpected '" + op + "', expected '" + balance.back() + "'", line);
          balance.pop_back();
        }
        toks.push_back({Tok::Op, op, line});
        advance_to(pos + op.size());
      }
    }
  }

  // "{% raw %}" at pos (pos at '{')? Returns the position after the opening tag, or npos.
  size_t raw_begin(size_t start) const {
    size_t p = start + 2;
    if (p < src.size() && (src[p] == '-' || src[p] == '+')) ++p;
    p = skip_ws(src, p);
    if (src.compare(p, 3, "raw") != 0 || (p + 3 < src.size() && is_ident(src[p + 3]))) return std::string::npos;
    p = skip_ws(src, p + 3);
    if (src.compare(p, 3, "-%}") == 0) return skip_ws(src, p + 3);
    if (src.compare(p, 2, "%}") == 0) return p + 2;
    return std::string::npos;
  }

  // Text before a tag, with `-` stripping and lstrip_blocks applied.
  void emit_text(std::string text, char sign, bool lstrip_ok) {
    if (sign == '-') {
      text = py_strip(text, Value::none(), false, true);
    } else if (sign != '+' && o.lstrip_blocks && lstrip_ok) {
      size_t nl = text.rfind('\n');
      size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting) && l_pos < text.size()) {
        if (skip_ws(text, l_pos) == text.size()) text.resize(l_pos);
      }
    }
    if (!text.empty()) toks.push_back({Tok::Text, text, line});
  }

  void run() {
    while (pos < src.size()) {
      size_t start = pos;
      for (;;) {
        start = src.find('{', start);
        if (start == std::string::npos || start + 1 >= src.size()) { start = std::string::npos; break; }
        char k = src[start + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++start;
      }
      if (start == std::string::npos) {
        toks.push_back({Tok::Text, src.substr(pos), line});
        advance_to(src.size());
        break;
      }
      char kind = src[start + 1];
      char sign = start + 2 < src.size() && (src[start + 2] == '-' || src[start + 2] == '+') ? src[start + 2] : 0;
      int text_line = line;
      emit_text(src.substr(pos, start - pos), sign, kind != '{');
      if (!toks.empty() && toks.back().kind == Tok::Text) toks.back().line = text_line;
      advance_to(start);
      size_t raw = kind == '%' ? raw_begin(start) : std::string::npos;
      if (raw != std::string::npos) {
        lex_raw(raw);
        continue;
      }
      advance_to(start + 2 + (sign ? 1 : 0));
      line_starting = false;
      if (kind == '#') {
        size_t e = src.find("#}", pos);
        if (e == std::string::npos) throw JinjaError("Missing end of comment tag", line);
        size_t p = e;
        if (p > pos && (src[p - 1] == '-' || src[p - 1] == '+')) --p;
        advance_to(p);
        consume_end("#}", true);
      } else if (kind == '%') {
        lex_tag(Tok::BlockBegin, Tok::BlockEnd, "%}");
      } else {
        lex_tag(Tok::VarBegin, Tok::VarEnd, "}}");
      }
    }
    toks.push_back({Tok::Eof, "", line});
  }

  // Body of {% raw %} up to {% endraw %}, emitted verbatim as text.
  void lex_raw(size_t body) {
    int l = line;
    advance_to(body);
    size_t p = body;
    for (;;) {
      p = src.find("{%", p);
      if (p == std::string::npos) throw JinjaError("Missing end of raw directive", l);
      size_t q = p + 2;
      char sign = q < src.size() && (src[q] == '-' || src[q] == '+') ? src[q] : 0;
      if (sign) ++q;
      q = skip_ws(src, q);
      if (src.compare(q, 6, "endraw") == 0) {
        q = skip_ws(src, q + 6);
        if (at_end_at(q)) {
          line_starting = false;
          emit_text(src.substr(body, p - body), sign, true);
          advance_to(q);
          consume_end("%}", true);
          return;
        }
      }
      p += 2;
    }
  }
  bool at_end_at(size_t q) const {
    return src.compare(q, 2, "%}") == 0 || src.compare(q, 3, "-%}") == 0 || src.compare(q, 3, "+%}") == 0;
  }
};

}  // namespace

std::vector<Token> lex(const std::string& source, const LexOptions& opts) {
  // Normalize \r\n and \r to \n and drop one trailing newline (keep_trailing_newline=False).
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src += source[i];
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lx{src, opts, {}};
  lx.run();
  return std::move(lx.toks);
}

}  // namespace g4::jinja
