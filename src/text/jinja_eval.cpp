// Jinja interpreter: walks the syntax tree of jinja_ast.h. Scoping follows jinja2's compiled code:
// each for-loop iteration and each macro call gets a fresh scope whose reads fall back to the
// enclosing one; `set` writes to the innermost scope; `if` opens no scope; macros resolve free
// names in the scope they were defined in, at call time (so top-level macros may call macros
// defined later, as jinja2 allows).
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "text/jinja_ast.h"
#include "text/jinja_builtins.h"
#include "text/jinja_template.h"

namespace g4::jinja {
namespace {

struct Scope {
  std::shared_ptr<Scope> parent;
  std::unordered_map<std::string, Value> vars;
  explicit Scope(std::shared_ptr<Scope> p) : parent(std::move(p)) {}
  const Value* lookup(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent.get()) {
      auto it = s->vars.find(n);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
  void set(const std::string& n, Value v) { vars[n] = std::move(v); }
};
using ScopeP = std::shared_ptr<Scope>;

enum class Flow { Normal, Break, Continue };

constexpr int kMaxCallDepth = 256;

// A render's budget (Template::render's max_steps, value sizes of jinja_value.h): a template (a GGUF
// file's, say) that loops or grows values without bound ends with an error instead of holding a
// thread or the memory.
struct Interp {
  int depth = 0;
  uint64_t steps = 0, max_steps = Template::kMaxSteps;
  // Scopes that macros close over stay alive for the whole render (a macro stored in a namespace
  // may outlive its loop iteration); held here rather than by the macro to avoid ownership cycles.
  std::vector<ScopeP> macro_scopes;
  // Namespaces that got an attribute: `{% set ns.a = ns %}` (or a list holding ns) makes a
  // reference cycle that shared ownership never frees, so their attributes are dropped when the
  // render ends (no value outlives a render; the context holds no namespaces).
  std::vector<std::shared_ptr<Dict>> assigned;
  std::unordered_set<const Dict*> assigned_set;
  const Value* block_input = nullptr;

  ~Interp() {
    for (auto& d : assigned) d->items.clear();
  }  // operand of a filter chain whose innermost operand is null

  void step() {
    if (++steps > max_steps)
      throw JinjaError("the template exceeded its budget of " + std::to_string(max_steps) + " steps (a runaway loop?)");
  }

  static void check_size(const Value& v) {
    if (v.is_string() && v.s.size() > kMaxStringBytes)
      throw JinjaError("a string grew beyond " + std::to_string(kMaxStringBytes >> 20) + " MiB");
    if (v.is_list() && v.list->size() > kMaxListItems)
      throw JinjaError("a list grew beyond " + std::to_string(kMaxListItems) + " items");
  }

  static void check_output(const std::string& out) {
    if (out.size() > kMaxStringBytes)
      throw JinjaError("the output grew beyond " + std::to_string(kMaxStringBytes >> 20) + " MiB");
  }

  Value eval(const Expr& e, const ScopeP& sc) {
    try {
      step();
      Value v = eval_inner(e, sc);
      check_size(v);
      return v;
    } catch (JinjaError& x) {
      if (!x.line) x.line = e.line;
      throw;
    }
  }

  CallArgs eval_args(const Expr& e, const ScopeP& sc) {
    CallArgs a;
    a.line = e.line;
    for (auto& x : e.args) a.pos.push_back(eval(*x, sc));
    for (auto& kv : e.kwargs) a.kw.emplace_back(kv.first, eval(*kv.second, sc));
    return a;
  }

  Value eval_inner(const Expr& e, const ScopeP& sc) {
    switch (e.kind) {
      case EK::Literal: return e.lit;
      case EK::Name: {
        if (const Value* v = sc->lookup(e.str)) return *v;
        return Value::undefined("'" + e.str + "' is undefined");
      }
      case EK::ListLit: {
        List l;
        for (auto& x : e.args) l.push_back(eval(*x, sc));
        return e.str == "tuple" ? Value::make_tuple(std::move(l)) : Value::make_list(std::move(l));
      }
      case EK::DictLit: {
        Value d = Value::make_dict();
        for (size_t k = 0; k < e.args.size(); ++k) {
          Value key = eval(*e.args[k], sc);
          if (!key.is_string()) throw JinjaError("dict literal keys must be strings, got " + type_name(key), e.line);
          d.dict->set(key.s, eval(*e.args2[k], sc));
        }
        return d;
      }
      case EK::GetAttr: return get_attr(eval(*e.a, sc), e.str);
      case EK::GetItem: {
        Value obj = eval(*e.a, sc);
        return get_item(obj, eval(*e.b, sc));
      }
      case EK::Slice: {
        Value obj = eval(*e.a, sc);
        Value b = e.b ? eval(*e.b, sc) : Value::none();
        Value c = e.c ? eval(*e.c, sc) : Value::none();
        Value d = e.d ? eval(*e.d, sc) : Value::none();
        return slice(obj, b, c, d);
      }
      case EK::Call: {
        Value f = eval(*e.a, sc);
        CallArgs a = eval_args(e, sc);
        if (f.is_undefined()) undefined_error(f);
        if (f.type != Type::Func) throw JinjaError("'" + type_name(f) + "' object is not callable", e.line);
        return (*f.fn)(a);
      }
      case EK::Filter: {
        Value v = e.a ? eval(*e.a, sc) : (block_input ? *block_input : Value());
        CallArgs a = eval_args(e, sc);
        return apply_filter(e.str, v, a);
      }
      case EK::Test: {
        Value v = eval(*e.a, sc);
        CallArgs a = eval_args(e, sc);
        return Value::boolean(apply_test(e.str, v, a) != e.negate);
      }
      case EK::Unary: {
        Value v = eval(*e.a, sc);
        if (e.str == "not") return Value::boolean(!truthy(v));
        if (v.is_undefined()) undefined_error(v);
        if (e.str == "-") {
          if (v.type == Type::Float) return Value::number(-v.f);
          if (v.is_integral()) return Value::integer(-v.as_int());
        } else if (v.is_number()) {
          return v.type == Type::Bool ? Value::integer(v.as_int()) : v;
        }
        throw JinjaError("bad operand type for unary " + e.str + ": '" + type_name(v) + "'", e.line);
      }
      case EK::Binary: {
        Value a = eval(*e.a, sc);
        Value b = eval(*e.b, sc);
        const std::string& op = e.str;
        if (op == "==") return Value::boolean(equals(a, b));
        if (op == "!=") return Value::boolean(!equals(a, b));
        if (op == "<") return Value::boolean(compare(a, b) < 0);
        if (op == ">") return Value::boolean(compare(a, b) > 0);
        if (op == "<=") return Value::boolean(compare(a, b) <= 0);
        if (op == ">=") return Value::boolean(compare(a, b) >= 0);
        if (op == "in") return Value::boolean(contains(b, a));
        if (op == "notin") return Value::boolean(!contains(b, a));
        if (op == "~") return Value::string(to_str(a) + to_str(b));
        return arith(op, a, b);
      }
      case EK::And: {
        Value a = eval(*e.a, sc);
        return truthy(a) ? eval(*e.b, sc) : a;
      }
      case EK::Or: {
        Value a = eval(*e.a, sc);
        return truthy(a) ? a : eval(*e.b, sc);
      }
      case EK::Cond:
        if (truthy(eval(*e.a, sc))) return eval(*e.b, sc);
        return e.c ? eval(*e.c, sc) : Value::undefined("the inline if-expression evaluated to false and no else section was defined.");
    }
    throw JinjaError("internal: unknown expression", e.line);
  }

  void bind(const std::vector<std::string>& targets, const Value& v, Scope& sc, int line) {
    if (targets.size() == 1) {
      sc.set(targets[0], v);
      return;
    }
    std::vector<Value> items = iterate(v);
    if (items.size() != targets.size())
      throw JinjaError(items.size() < targets.size()
                           ? "not enough values to unpack (expected " + std::to_string(targets.size()) + ", got " + std::to_string(items.size()) + ")"
                           : "too many values to unpack (expected " + std::to_string(targets.size()) + ")",
                       line);
    for (size_t k = 0; k < targets.size(); ++k) sc.set(targets[k], items[k]);
  }

  Flow exec(const Body& body, const ScopeP& sc, std::string& out) {
    for (auto& s : body) {
      Flow f;
      try {
        f = exec_one(*s, sc, out);
      } catch (JinjaError& x) {
        if (!x.line) x.line = s->line;
        throw;
      }
      if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
  }

  Flow exec_one(const Stmt& s, const ScopeP& sc, std::string& out) {
    step();
    switch (s.kind) {
      case SK::Text: out += s.text; check_output(out); return Flow::Normal;
      case SK::Print: out += to_str(eval(*s.expr, sc)); check_output(out); return Flow::Normal;
      case SK::If:
        for (size_t k = 0; k < s.bodies.size(); ++k)
          if (!s.conds[k] || truthy(eval(*s.conds[k], sc))) return exec(s.bodies[k], sc, out);
        return Flow::Normal;
      case SK::For: return exec_for(s, sc, out);
      case SK::Set: bind(s.targets, eval(*s.expr, sc), *sc, s.line); return Flow::Normal;
      case SK::SetAttr: {
        const Value* ns = sc->lookup(s.targets[0]);
        if (!ns || ns->type != Type::Namespace)
          throw JinjaError("can only assign attributes on namespace objects ('" + s.targets[0] + "')", s.line);
        if (!s.text.empty() && s.text[0] == '_')
          throw JinjaError("Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + s.text + "'", s.line);
        if (assigned_set.insert(ns->dict.get()).second) assigned.push_back(ns->dict);
        ns->dict->set(s.text, eval(*s.expr, sc));
        return Flow::Normal;
      }
      case SK::SetBlock: {
        // The body renders in its own frame: assignments inside it do not leak (jinja2).
        std::string captured;
        check_flow(exec(s.bodies[0], std::make_shared<Scope>(sc), captured), s.line);
        Value v = Value::string(captured);
        if (s.filter) v = with_block_input(v, *s.filter, sc);
        sc->set(s.targets[0], v);
        return Flow::Normal;
      }
      case SK::FilterBlock: {
        std::string captured;
        check_flow(exec(s.bodies[0], std::make_shared<Scope>(sc), captured), s.line);
        out += to_str(with_block_input(Value::string(captured), *s.expr, sc));
        check_output(out);
        return Flow::Normal;
      }
      case SK::Macro: sc->set(s.text, make_macro(s, sc)); return Flow::Normal;
      case SK::Break: return Flow::Break;
      case SK::Continue: return Flow::Continue;
      case SK::Scope:
        // {% generation %} compiles to a call block: its own frame, no break/continue through it.
        check_flow(exec(s.bodies[0], std::make_shared<Scope>(sc), out), s.line);
        return Flow::Normal;
      case SK::With: {
        // jinja2 evaluates all values in the outer scope, then binds them in the inner one.
        std::vector<Value> vals;
        for (auto& e : s.conds) vals.push_back(eval(*e, sc));
        auto ws = std::make_shared<Scope>(sc);
        for (size_t k = 0; k < vals.size(); ++k) ws->set(s.targets[k], vals[k]);
        return exec(s.bodies[0], ws, out);
      }
    }
    return Flow::Normal;
  }

  static void check_flow(Flow f, int line) {
    if (f != Flow::Normal) throw JinjaError("'break' or 'continue' outside of a loop", line);
  }

  Value with_block_input(const Value& input, const Expr& chain, const ScopeP& sc) {
    const Value* saved = block_input;
    block_input = &input;
    Value r = eval(chain, sc);
    block_input = saved;
    return r;
  }

  Flow exec_for(const Stmt& s, const ScopeP& sc, std::string& out) {
    Value seq = eval(*s.expr, sc);
    if (seq.is_none() || seq.is_number() || seq.type == Type::Func || seq.type == Type::Namespace)
      throw JinjaError("'" + type_name(seq) + "' object is not iterable", s.line);
    std::vector<Value> items = iterate(seq);
    if (s.filter) {
      std::vector<Value> kept;
      for (auto& it : items) {
        auto fs = std::make_shared<Scope>(sc);
        bind(s.targets, it, *fs, s.line);
        if (truthy(eval(*s.filter, fs))) kept.push_back(it);
      }
      items.swap(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() > 1) return exec(s.bodies[1], sc, out);
      return Flow::Normal;
    }
    const int64_t n = int64_t(items.size());
    // One LoopContext per loop, updated in place each iteration (as jinja2's LoopContext is).
    auto last_changed = std::make_shared<std::optional<Value>>();  // LoopContext._last_changed_value
    auto index = std::make_shared<int64_t>(0);
    Value loop = Value::make_namespace();
    Dict& d = *loop.dict;
    d.set("length", Value::integer(n));
    d.set("depth", Value::integer(1));
    d.set("depth0", Value::integer(0));
    d.set("cycle", Value::function([index](CallArgs& a) {
      if (a.pos.empty()) throw JinjaError("no items for cycling given");
      return a.pos[size_t(*index) % a.pos.size()];
    }));
    d.set("changed", Value::function([last_changed](CallArgs& a) {
      Value v = Value::make_list(a.pos);
      if (*last_changed && equals(**last_changed, v)) return Value::boolean(false);
      *last_changed = v;
      return Value::boolean(true);
    }));
    auto erase = [&d](const char* k) {
      for (auto it = d.items.begin(); it != d.items.end(); ++it)
        if (it->first == k) {
          d.items.erase(it);
          return;
        }
    };
    for (int64_t i = 0; i < n; ++i) {
      step();  // an iteration is a step even when its body is empty
      auto ls = std::make_shared<Scope>(sc);
      bind(s.targets, items[i], *ls, s.line);
      *index = i;
      d.set("index", Value::integer(i + 1));
      d.set("index0", Value::integer(i));
      d.set("revindex", Value::integer(n - i));
      d.set("revindex0", Value::integer(n - i - 1));
      d.set("first", Value::boolean(i == 0));
      d.set("last", Value::boolean(i == n - 1));
      if (i > 0) d.set("previtem", items[i - 1]);
      else erase("previtem");
      if (i + 1 < n) d.set("nextitem", items[i + 1]);
      else erase("nextitem");
      ls->set("loop", loop);
      Flow f = exec(s.bodies[0], ls, out);
      if (f == Flow::Break) break;
    }
    return Flow::Normal;
  }

  Value make_macro(const Stmt& m, const ScopeP& closure) {
    const Stmt* mp = &m;
    macro_scopes.push_back(closure);
    Scope* scope = closure.get();
    Interp* self = this;
    return Value::function([mp, scope, self](CallArgs& a) -> Value {
      // Non-owning: `self->macro_scopes` keeps `scope` alive until the render ends.
      ScopeP parent(std::shared_ptr<Scope>{}, scope);
      if (self->depth >= kMaxCallDepth) throw JinjaError("maximum macro recursion depth exceeded", a.line);
      if (a.pos.size() > mp->params.size())
        throw JinjaError("macro '" + mp->text + "' takes not more than " + std::to_string(mp->params.size()) +
                             " argument(s)", a.line);
      for (auto& kv : a.kw) {
        bool known = false;
        for (auto& p : mp->params) known |= p == kv.first;
        if (!known) throw JinjaError("macro '" + mp->text + "' takes no keyword argument '" + kv.first + "'", a.line);
      }
      auto ms = std::make_shared<Scope>(parent);
      for (size_t k = 0; k < mp->params.size(); ++k) {
        const std::string& p = mp->params[k];
        if (k < a.pos.size()) {
          ms->set(p, a.pos[k]);
          continue;
        }
        bool found = false;
        for (auto& kv : a.kw)
          if (kv.first == p) {
            ms->set(p, kv.second);
            found = true;
          }
        if (found) continue;
        if (mp->defaults[k]) {
          ms->set(p, self->eval(*mp->defaults[k], ms));
        } else {
          ms->set(p, Value::undefined("parameter '" + p + "' was not provided"));
        }
      }
      std::string out;
      ++self->depth;
      try {
        check_flow(self->exec(mp->bodies[0], ms, out), mp->line);
      } catch (...) {
        --self->depth;
        throw;
      }
      --self->depth;
      return Value::string(out);
    });
  }
};

}  // namespace

Result<Template> Template::parse(const std::string& source, const LexOptions& options) {
  try {
    auto toks = lex(source, options);
    Template t;
    t.body_ = std::make_shared<const Body>(jinja::parse(toks));
    return t;
  } catch (const JinjaError& e) {
    return err("line %d: %s", e.line, e.what());
  } catch (const std::exception& e) {
    return err("template parse failed: %s", e.what());
  }
}

Result<std::string> Template::render(const Value& context, uint64_t max_steps) const {
  Interp in;
  in.max_steps = max_steps;
  try {
    auto globals = std::make_shared<Scope>(nullptr);
    Dict g;
    add_globals(g);
    for (auto& kv : g.items) globals->set(kv.first, kv.second);
    auto root = std::make_shared<Scope>(globals);
    if (context.is_dict()) {
      for (auto& kv : context.dict->items) root->set(kv.first, kv.second);
    } else if (!context.is_undefined()) {
      return err("render context must be a dict, got %s", type_name(context).c_str());
    }
    std::string out;
    Flow f = in.exec(*body_, root, out);
    if (f != Flow::Normal) return err("'break' or 'continue' outside of a loop");
    return out;
  } catch (const JinjaError& e) {
    return err("line %d: %s", e.line, e.what());
  } catch (const std::exception& e) {
    return err("template render failed: %s", e.what());
  }
}

}  // namespace g4::jinja
