// LoRA adapters per request (runtime/adapter_set.h) on the HTTP surface, as vLLM serves them:
//   - A request's "model" picks one: "<served model id>:NAME" or "NAME". Any other model name means
//     the base model, as before (clients send their own names); "<id>:NAME" naming no mounted
//     adapter is a 404.
//   - GET /v1/models lists each mounted adapter after the base model ({"id": "<id>:NAME",
//     "parent": <id>, "root": its directory}); GET /v1/models/<id>:NAME answers for one.
//   - POST /v1/load_lora_adapter {"lora_name", "lora_path"} mounts one and POST
//     /v1/unload_lora_adapter {"lora_name"} unmounts it (vLLM's runtime LoRA endpoints), behind
//     --api-key like every route. A request running with an adapter keeps it until it ends.
#include <optional>
#include <string>

#include "runtime/adapter_set.h"
#include "server/context.h"

namespace g4::server {
namespace {

std::string adapter_id(const Context& ctx, const MountedAdapter& m) { return ctx.model_id + ":" + m.name; }

// The mounted adapter a model name picks ("<id>:NAME" or "NAME"), or null.
std::shared_ptr<const MountedAdapter> adapter_named(const Context& ctx, const std::string& model, bool* qualified) {
  const std::string prefix = ctx.model_id + ":";
  *qualified = model.size() > prefix.size() && model.compare(0, prefix.size(), prefix) == 0;
  return ctx.adapters->find(*qualified ? model.substr(prefix.size()) : model);
}

// body[key] as a non-empty string, or false with *e naming the field.
bool string_field(const ojson& body, const char* key, std::string* out, ApiError* e) {
  auto it = body.find(key);
  if (it == body.end() || !it->is_string() || it->get<std::string>().empty()) {
    *e = ApiError{400, "invalid_request_error", std::string("'") + key + "' must be a non-empty string", key};
    return false;
  }
  *out = it->get<std::string>();
  return true;
}

// Answers `ok` (200) or else e, counted under endpoint.
void answer(Context& ctx, http::Response& res, const char* endpoint, const std::optional<ojson>& ok, const ApiError& e) {
  ctx.metrics.count(endpoint, ok ? 200 : e.status);
  if (ok) res.set_content(ok->dump(), "application/json");
  else send_openai_error(res, e);
}

void load(Context& ctx, const http::Request& hreq, http::Response& res) {
  ApiError e;
  ojson body;
  std::string name, path;
  std::optional<ojson> ok;
  if (parse_body(hreq, body, e) && string_field(body, "lora_name", &name, &e) &&
      string_field(body, "lora_path", &path, &e)) {
    if (Status st = ctx.adapters->mount(name, path); !st) e = ApiError{400, "invalid_request_error", st.message(), "lora_path"};
    else ok = ojson{{"status", "ok"}, {"lora_name", name}, {"model", ctx.model_id + ":" + name}};
  }
  answer(ctx, res, "/v1/load_lora_adapter", ok, e);
}

void unload(Context& ctx, const http::Request& hreq, http::Response& res) {
  ApiError e;
  ojson body;
  std::string name;
  std::optional<ojson> ok;
  if (parse_body(hreq, body, e) && string_field(body, "lora_name", &name, &e)) {
    if (Status st = ctx.adapters->unmount(name); !st) e = ApiError{404, "not_found_error", st.message(), "lora_name"};
    else ok = ojson{{"status", "ok"}, {"lora_name", name}};
  }
  answer(ctx, res, "/v1/unload_lora_adapter", ok, e);
}

}  // namespace

std::optional<ApiError> select_adapter(Context& ctx, const ojson& body, TextRequest& r) {
  auto it = body.find("model");
  if (it == body.end() || !it->is_string()) return std::nullopt;
  const std::string model = it->get<std::string>();
  bool qualified = false;
  r.adapter = adapter_named(ctx, model, &qualified);
  if (!r.adapter && qualified)
    return ApiError{404, "not_found_error", "the model '" + model + "' does not exist (no adapter of that name is mounted)",
                    "model"};
  return std::nullopt;
}

namespace {

// One adapter's /v1/models entry.
ojson adapter_model(const Context& ctx, const MountedAdapter& m) {
  return {{"id", adapter_id(ctx, m)}, {"object", "model"}, {"created", unix_time()},
          {"owned_by", "local"}, {"parent", ctx.model_id}, {"root", m.path}};
}

}  // namespace

std::vector<ojson> adapter_models(const Context& ctx) {
  std::vector<ojson> out;
  for (const auto& m : ctx.adapters->list()) out.push_back(adapter_model(ctx, *m));
  return out;
}

bool answer_adapter_model(Context& ctx, const http::Request& req, http::Response& res) {
  const std::string prefix = "/v1/models/";
  if (req.method != "GET" || req.path.compare(0, prefix.size(), prefix) != 0) return false;
  bool qualified = false;
  const auto m = adapter_named(ctx, req.path.substr(prefix.size()), &qualified);
  if (!m || !qualified) return false;
  res.set_content(adapter_model(ctx, *m).dump(), "application/json");
  ctx.metrics.count("/v1/models", 200);
  return true;
}

void register_adapter_routes(http::Server& svr, Context& ctx) {
  svr.Post("/v1/load_lora_adapter", [&ctx](const http::Request& q, http::Response& r) { load(ctx, q, r); });
  svr.Post("/v1/unload_lora_adapter", [&ctx](const http::Request& q, http::Response& r) { unload(ctx, q, r); });
}

}  // namespace g4::server
