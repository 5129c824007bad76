#include "server/server.h"
#include "server/request_log.h"
#include "server/web_page.h"

#include "io/json_bounded.h"
#include "server/access.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

namespace g4::server {

void send_openai_error(http::Response& res, const ApiError& e) {
  ojson err = {{"message", e.message}, {"type", e.type}, {"param", e.param.empty() ? ojson() : ojson(e.param)},
               {"code", nullptr}};
  res.status = e.status;
  res.set_content(ojson{{"error", err}}.dump(-1, ' ', false, ojson::error_handler_t::replace), "application/json");
}

void send_anthropic_error(http::Response& res, const ApiError& e) {
  std::string type = e.type;
  if (e.status == 429) type = "rate_limit_error";
  if (e.status == 401) type = "authentication_error";
  if (e.status >= 500) type = "api_error";
  res.status = e.status;
  res.set_content(ojson{{"type", "error"}, {"error", {{"type", type}, {"message", e.message}}}}.dump(-1, ' ', false, ojson::error_handler_t::replace),
                  "application/json");
}

bool parse_body(const http::Request& req, ojson& out, ApiError& e) {
  std::string why;
  auto parsed = parse_json_bounded<ojson>(req.body, kRequestJsonLimits, why);
  if (!parsed) {
    e = {400, "invalid_request_error", "malformed JSON body: " + why, ""};
    return false;
  }
  out = std::move(*parsed);
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
  eo.prompt_cache_dir = opt_.prompt_cache_dir;
  eo.prompt_cache_key = opt_.prompt_cache_key;
  eo.prompt_cache_disk_bytes = opt_.prompt_cache_disk_bytes;
  eo.step_tokens = opt_.step_tokens;
  eo.prefill_chunk = opt_.prefill_chunk;
  eo.kv_pool_bytes = opt_.kv_pool_bytes;
  eo.decode_buckets = opt_.decode_buckets;
  if (!opt_.decode_ahead) eo.decode_ahead = EngineOptions::DecodeAhead::Off;
  if (!opt_.kv_events.endpoint.empty()) {
    if (bundle.model->backend().on_device()) opt_.kv_events.medium = "GPU";
    auto pub = KvEventPublisher::open(opt_.kv_events);
    if (pub) {
      kv_events_ = std::move(pub).value();
      kv_blocks_ = std::make_shared<KvBlockTracker>(opt_.kv_events.block_size, kv_events_, [this](uint64_t serial) {
        if (adapters_)
          for (const auto& a : adapters_->list())
            if (a->serial == serial) return a->name;
        return std::string();
      });
      eo.prefix_listener = kv_blocks_;
    } else {
      kv_events_error_ = Error{pub.message()};
    }
  }
  engine_ = std::make_unique<Engine>(*bundle.model, eo);
  std::string id = opt_.model_id.empty() ? bundle.name : opt_.model_id;
  ctx_.reset(new Context{bundle_, *engine_, opt_, metrics_, stopping_, id, generation_defaults(bundle.model->config())});
  adapters_ = std::make_unique<AdapterSet>(*engine_);
  ctx_->adapters = adapters_.get();
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
  line("gemma4_grammar_seconds_total", "counter", "Time spent filling and applying grammar token masks.",
       s.grammar_seconds);
  line("gemma4_grammar_tokens_total", "counter", "Tokens sampled under a grammar.", double(s.grammar_tokens));
  line("gemma4_generation_tokens_per_second", "gauge", "Generated tokens per second of engine step time.",
       s.step_seconds > 0 ? double(s.generated_tokens) / s.step_seconds : 0.0);
  const double kv_usage = s.kv_capacity_tokens > 0 ? double(s.kv_tokens) / double(s.kv_capacity_tokens) : 0.0;
  line("gemma4_kv_cache_usage_ratio", "gauge",
       "KV cache held by running sequences, as a fraction (0..1) of what the slots may hold.", kv_usage);
  line("gemma4_kv_cache_tokens", "gauge", "Tokens in the KV caches of running sequences.", double(s.kv_tokens));
  line("gemma4_kv_cache_capacity_tokens", "gauge",
       "Tokens the KV caches may hold (--parallel x context; a KV pool: its full-attention blocks).",
       double(s.kv_capacity_tokens));
  line("gemma4_kv_pool_blocks", "gauge", "Blocks of the paged KV pool (0: a KV buffer per sequence).",
       double(s.kv_pool_blocks));
  line("gemma4_kv_pool_free_blocks", "gauge", "Free blocks of the paged KV pool.", double(s.kv_pool_free_blocks));
  line("gemma4_prefix_cache_bytes", "gauge", "KV bytes kept for prompt prefixes (evictable).", double(s.prefix_bytes));
  line("gemma4_prefix_cache_capacity_bytes", "gauge", "The prompt-prefix cache's byte budget.",
       double(s.prefix_capacity_bytes));
  line("gemma4_prefix_cache_entries", "gauge", "Prompt prefixes held.", double(s.prefix_entries));
  if (kv_events_) {
    line("gemma4_kv_events_batches_sent_total", "counter", "KV event batches published (--kv-events-endpoint).",
         double(kv_events_->sent()));
    line("gemma4_kv_events_batches_dropped_total", "counter", "KV event batches dropped from a full queue.",
         double(kv_events_->dropped()));
    line("gemma4_kv_events_blocks", "gauge", "Prefix-cache blocks the KV events report held.",
         double(kv_blocks_->blocks_held()));
  }
  // The same gauges under vLLM's names, which the Gateway API Inference Extension's endpoint
  // picker (llm-d) and the SGLang gateway read by default (the model-server protocol).
  line("vllm:num_requests_waiting", "gauge", "Requests waiting for a slot (gemma4_queue_depth).", double(s.queued));
  line("vllm:num_requests_running", "gauge", "Sequences being decoded (gemma4_active_sequences).", double(s.active));
  line("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage, 1 = full (gemma4_kv_cache_usage_ratio).", kv_usage);
  line("vllm:gpu_cache_usage_perc", "gauge", "KV-cache usage, 1 = full (the older vLLM name).", kv_usage);
  line("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
       double(s.prompt_tokens));
  line("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", double(s.cached_tokens));
  // The protocol's LoRA gauge: the served model's own adapter (--adapter-path) under the model's id,
  // the mounted ones under their /v1/models ids; all of them always loaded.
  std::vector<std::string> loras;
  if (engine_->model().adapter()) loras.push_back(ctx_->model_id);
  for (const auto& m : adapters_->list()) loras.push_back(ctx_->model_id + ":" + m->name);
  if (!loras.empty()) {
    std::string ids;  // a label value: quotes, backslashes and newlines escaped
    for (const std::string& l : loras) {
      if (!ids.empty()) ids += ',';
      for (char c : l) {
        if (c == '"' || c == '\\') ids += '\\';
        if (c == '\n') ids += "\\n";
        else ids += c;
      }
    }
    o << "# HELP vllm:lora_requests_info LoRA adapters loaded (value: last update, Unix seconds).\n"
         "# TYPE vllm:lora_requests_info gauge\nvllm:lora_requests_info{max_lora=\"" << loras.size()
      << "\",running_lora_adapters=\"" << ids << "\",waiting_lora_adapters=\"\"} "
      << std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count()
      << "\n";
  }
  return o.str();
}

void Server::register_routes() {
  http::Limits lim;
  lim.max_body_bytes = opt_.max_body_bytes;
  lim.max_connections = opt_.max_connections;
  lim.worker_threads = opt_.http_threads > 0 ? opt_.http_threads : opt_.parallel + opt_.max_queue + 4;
  http_ = std::make_unique<http::Server>(lim);
  auto send_error = [](const http::Request& req, http::Response& res, const ApiError& e) {
    // Anthropic's error shape on every Anthropic path (/v1/messages and below), OpenAI's elsewhere.
    if (req.path.rfind("/v1/messages", 0) == 0) send_anthropic_error(res, e); else send_openai_error(res, e);
  };
  http_->set_pre_routing_handler([this, send_error](const http::Request& req, http::Response& res) {
    begin_request();  // the request log's clock (server/request_log.h)
    auto refused = check_access(req, opt_, res);
    if (!refused) return answer_adapter_model(*ctx_, req, res);
    if (refused->status == 204) {  // a CORS preflight, answered
      res.status = 204;
      return true;
    }
    metrics_.count(req.path, refused->status);
    send_error(req, res, *refused);
    return true;
  });
  http_->set_error_handler([send_error](const http::Request& req, http::Response& res) {
    if (!res.body.empty()) return;
    const bool model_path = res.status == 404 && req.method == "GET" && req.path.rfind("/v1/models/", 0) == 0;
    const std::string why = !res.error_message.empty() ? res.error_message
                            : model_path                ? "the model '" + req.path.substr(11) + "' does not exist"
                            : res.status == 404         ? "no such endpoint: " + req.method + " " + req.path
                                                        : "bad request";
    ApiError e{res.status, res.status == 404 ? "not_found_error" : res.status >= 500 ? "server_error" : "invalid_request_error",
               why, ""};
    send_error(req, res, e);
  });
  http_->set_exception_handler([send_error](const http::Request& req, http::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try { if (ep) std::rethrow_exception(ep); } catch (const std::exception& ex) { what = ex.what(); } catch (...) {}
    send_error(req, res, ApiError{500, "server_error", what, ""});
  });
  http_->Get("/health", [this](const http::Request&, http::Response& res) {
    EngineStats s = engine_->stats();
    res.set_content(ojson{{"status", stopping_.load() ? "stopping" : "ok"}, {"model", ctx_->model_id},
                          {"active", s.active}, {"queued", s.queued}}.dump(), "application/json");
  });
  http_->Get("/metrics", [this](const http::Request&, http::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http_->set_logger([this](const http::Request& req, const http::Response& res) {
    log_request(opt_.log, req.method, req.path, res.status, engine_.get());
  });
  register_web_page(*http_);
  register_openai_routes(*http_, *ctx_);
  register_slot_routes(*http_, *ctx_);
  register_anthropic_routes(*http_, *ctx_);
  register_responses_routes(*http_, *ctx_);
  register_adapter_routes(*http_, *ctx_);
}

Status Server::start() {
  G4_TRY(kv_events_error_);
  for (const auto& [name, dir] : opt_.adapters) G4_TRY(adapters_->mount(name, dir));
  auto port = http_->bind(opt_.host, opt_.port);
  if (!port) return Error{port.message()};
  port_ = port.value();
  if (opt_.api_key.empty() && !is_loopback_host(opt_.host))
    std::fprintf(stderr, "[gemma4 serve] warning: listening on %s without --api-key: anyone who can reach port %d "
                 "can use this server\n", opt_.host.c_str(), port_);
  http_->start();
  return {};
}

void Server::stop(bool drain) {
  if (stopping_.exchange(true)) return;
  // Handlers must write their last events before the HTTP server stops (stopping closes every
  // connection).
  auto wait_handlers = [this](std::chrono::steady_clock::duration d) {
    const auto deadline = std::chrono::steady_clock::now() + d;
    while (ctx_->inflight.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  };
  if (drain) {
    engine_->request_stop(true);  // running requests finish, for at most the drain deadline...
    wait_handlers(std::chrono::seconds(opt_.shutdown_timeout_s));
  }
  engine_->request_stop(false);  // ...then what is left is cancelled and its handlers finish
  wait_handlers(std::chrono::seconds(2));
  http_->stop();
  engine_->shutdown(false);
}

void Server::wait() {
  while (!stopping_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

}  // namespace g4::server
