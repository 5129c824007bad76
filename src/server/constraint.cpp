// Constrained decoding at the HTTP edge: the request fields that ask for a grammar
// (read_constraint, api_types.h) and their compilation against the served model's vocabulary
// (compile_constraint, context.h).
#include <mutex>

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

std::optional<ApiError> compile_constraint(Context& ctx, TextRequest& r) {
  using C = TextRequest::Constraint;
  const C& c = r.constraint;
  if (c.kind == C::None) return std::nullopt;
  {
    std::lock_guard<std::mutex> lk(ctx.grammar_mu);
    if (!ctx.grammar && ctx.grammar_error.empty()) {  // built once, at the first constrained request
      auto made = GrammarCompiler::create(*ctx.bundle.tokenizer, ctx.bundle.model->config().vocab);
      if (made) ctx.grammar = made.value();
      else ctx.grammar_error = made.message();
    }
    if (!ctx.grammar) return ApiError{400, "invalid_request_error", ctx.grammar_error, c.param};
  }
  Result<std::shared_ptr<const CompiledGrammar>> g =
      c.kind == C::JsonObject ? ctx.grammar->json_object()
      : c.kind == C::JsonSchema ? ctx.grammar->json_schema(c.text, c.strict)
                                : ctx.grammar->ebnf(c.text);
  if (!g) return bad_constraint(c.param, "'" + c.param + "': " + g.message());
  r.grammar = g.value();
  return std::nullopt;
}

}  // namespace g4::server
