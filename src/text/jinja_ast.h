// Jinja syntax tree (the subset of jinja2.nodes that chat templates use) and the parser entry.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace g4::jinja {

enum class EK {
  Literal,   // lit
  Name,      // str
  ListLit,   // args
  DictLit,   // args (keys), args2 (values)
  GetAttr,   // a.str
  GetItem,   // a[b]
  Slice,     // a[b:c:d] (any of b, c, d may be null)
  Call,      // a(args, kwargs)
  Filter,    // a | str(args, kwargs)
  Test,      // a is [not] str(args)
  Unary,     // str in {"not", "-", "+"} applied to a
  Binary,    // a str b: + - * / // % ** ~ == != < > <= >= in notin
  And, Or,   // short-circuit, Python value semantics
  Cond,      // b if a else c (c may be null -> undefined)
};

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  EK kind;
  int line = 0;
  std::string str;
  Value lit;
  bool negate = false;  // Test: `is not`
  ExprP a, b, c, d;
  std::vector<ExprP> args, args2;
  std::vector<std::pair<std::string, ExprP>> kwargs;
};

enum class SK { Text, Print, If, For, Set, SetAttr, SetBlock, Macro, Break, Continue, Scope, FilterBlock, With };

struct Stmt;
using StmtP = std::unique_ptr<Stmt>;
using Body = std::vector<StmtP>;
struct Stmt {
  SK kind;
  int line = 0;
  std::string text;                     // Text data; SetAttr attribute; Macro name
  ExprP expr;                           // Print value, For iterable, Set value, FilterBlock filter
  ExprP filter;                         // For `if` filter
  std::vector<std::string> targets;     // For loop vars; Set names; SetBlock name; SetAttr object; With names
  std::vector<ExprP> conds;             // If: one per branch (null for else); With: values
  std::vector<Body> bodies;             // If: one per branch; For: [body, else]; others: [body]
  std::vector<std::string> params;      // Macro parameter names
  std::vector<ExprP> defaults;          // Macro defaults (null when none), aligned with params
};

// Parses a token stream into the template body. Throws JinjaError naming the line of an
// unsupported or malformed construct.
Body parse(const std::vector<Token>& toks);

}  // namespace g4::jinja
