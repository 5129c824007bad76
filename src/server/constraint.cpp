// Constrained decoding at the HTTP edge: the request fields that ask for a grammar
// (read_constraint, api_types.h) and their compilation against the served model's vocabulary
// (compile_constraint, context.h).
#include <mutex>

#include "grammar/tool_call_grammar.h"
#include "server/context.h"

namespace g4::server {
namespace {

ApiError bad_constraint(const std::string& param, const std::string& msg) {
  return ApiError{400, "invalid_request_error", msg, param};
}

}  // namespace

std::optional<ApiError> read_constraint(const ojson& body, TextRequest& r) {
  using C = TextRequest::Constraint;
  C c;
  int given = 0;
  if (auto rf = body.find("response_format"); rf != body.end() && !rf->is_null()) {
    if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
      return bad_constraint("response_format", "'response_format' must be an object with a string 'type'");
    const std::string type = (*rf)["type"].get<std::string>();
    c.param = "response_format";
    if (type == "json_object") {
      c.kind = C::JsonObject;
      if (auto sc = rf->find("schema"); sc != rf->end() && !sc->is_null()) {  // llama-server's form
        if (!sc->is_object()) return bad_constraint("response_format.schema", "'response_format.schema' must be an object");
        c.kind = C::JsonSchema;
        c.text = sc->dump();
      }
    } else if (type == "json_schema") {
      auto js = rf->find("json_schema");
      if (js == rf->end() || !js->is_object())
        return bad_constraint("response_format.json_schema", "'response_format.json_schema' must be an object");
      auto sc = js->find("schema");
      if (sc != js->end() && !sc->is_object() && !sc->is_null())
        return bad_constraint("response_format.json_schema.schema", "'response_format.json_schema.schema' must be an object");
      if (auto st = js->find("strict"); st != js->end() && !st->is_null()) {
        if (!st->is_boolean())
          return bad_constraint("response_format.json_schema.strict", "'response_format.json_schema.strict' must be a boolean");
        c.strict = st->get<bool>();
      }
      // No schema: any JSON object (OpenAI requires one; vLLM accepts its absence).
      c.kind = sc == js->end() || sc->is_null() ? C::JsonObject : C::JsonSchema;
      if (c.kind == C::JsonSchema) c.text = sc->dump();
    } else if (type != "text") {
      return bad_constraint("response_format.type",
                            "'response_format.type' must be 'text', 'json_object' or 'json_schema', not '" + type + "'");
    }
    given += c.kind != C::None;
  }
  if (auto js = body.find("json_schema"); js != body.end() && !js->is_null()) {  // llama-server
    if (!js->is_object()) return bad_constraint("json_schema", "'json_schema' must be an object");
    c = C{C::JsonSchema, js->dump(), false, "json_schema"};
    ++given;
  }
  if (auto g = body.find("grammar"); g != body.end() && !g->is_null()) {  // llama-server's GBNF
    if (!g->is_string() || g->get_ref<const std::string&>().empty())
      return bad_constraint("grammar", "'grammar' must be a non-empty string (GBNF / EBNF, rule 'root')");
    c = C{C::Grammar, g->get<std::string>(), false, "grammar"};
    ++given;
  }
  if (given > 1)
    return bad_constraint(c.param, "give at most one of 'response_format' (json), 'json_schema' and 'grammar'");
  r.constraint = std::move(c);
  return std::nullopt;
}

namespace {

// The tool's entry of r.tools named `name`, or null.
const ojson* find_tool(const TextRequest& r, const std::string& name) {
  if (!r.tools.is_array()) return nullptr;
  for (const ojson& t : r.tools)
    if (t["function"]["name"] == name) return &t;
  return nullptr;
}

std::optional<ApiError> check_forced_choice(const TextRequest& r) {
  using T = TextRequest::ToolChoice;
  const T& tc = r.tool_choice;
  if (tc.mode == T::Auto) return std::nullopt;
  if (!r.tools.is_array() || r.tools.empty())
    return bad_constraint(tc.param, "'" + tc.param + "' forces a tool call, but the request has no tools");
  if (tc.mode == T::Named && !find_tool(r, tc.name))
    return bad_constraint(tc.param, "'" + tc.param + "' names '" + tc.name + "', which is not among the tools");
  return std::nullopt;
}

// The compiler `slot` of ctx, made at the first request that needs it (or the reason it cannot be).
Result<std::shared_ptr<GrammarCompiler>> compiler(Context& ctx, Context::Compiler& slot,
                                                  const std::vector<std::string>& text_specials) {
  std::lock_guard<std::mutex> lk(ctx.grammar_mu);
  if (!slot.compiler && slot.error.empty()) {
    auto made = GrammarCompiler::create(*ctx.bundle.tokenizer, ctx.bundle.model->config().vocab, text_specials);
    if (made) slot.compiler = made.value();
    else slot.error = made.message();
  }
  if (!slot.compiler) return err("%s", slot.error.c_str());
  return slot.compiler;
}

}  // namespace

std::optional<ApiError> read_openai_tool_choice(const ojson& body, TextRequest& r) {
  using T = TextRequest::ToolChoice;
  T& tc = r.tool_choice;
  if (auto p = body.find("parallel_tool_calls"); p != body.end() && !p->is_null()) {
    if (!p->is_boolean()) return bad_constraint("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    tc.parallel = p->get<bool>();
  }
  auto c = body.find("tool_choice");
  if (c == body.end() || c->is_null()) return std::nullopt;
  if (c->is_string()) {
    const std::string v = c->get<std::string>();
    if (v == "none") r.tools = nullptr;
    else if (v == "required") tc.mode = T::Required;
    else if (v != "auto")
      return bad_constraint("tool_choice", "'tool_choice' must be 'none', 'auto', 'required' or a function, not '" + v + "'");
  } else if (c->is_object() && c->contains("type") && (*c)["type"] == "function" && c->contains("function") &&
             (*c)["function"].is_object() && (*c)["function"].contains("name") && (*c)["function"]["name"].is_string()) {
    tc.mode = T::Named;
    tc.name = (*c)["function"]["name"].get<std::string>();
  } else {
    return bad_constraint("tool_choice", "'tool_choice' must be a string or {type: 'function', function: {name}}");
  }
  return check_forced_choice(r);
}

std::optional<ApiError> read_anthropic_tool_choice(const ojson& body, TextRequest& r) {
  using T = TextRequest::ToolChoice;
  T& tc = r.tool_choice;
  auto c = body.find("tool_choice");
  if (c == body.end() || c->is_null()) return std::nullopt;
  if (!c->is_object() || !c->contains("type") || !(*c)["type"].is_string())
    return bad_constraint("tool_choice", "'tool_choice' must be an object with a string 'type'");
  if (auto d = c->find("disable_parallel_tool_use"); d != c->end() && !d->is_null()) {
    if (!d->is_boolean())
      return bad_constraint("tool_choice.disable_parallel_tool_use", "'disable_parallel_tool_use' must be a boolean");
    tc.parallel = !d->get<bool>();
  }
  const std::string type = (*c)["type"].get<std::string>();
  if (type == "none") r.tools = nullptr;
  else if (type == "any") tc.mode = T::Required;
  else if (type == "tool") {
    if (!c->contains("name") || !(*c)["name"].is_string())
      return bad_constraint("tool_choice.name", "'tool_choice' of type 'tool' needs the tool's 'name'");
    tc.mode = T::Named;
    tc.name = (*c)["name"].get<std::string>();
  } else if (type != "auto") {
    return bad_constraint("tool_choice.type", "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none', not '" +
                                                  type + "'");
  }
  return check_forced_choice(r);
}

std::optional<ApiError> compile_constraint(Context& ctx, TextRequest& r) {
  using C = TextRequest::Constraint;
  using T = TextRequest::ToolChoice;
  if (r.tool_choice.mode != T::Auto && r.tools.is_array()) {  // the calls' grammar, in place of any other
    auto tc = compiler(ctx, ctx.tool_grammar, gemma4_tool_markup_tokens());
    if (!tc) return ApiError{400, "invalid_request_error", tc.message(), r.tool_choice.param};
    ToolCallGrammarSpec spec{r.tools, r.tool_choice.mode == T::Named ? r.tool_choice.name : std::string(),
                             r.tool_choice.parallel, r.thinking.value_or(false)};
    auto g = tc.value()->structural_tag(gemma4_tool_call_structural_tag(spec));
    if (!g) return bad_constraint("tools", "a tool's 'parameters' schema was refused: " + g.message());
    r.grammar = g.value();
    return std::nullopt;
  }
  const C& c = r.constraint;
  if (c.kind == C::None) return std::nullopt;
  auto made = compiler(ctx, ctx.grammar, {});
  if (!made) return ApiError{400, "invalid_request_error", made.message(), c.param};
  GrammarCompiler& gc = *made.value();
  Result<std::shared_ptr<const CompiledGrammar>> g =
      c.kind == C::JsonObject ? gc.json_object()
      : c.kind == C::JsonSchema ? gc.json_schema(c.text, c.strict)
                                : gc.ebnf(c.text);
  if (!g) return bad_constraint(c.param, "'" + c.param + "': " + g.message());
  r.grammar = g.value();
  return std::nullopt;
}

}  // namespace g4::server
