// Gemma 4 tool-call parsing; see tool_calls.h. Mirrors mlx-lm tool_parsers/gemma4.py semantics.
#include "text/tool_calls.h"

#include <cstring>

#include "text/stop_strings.h"

namespace g4 {
namespace {

using ojson = nlohmann::ordered_json;

constexpr int kMaxDepth = 256;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
// Python's [\w-] for ASCII, plus every non-ASCII byte (UTF-8 letters are \w in Python).
bool is_word(char c) {
  unsigned char u = static_cast<unsigned char>(c);
  return (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_' ||
         u == '-' || u >= 0x80;
}

class Parser {
 public:
  explicit Parser(std::string_view s) : s_(s) {}

  Result<ojson> value(int depth) {
    ws();
    if (depth > kMaxDepth) return fail("nesting deeper than 256");
    if (at_end()) return fail("expected a value");
    if (starts(kGemmaQuote)) return gstring();
    char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') return jstring();
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    for (auto [word, v] : {std::pair<const char*, ojson>{"true", true}, {"false", false},
                           {"null", nullptr}}) {
      size_t n = std::strlen(word);
      if (s_.substr(i_, n) == word && (i_ + n == s_.size() || !is_word(s_[i_ + n]))) {
        i_ += n;
        return v;
      }
    }
    return fail("expected a value");
  }

  Result<ojson> object(int depth) {
    ++i_;  // '{'
    ojson obj = ojson::object();
    ws();
    if (peek('}')) {
      ++i_;
      return obj;
    }
    while (true) {
      ws();
      G4_ASSIGN_OR_RETURN(std::string k, key());
      ws();
      if (!peek(':')) return fail("expected ':' after key");
      ++i_;
      G4_ASSIGN_OR_RETURN(ojson v, value(depth + 1));
      obj[k] = std::move(v);  // duplicate keys: last value wins, first position kept (Python)
      ws();
      if (peek(',')) {
        ++i_;
        continue;
      }
      if (peek('}')) {
        ++i_;
        return obj;
      }
      return fail("expected ',' or '}' in object");
    }
  }

  Result<ojson> array(int depth) {
    ++i_;  // '['
    ojson arr = ojson::array();
    ws();
    if (peek(']')) {
      ++i_;
      return arr;
    }
    while (true) {
      G4_ASSIGN_OR_RETURN(ojson v, value(depth + 1));
      arr.push_back(std::move(v));
      ws();
      if (peek(',')) {
        ++i_;
        continue;
      }
      if (peek(']')) {
        ++i_;
        return arr;
      }
      return fail("expected ',' or ']' in array");
    }
  }

  Result<std::string> key() {
    if (starts(kGemmaQuote) || peek('"')) {
      G4_ASSIGN_OR_RETURN(ojson k, starts(kGemmaQuote) ? gstring() : jstring());
      return k.get<std::string>();
    }
    size_t b = i_;
    while (!at_end() && is_word(s_[i_])) ++i_;
    if (i_ == b) return fail("expected a key");
    return std::string(s_.substr(b, i_ - b));
  }

  // <|"|>raw text<|"|>: everything up to the next delimiter, verbatim.
  Result<ojson> gstring() {
    i_ += kGemmaQuote.size();
    size_t e = s_.find(kGemmaQuote, i_);
    if (e == std::string_view::npos) return fail("unterminated <|\"|> string");
    ojson v = std::string(s_.substr(i_, e - i_));
    i_ = e + kGemmaQuote.size();
    return v;
  }

  // Ordinary JSON string (escapes decoded by nlohmann).
  Result<ojson> jstring() {
    size_t b = i_++;
    while (!at_end() && s_[i_] != '"') i_ += s_[i_] == '\\' ? 2 : 1;
    if (at_end()) return fail("unterminated string");
    ++i_;
    ojson v = ojson::parse(s_.substr(b, i_ - b), nullptr, false);
    if (v.is_discarded()) return fail("invalid JSON string");
    return v;
  }

  // JSON number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  Result<ojson> number() {
    size_t b = i_;
    auto digits = [&] {
      size_t d = i_;
      while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (peek('-')) ++i_;
    if (peek('0')) {
      ++i_;
    } else if (digits() == 0) {
      return fail("invalid number");
    }
    if (peek('.')) {
      ++i_;
      if (digits() == 0) return fail("invalid number");
    }
    if (peek('e') || peek('E')) {
      ++i_;
      if (peek('+') || peek('-')) ++i_;
      if (digits() == 0) return fail("invalid number");
    }
    if (!at_end() && (is_word(s_[i_]) || s_[i_] == '.')) return fail("invalid number");
    ojson v = ojson::parse(s_.substr(b, i_ - b), nullptr, false);
    if (v.is_discarded()) return fail("invalid number");
    return v;
  }

  void ws() {
    while (!at_end() && is_ws(s_[i_])) ++i_;
  }
  bool at_end() const { return i_ >= s_.size(); }
  bool peek(char c) const { return !at_end() && s_[i_] == c; }
  bool starts(std::string_view t) const {
    return i_ <= s_.size() && s_.substr(i_).substr(0, t.size()) == t;
  }
  Error fail(const char* what) const {
    return err("gemma4 tool call: %s at byte %zu", what, i_);
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

Result<nlohmann::ordered_json> parse_gemma4_value(std::string_view text) {
  Parser p(text);
  G4_ASSIGN_OR_RETURN(ojson v, p.value(0));
  p.ws();
  if (!p.at_end()) return p.fail("unexpected text after the value");
  return v;
}

Result<std::vector<ToolCall>> parse_gemma4_tool_block(std::string_view block) {
  Parser p(block);
  std::vector<ToolCall> calls;
  while (true) {
    p.ws();
    while (!calls.empty() && p.peek(',')) {
      ++p.i_;
      p.ws();
    }
    if (p.at_end()) break;
    if (!p.starts("call:")) return p.fail("expected 'call:NAME{...}'");
    p.i_ += 5;
    size_t b = p.i_;
    while (!p.at_end() && is_word(block[p.i_])) ++p.i_;
    if (p.i_ == b) return p.fail("expected a function name");
    ToolCall c;
    c.name = std::string(block.substr(b, p.i_ - b));
    if (!p.peek('{')) return p.fail("expected '{' after the function name");
    G4_ASSIGN_OR_RETURN(c.arguments, p.object(0));
    calls.push_back(std::move(c));
  }
  if (calls.empty()) return err("gemma4 tool call: no 'call:NAME{...}' in the block");
  return calls;
}

ToolCallSplit split_gemma4_tool_calls(std::string_view text) {
  ToolCallSplit out;
  ToolCallStream s;
  auto take = [&](std::vector<ToolCallEvent> ev) {
    for (auto& e : ev) {
      if (e.kind == ToolCallEvent::kText) {
        out.content += e.text;
      } else {
        out.calls.push_back(std::move(e.call));
      }
    }
  };
  take(s.feed(text));
  take(s.finish());
  return out;
}

// ---- streaming ----
void ToolCallStream::end_block(std::vector<ToolCallEvent>& out, std::string_view block,
                               bool closed) {
  auto calls = parse_gemma4_tool_block(block);
  if (calls.is_ok()) {
    for (auto& c : calls.value()) {
      out.push_back({ToolCallEvent::kToolCall, {}, std::move(c)});
      ++n_calls_;
    }
    return;
  }
  std::string raw = std::string(kToolCallOpen) + std::string(block);
  if (closed) raw += kToolCallClose;
  if (!out.empty() && out.back().kind == ToolCallEvent::kText) {
    out.back().text += raw;
  } else {
    out.push_back({ToolCallEvent::kText, std::move(raw), {}});
  }
}

std::vector<ToolCallEvent> ToolCallStream::feed(std::string_view piece) {
  std::vector<ToolCallEvent> out;
  auto text = [&](std::string_view t) {
    if (t.empty()) return;
    if (!out.empty() && out.back().kind == ToolCallEvent::kText) {
      out.back().text.append(t);
    } else {
      out.push_back({ToolCallEvent::kText, std::string(t), {}});
    }
  };
  // Inside a call the close marker can only complete in the new text: resume the search there.
  size_t search_from = in_call_ ? held_.size() - std::min(held_.size(), kToolCallClose.size() - 1)
                                : 0;
  std::string buf = std::move(held_);
  held_.clear();
  buf.append(piece);
  std::string_view rest(buf);
  while (true) {
    if (!in_call_) {
      size_t p = rest.find(kToolCallOpen);
      if (p == std::string_view::npos) {
        size_t hold = marker_prefix_at_end(rest, kToolCallOpen);
        text(rest.substr(0, rest.size() - hold));
        held_ = std::string(rest.substr(rest.size() - hold));
        break;
      }
      text(rest.substr(0, p));
      rest.remove_prefix(p + kToolCallOpen.size());
      in_call_ = true;
      search_from = 0;
      continue;
    }
    size_t e = rest.find(kToolCallClose, search_from);
    if (e == std::string_view::npos) {
      // Keep the block so far; avoid a copy when it is the whole buffer (long calls streamed
      // in small pieces stay linear).
      if (rest.data() == buf.data() && rest.size() == buf.size()) {
        held_ = std::move(buf);
      } else {
        held_ = std::string(rest);
      }
      break;
    }
    end_block(out, rest.substr(0, e), /*closed=*/true);
    rest.remove_prefix(e + kToolCallClose.size());
    in_call_ = false;
  }
  return out;
}

std::vector<ToolCallEvent> ToolCallStream::finish() {
  std::vector<ToolCallEvent> out;
  if (in_call_) {
    end_block(out, held_, /*closed=*/false);
  } else if (!held_.empty()) {
    out.push_back({ToolCallEvent::kText, held_, {}});
  }
  held_.clear();
  in_call_ = false;
  return out;
}

}  // namespace g4
