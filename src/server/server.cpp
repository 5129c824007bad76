#include "server/server.h"
#include "server/request_log.h"
#include "server/web_page.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

namespace g4::server {

void send_openai_error(httplib::Response& res, const ApiError& e) {
  ojson err = {{"message", e.message}, {"type", e.type}, {"param", e.param.empty() ? ojson() : ojson(e.param)},
               {"code", nullptr}};
  res.status = e.status;
  res.set_content(ojson{{"error", err}}.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
}

void send_anthropic_error(httplib::Response& res, const ApiError& e) {
  std::string type = e.type;
  if (e.status == 429) type = "rate_limit_error";
  if (e.status == 401) type = "authentication_error";
  if (e.status >= 500) type = "api_error";
  res.status = e.status;
  res.set_content(ojson{{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}}.dump(-1, ' ', false, ojson::error_handler_t::replace),
                  "application/json");
}

bool parse_body(const httplib::Request& req, ojson& out, ApiError& e) {
  try {
    out = ojson::parse(req.body);
  } catch (const std::exception& ex) {
    e = {400, "invalid_request_error", std::string("malformed JSON body: ") + ex.what(), ""};
    return false;
  }
  if (!out.is_object()) {
    e = {400, "invalid_request_error", "the request body must be a JSON object", ""};
    return false;
  }
  return true;
}

std::string new_id(const char* prefix) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() & 0xffffffff));
  return std::string(prefix) + buf;
}

long unix_time() {
  return long(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count());
}

Server::Server(const ModelBundle& bundle, ServerOptions opt) : bundle_(bundle), opt_(std::move(opt)) {
  EngineOptions eo;
  eo.parallel = opt_.parallel;
  eo.max_queue = opt_.max_queue;
  eo.max_context = opt_.max_context;
  eo.prefix_cache_bytes = opt_.prefix_cache_bytes;
  engine_ = std::make_unique<Engine>(*bundle.model, eo);
  std::string id = opt_.model_id.empty() ? bundle.name : opt_.model_id;
  ctx_.reset(new Context{bundle_, *engine_, opt_, metrics_, stopping_, id});
  register_routes();
}

Server::~Server() { stop(false); }

std::string Server::metrics_text() {
  EngineStats s = engine_->stats();
  std::ostringstream o;
  o << "# HELP gemma4_requests_total HTTP requests by endpoint and status.\n# TYPE gemma4_requests_total counter\n";
  {
    std::lock_guard<std::mutex> lk(metrics_.mu);
    for (auto& [k, v] : metrics_.requests) {
      auto sp = k.rfind(' ');
      o << "gemma4_requests_total{endpoint=\"" << k.substr(0, sp) << "\",status=\"" << k.substr(sp + 1) << "\"} " << v << "\n";
    }
  }
  auto line = [&](const char* name, const char* type, const char* help, double v) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n" << name << " " << v << "\n";
  };
  line("gemma4_engine_requests_total", "counter", "Generation requests accepted by the engine.", double(s.requests_total));
  line("gemma4_engine_requests_rejected_total", "counter", "Requests refused because the queue was full.", double(s.requests_rejected));
  line("gemma4_prompt_tokens_total", "counter", "Prompt tokens received.", double(s.prompt_tokens));
  line("gemma4_prompt_tokens_cached_total", "counter", "Prompt tokens served from the prefix cache.", double(s.cached_tokens));
  line("gemma4_generated_tokens_total", "counter", "Tokens generated.", double(s.generated_tokens));
  line("gemma4_queue_depth", "gauge", "Requests waiting for a slot.", double(s.queued));
  line("gemma4_active_sequences", "gauge", "Sequences being decoded.", double(s.active));
  line("gemma4_engine_steps_total", "counter", "Batched forward steps.", double(s.steps));
  line("gemma4_engine_forward_seconds_total", "counter", "Time spent in forward passes.", s.forward_seconds);
  line("gemma4_draft_rounds_total", "counter", "Speculative rounds (draft and verify) run.", double(s.draft_rounds));
  line("gemma4_draft_tokens_total", "counter", "Tokens proposed by the drafter.", double(s.drafted_tokens));
  line("gemma4_draft_tokens_accepted_total", "counter", "Drafted tokens the model accepted.", double(s.accepted_tokens));
  line("gemma4_engine_step_seconds_total", "counter", "Time spent in steps (forward + scheduling + sampling).", s.step_seconds);
  line("gemma4_generation_tokens_per_second", "gauge", "Generated tokens per second of engine step time.",
       s.step_seconds > 0 ? double(s.generated_tokens) / s.step_seconds : 0.0);
  return o.str();
}

void Server::register_routes() {
  http_.set_payload_max_length(opt_.max_body_bytes);
  const int threads = opt_.http_threads > 0 ? opt_.http_threads : opt_.parallel + opt_.max_queue + 4;
  http_.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    begin_request();  // the request log's clock (server/request_log.h)
    // The web page (it asks for the key itself) and /health are open.
    if (opt_.api_key.empty() || req.path == "/health" || req.path == "/")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string xkey = req.get_header_value("x-api-key");
    if (auth == "Bearer " + opt_.api_key || xkey == opt_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{401, "authentication_error", "missing or invalid API key", ""};
    // The body was not read: a next request on this connection would be parsed from it.
    res.set_header("Connection", "close");
    metrics_.count(req.path, 401);
    if (req.path == "/v1/messages") send_anthropic_error(res, e); else send_openai_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  http_.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, res.status == 404 ? "not_found_error" : "invalid_request_error",
               res.status == 404 ? "no such endpoint: " + req.method + " " + req.path
               : res.status == 413 ? "request body too large" : "bad request", ""};
    if (req.path == "/v1/messages") send_anthropic_error(res, e); else send_openai_error(res, e);
  });
  http_.set_exception_handler([](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try { if (ep) std::rethrow_exception(ep); } catch (const std::exception& ex) { what = ex.what(); } catch (...) {}
    const ApiError e{500, "server_error", what, ""};
    if (req.path == "/v1/messages") send_anthropic_error(res, e); else send_openai_error(res, e);
  });
  http_.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    EngineStats s = engine_->stats();
    res.set_content(ojson{{"status", stopping_.load() ? "stopping" : "ok"}, {"model", ctx_->model_id},
                          {"active", s.active}, {"queued", s.queued}}.dump(), "application/json");
  });
  http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http_.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    log_request(opt_.log, req.method, req.path, res.status, engine_.get());
  });
  register_web_page(http_);
  register_openai_routes(http_, *ctx_);
  register_anthropic_routes(http_, *ctx_);
}

Status Server::start() {
  if (opt_.port == 0) {
    port_ = http_.bind_to_any_port(opt_.host);
    if (port_ <= 0) return err("cannot bind %s on any port", opt_.host.c_str());
  } else {
    if (!http_.bind_to_port(opt_.host, opt_.port)) return err("cannot bind %s:%d (in use?)", opt_.host.c_str(), opt_.port);
    port_ = opt_.port;
  }
  thread_ = std::thread([this] { http_.listen_after_bind(); });
  return {};
}

void Server::stop(bool drain) {
  if (stopping_.exchange(true)) {
    if (thread_.joinable()) thread_.join();
    return;
  }
  if (drain) {
    engine_->shutdown(true);  // running requests finish...
    // ...and their handlers write the last events before the HTTP server stops (httplib ends
    // chunked responses as soon as it is stopped).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (ctx_->inflight.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  http_.stop();
  if (thread_.joinable()) thread_.join();
  engine_->shutdown(false);
}

void Server::wait() {
  while (!stopping_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (thread_.joinable()) thread_.join();
}

}  // namespace g4::server
