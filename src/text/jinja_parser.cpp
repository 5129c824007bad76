// Jinja parser: token stream -> Body. Precedence and grammar follow jinja2/parser.py (3.1):
// condexpr < or < and < not < compare (==, !=, <, >, <=, >=, in, not in) < + - < ~ < * / // %
// < ** < unary -/+ < primary, postfix (.attr, [item/slice], call) and filters/tests.
#include <cstdlib>
#include <set>

#include "text/jinja_ast.h"

namespace g4::jinja {
namespace {

struct Parser {
  const std::vector<Token>& t;
  size_t p = 0;
  int depth = 0;  // recursion guard: hostile templates must not overflow the stack

  struct Nest {
    Parser& ps;
    explicit Nest(Parser& x) : ps(x) {
      if (++ps.depth > 200) ps.fail("template nesting too deep");
    }
    ~Nest() { --ps.depth; }
  };

  const Token& cur() const { return t[p]; }
  const Token& peek(size_t k = 1) const { return t[std::min(p + k, t.size() - 1)]; }
  bool is_op(const char* s) const { return cur().kind == Tok::Op && cur().text == s; }
  bool is_name(const char* s) const { return cur().kind == Tok::Name && cur().text == s; }
  [[noreturn]] void fail(const std::string& m) const { throw JinjaError(m, cur().line); }
  std::string describe(const Token& k) const {
    switch (k.kind) {
      case Tok::Eof: return "end of template";
      case Tok::BlockEnd: return "end of statement block";
      case Tok::VarEnd: return "end of print statement";
      case Tok::Text: return "template data";
      default: return "'" + k.text + "'";
    }
  }
  void expect_op(const char* s) {
    if (!is_op(s)) fail(std::string("expected '") + s + "', got " + describe(cur()));
    ++p;
  }
  std::string expect_name() {
    if (cur().kind != Tok::Name) fail("expected a name, got " + describe(cur()));
    return t[p++].text;
  }
  void expect_block_end() {
    if (cur().kind != Tok::BlockEnd) fail("expected end of statement block, got " + describe(cur()));
    ++p;
  }

  ExprP mk(EK k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // ---- expressions ----
  ExprP expression(bool with_cond = true) { return with_cond ? condexpr() : or_expr(); }

  ExprP condexpr() {
    ExprP e = or_expr();
    while (is_name("if")) {
      int line = cur().line;
      ++p;
      auto c = mk(EK::Cond, line);
      c->a = or_expr();
      c->b = std::move(e);
      if (is_name("else")) {
        ++p;
        c->c = condexpr();
      }
      e = std::move(c);
    }
    return e;
  }
  ExprP or_expr() {
    ExprP e = and_expr();
    while (is_name("or")) {
      auto n = mk(EK::Or, cur().line);
      ++p;
      n->a = std::move(e);
      n->b = and_expr();
      e = std::move(n);
    }
    return e;
  }
  ExprP and_expr() {
    ExprP e = not_expr();
    while (is_name("and")) {
      auto n = mk(EK::And, cur().line);
      ++p;
      n->a = std::move(e);
      n->b = not_expr();
      e = std::move(n);
    }
    return e;
  }
  ExprP not_expr() {
    Nest guard(*this);
    if (is_name("not")) {
      auto n = mk(EK::Unary, cur().line);
      ++p;
      n->str = "not";
      n->a = not_expr();
      return n;
    }
    return compare();
  }
  ExprP compare() {
    ExprP e = math1();
    ExprP result;  // chained comparisons a < b < c become (a < b) and (b < c)
    for (;;) {
      std::string op;
      int line = cur().line;
      if (cur().kind == Tok::Op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++p;
      } else if (is_name("in")) {
        op = "in";
        ++p;
      } else if (is_name("not") && peek().kind == Tok::Name && peek().text == "in") {
        op = "notin";
        p += 2;
      } else {
        break;
      }
      auto b = mk(EK::Binary, line);
      b->str = op;
      ExprP rhs = math1();
      if (result) {
        // Re-evaluates the middle operand; chat templates have no side effects in expressions.
        b->a = clone_name_or_fail(e.get());
      } else {
        b->a = std::move(e);
      }
      e = std::move(rhs);
      b->b = clone_name_or_fail(e.get());
      if (result) {
        auto n = mk(EK::And, line);
        n->a = std::move(result);
        n->b = std::move(b);
        result = std::move(n);
      } else {
        result = std::move(b);
      }
    }
    return result ? std::move(result) : std::move(e);
  }
  // Comparison chains need their middle operand twice; we copy simple operands only.
  ExprP clone_name_or_fail(const Expr* e) {
    auto c = mk(e->kind, e->line);
    if (e->kind == EK::Literal || e->kind == EK::Name) {
      c->str = e->str;
      c->lit = e->lit;
      return c;
    }
    return clone_deep(e);
  }
  ExprP clone_deep(const Expr* e) {
    if (!e) return nullptr;
    auto c = mk(e->kind, e->line);
    c->str = e->str;
    c->lit = e->lit;
    c->negate = e->negate;
    c->a = clone_deep(e->a.get());
    c->b = clone_deep(e->b.get());
    c->c = clone_deep(e->c.get());
    c->d = clone_deep(e->d.get());
    for (auto& x : e->args) c->args.push_back(clone_deep(x.get()));
    for (auto& x : e->args2) c->args2.push_back(clone_deep(x.get()));
    for (auto& kv : e->kwargs) c->kwargs.emplace_back(kv.first, clone_deep(kv.second.get()));
    return c;
  }
  ExprP binary_level(ExprP (Parser::*next)(), std::initializer_list<const char*> ops) {
    ExprP e = (this->*next)();
    for (;;) {
      const char* found = nullptr;
      for (const char* o : ops)
        if (is_op(o)) found = o;
      if (!found) return e;
      auto n = mk(EK::Binary, cur().line);
      ++p;
      n->str = found;
      n->a = std::move(e);
      n->b = (this->*next)();
      e = std::move(n);
    }
  }
  ExprP math1() { return binary_level(&Parser::concat, {"+", "-"}); }
  ExprP concat() { return binary_level(&Parser::math2, {"~"}); }
  ExprP math2() { return binary_level(&Parser::pow_expr, {"*", "/", "//", "%"}); }
  ExprP pow_expr() { return binary_level(&Parser::unary_f, {"**"}); }
  ExprP unary_f() { return unary(true); }
  ExprP unary(bool with_filter) {
    Nest guard(*this);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      e = mk(EK::Unary, cur().line);
      e->str = cur().text;
      ++p;
      e->a = unary(false);
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filter_expr(std::move(e));
    return e;
  }

  ExprP primary() {
    const Token& k = cur();
    int line = k.line;
    if (k.kind == Tok::Name) {
      ++p;
      auto e = mk(EK::Literal, line);
      if (k.text == "true" || k.text == "True") { e->lit = Value::boolean(true); return e; }
      if (k.text == "false" || k.text == "False") { e->lit = Value::boolean(false); return e; }
      if (k.text == "none" || k.text == "None") { e->lit = Value::none(); return e; }
      e->kind = EK::Name;
      e->str = k.text;
      return e;
    }
    if (k.kind == Tok::String) {
      std::string s;
      while (cur().kind == Tok::String) s += t[p++].text;  // adjacent literals concatenate
      auto e = mk(EK::Literal, line);
      e->lit = Value::string(s);
      return e;
    }
    if (k.kind == Tok::Int || k.kind == Tok::Float) {
      ++p;
      auto e = mk(EK::Literal, line);
      if (k.kind == Tok::Int) {
        e->lit = Value::integer(std::strtoll(k.text.c_str(), nullptr, 10));
      } else {
        e->lit = Value::number(std::strtod(k.text.c_str(), nullptr));
      }
      return e;
    }
    if (is_op("(")) {
      ++p;
      if (is_op(")")) {
        ++p;
        auto l = mk(EK::ListLit, line);  // empty tuple
        l->str = "tuple";
        return l;
      }
      ExprP e = expression();
      if (is_op(",")) {  // tuple: a list flagged to print as a tuple
        auto l = mk(EK::ListLit, line);
        l->str = "tuple";
        l->args.push_back(std::move(e));
        while (is_op(",")) {
          ++p;
          if (is_op(")")) break;
          l->args.push_back(expression());
        }
        e = std::move(l);
      }
      expect_op(")");
      return e;
    }
    if (is_op("[")) {
      ++p;
      auto l = mk(EK::ListLit, line);
      while (!is_op("]")) {
        if (!l->args.empty()) expect_op(",");
        if (is_op("]")) break;
        l->args.push_back(expression());
      }
      ++p;
      return l;
    }
    if (is_op("{")) {
      ++p;
      auto d = mk(EK::DictLit, line);
      while (!is_op("}")) {
        if (!d->args.empty()) expect_op(",");
        if (is_op("}")) break;
        d->args.push_back(expression());
        expect_op(":");
        d->args2.push_back(expression());
      }
      ++p;
      return d;
    }
    fail("unexpected " + describe(k));
  }

  void call_args(Expr* e) {
    expect_op("(");
    while (!is_op(")")) {
      if (!e->args.empty() || !e->kwargs.empty()) expect_op(",");
      if (is_op(")")) break;
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == "=") {
        std::string name = t[p].text;
        p += 2;
        e->kwargs.emplace_back(name, expression());
      } else {
        if (is_op("*")) fail("*args in calls are not supported");
        if (!e->kwargs.empty()) fail("positional argument follows keyword argument");
        e->args.push_back(expression());
      }
    }
    ++p;
  }

  ExprP postfix(ExprP e) {
    for (;;) {
      int line = cur().line;
      if (is_op(".")) {
        ++p;
        if (cur().kind == Tok::Int) {
          auto n = mk(EK::GetItem, line);
          n->a = std::move(e);
          n->b = mk(EK::Literal, line);
          n->b->lit = Value::integer(std::atoll(t[p++].text.c_str()));
          e = std::move(n);
        } else {
          auto n = mk(EK::GetAttr, line);
          n->a = std::move(e);
          n->str = expect_name();
          e = std::move(n);
        }
      } else if (is_op("[")) {
        ++p;
        ExprP parts[3];
        bool is_slice = false;
        int idx = 0;
        for (;;) {
          if (is_op("]")) break;
          if (is_op(":")) {
            is_slice = true;
            if (++idx > 2) fail("invalid slice");
            ++p;
            continue;
          }
          parts[idx] = expression();
        }
        ++p;
        if (is_slice) {
          auto n = mk(EK::Slice, line);
          n->a = std::move(e);
          n->b = std::move(parts[0]);
          n->c = std::move(parts[1]);
          n->d = std::move(parts[2]);
          e = std::move(n);
        } else {
          if (!parts[0]) fail("expected a subscript");
          auto n = mk(EK::GetItem, line);
          n->a = std::move(e);
          n->b = std::move(parts[0]);
          e = std::move(n);
        }
      } else if (is_op("(")) {
        auto n = mk(EK::Call, line);
        n->a = std::move(e);
        call_args(n.get());
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  std::string dotted_name() {
    std::string n = expect_name();
    while (is_op(".")) {
      ++p;
      n += "." + expect_name();
    }
    return n;
  }

  ExprP filter_expr(ExprP e) {
    for (;;) {
      int line = cur().line;
      if (is_op("|")) {
        ++p;
        auto n = mk(EK::Filter, line);
        n->a = std::move(e);
        n->str = dotted_name();
        if (is_op("(")) call_args(n.get());
        e = std::move(n);
      } else if (is_name("is")) {
        ++p;
        auto n = mk(EK::Test, line);
        if (is_name("not")) {
          ++p;
          n->negate = true;
        }
        n->a = std::move(e);
        n->str = dotted_name();
        const Token& k = cur();
        if (is_op("(")) {
          call_args(n.get());
        } else if ((k.kind == Tok::Name && k.text != "else" && k.text != "or" && k.text != "and") ||
                   k.kind == Tok::String || k.kind == Tok::Int || k.kind == Tok::Float ||
                   is_op("[") || is_op("{")) {
          n->args.push_back(postfix(primary()));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = mk(EK::Call, line);
        n->a = std::move(e);
        call_args(n.get());
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  // Top-level expression of {{ }} / set: a bare comma makes a tuple (a list here).
  ExprP tuple_expr(bool with_cond = true) {
    int line = cur().line;
    ExprP e = expression(with_cond);
    if (!is_op(",")) return e;
    auto l = mk(EK::ListLit, line);
    l->str = "tuple";
    l->args.push_back(std::move(e));
    while (is_op(",")) {
      ++p;
      if (cur().kind == Tok::BlockEnd || cur().kind == Tok::VarEnd) break;
      l->args.push_back(expression(with_cond));
    }
    return l;
  }

  std::vector<std::string> assign_targets() {
    std::vector<std::string> names;
    bool paren = is_op("(");
    if (paren) ++p;
    names.push_back(expect_name());
    while (is_op(",")) {
      ++p;
      if (cur().kind != Tok::Name) break;
      names.push_back(expect_name());
    }
    if (paren) expect_op(")");
    return names;
  }

  // ---- statements ----
  // Parses until a block whose tag is in `ends`; leaves p at that tag's name and returns it.
  Body statements(const std::set<std::string>& ends, std::string* found, int open_line,
                  const std::string& open_tag) {
    Body body;
    for (;;) {
      const Token& k = cur();
      if (k.kind == Tok::Eof) {
        if (ends.empty()) return body;
        throw JinjaError("unexpected end of template: '" + open_tag + "' opened on line " +
                             std::to_string(open_line) + " was never closed",
                         k.line);
      }
      if (k.kind == Tok::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Text;
        s->line = k.line;
        s->text = k.text;
        body.push_back(std::move(s));
        ++p;
      } else if (k.kind == Tok::VarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = SK::Print;
        s->line = k.line;
        ++p;
        s->expr = tuple_expr();
        if (cur().kind != Tok::VarEnd) fail("expected end of print statement, got " + describe(cur()));
        ++p;
        body.push_back(std::move(s));
      } else if (k.kind == Tok::BlockBegin) {
        ++p;
        if (cur().kind != Tok::Name) fail("tag name expected");
        const std::string& tag = cur().text;
        if (ends.count(tag)) {
          *found = tag;
          return body;
        }
        body.push_back(statement());
      } else {
        fail("unexpected " + describe(k));
      }
    }
  }

  StmtP statement() {
    Nest guard(*this);
    const Token& k = cur();
    int line = k.line;
    std::string tag = k.text;
    ++p;
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string found;
    if (tag == "if") {
      s->kind = SK::If;
      s->conds.push_back(tuple_expr(false));
      expect_block_end();
      for (;;) {
        s->bodies.push_back(statements({"elif", "else", "endif"}, &found, line, "if"));
        ++p;
        if (found == "elif") {
          s->conds.push_back(tuple_expr(false));
          expect_block_end();
        } else if (found == "else") {
          expect_block_end();
          s->conds.push_back(nullptr);
          s->bodies.push_back(statements({"endif"}, &found, line, "if"));
          ++p;
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = SK::For;
      s->targets = assign_targets();
      if (!is_name("in")) fail("expected 'in' in for loop, got " + describe(cur()));
      ++p;
      s->expr = tuple_expr(false);
      if (is_name("if")) {
        ++p;
        s->filter = expression();
      }
      if (is_name("recursive")) fail("recursive for loops are not supported");
      expect_block_end();
      s->bodies.push_back(statements({"endfor", "else"}, &found, line, "for"));
      ++p;
      expect_block_end();
      if (found == "else") {
        s->bodies.push_back(statements({"endfor"}, &found, line, "for"));
        ++p;
        expect_block_end();
      }
    } else if (tag == "set") {
      if (cur().kind == Tok::Name && peek().kind == Tok::Op && peek().text == ".") {
        s->kind = SK::SetAttr;
        s->targets.push_back(expect_name());
        ++p;
        s->text = expect_name();
        expect_op("=");
        s->expr = tuple_expr();
        expect_block_end();
      } else {
        s->targets = assign_targets();
        if (is_op("=")) {
          ++p;
          s->kind = SK::Set;
          s->expr = tuple_expr();
          expect_block_end();
        } else {
          s->kind = SK::SetBlock;
          if (s->targets.size() != 1) fail("block set takes one name");
          if (is_op("|")) {
            // `{% set x | filter %}`: filters applied to the captured body (innermost operand null).
            ++p;
            s->filter = filter_expr_from_block(line);
          }
          expect_block_end();
          s->bodies.push_back(statements({"endset"}, &found, line, "set"));
          ++p;
          expect_block_end();
        }
      }
    } else if (tag == "macro") {
      s->kind = SK::Macro;
      s->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        if (!s->params.empty()) expect_op(",");
        s->params.push_back(expect_name());
        if (is_op("=")) {
          ++p;
          s->defaults.push_back(expression());
        } else {
          s->defaults.push_back(nullptr);
        }
      }
      ++p;
      expect_block_end();
      s->bodies.push_back(statements({"endmacro"}, &found, line, "macro"));
      ++p;
      if (cur().kind == Tok::Name) ++p;  // {% endmacro name %}
      expect_block_end();
    } else if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? SK::Break : SK::Continue;
      expect_block_end();
    } else if (tag == "generation") {
      // transformers' AssistantTracker extension: renders its body unchanged.
      s->kind = SK::Scope;
      expect_block_end();
      s->bodies.push_back(statements({"endgeneration"}, &found, line, "generation"));
      ++p;
      expect_block_end();
    } else if (tag == "with") {
      // {% with a = x, b = y %}...{% endwith %}: a Scope whose assignments run in a fresh scope.
      s->kind = SK::With;
      while (cur().kind != Tok::BlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_name());
        expect_op("=");
        s->conds.push_back(expression());
      }
      expect_block_end();
      s->bodies.push_back(statements({"endwith"}, &found, line, "with"));
      ++p;
      expect_block_end();
    } else if (tag == "filter") {
      s->kind = SK::FilterBlock;
      s->expr = filter_expr_from_block(line);
      expect_block_end();
      s->bodies.push_back(statements({"endfilter"}, &found, line, "filter"));
      ++p;
      expect_block_end();
    } else if (tag.rfind("end", 0) == 0 || tag == "elif" || tag == "else") {
      throw JinjaError("unexpected '" + tag + "' tag", line);
    } else {
      throw JinjaError("unsupported tag '" + tag + "'", line);
    }
    return s;
  }

  // `{% filter name(args) | other %}`: a Filter chain whose innermost operand is null.
  ExprP filter_expr_from_block(int line) {
    ExprP e;
    for (bool first = true; first || is_op("|"); first = false) {
      if (!first) ++p;
      auto n = mk(EK::Filter, line);
      n->a = std::move(e);
      n->str = dotted_name();
      if (is_op("(")) call_args(n.get());
      e = std::move(n);
    }
    return e;
  }
};

}  // namespace

Body parse(const std::vector<Token>& toks) {
  Parser ps{toks};
  std::string found;
  Body b = ps.statements({}, &found, 0, "");
  return b;
}

}  // namespace g4::jinja
