// Jinja lexer: template source -> flat token stream, with jinja2's whitespace control.
// Mirrors jinja2.lexer.Lexer.tokeniter (3.1): newlines normalized to \n, one trailing newline
// dropped (keep_trailing_newline=False), `{%-`/`-%}` strip, `{%+`/`+%}` opt-outs, trim_blocks
// (drop the newline after a block or comment tag) and lstrip_blocks (drop the indentation before a
// block or comment tag), and brace balancing so `}}` inside a dict literal is not a tag end.
#pragma once
#include <string>
#include <vector>

namespace g4::jinja {

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok kind;
  std::string text;  // Text data, name, unescaped string literal, number or operator spelling
  int line;
};

struct LexOptions {
  bool trim_blocks = true;    // HF apply_chat_template settings
  bool lstrip_blocks = true;
};

// Throws JinjaError (with line) on unterminated tags/strings or unexpected characters.
std::vector<Token> lex(const std::string& source, const LexOptions& opts);

}  // namespace g4::jinja
