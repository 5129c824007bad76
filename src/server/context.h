// State shared by the HTTP handlers: the model bundle, the engine, options and counters.
// Handlers translate JSON into TextRequests and LiveGenerations; they never touch the model.
#pragma once
#include "server/http.h"

#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "runtime/bundle.h"
#include "runtime/engine.h"
#include "server/api_types.h"
#include "server/kv_event_publisher.h"
#include "server/request_log.h"
#include "server/response_store.h"

namespace g4::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;             // 0: any free port
  std::string api_key;         // empty: no authentication
  int parallel = 4;            // sequences decoded together
  int max_queue = 32;          // waiting requests beyond the slots (then 429)
  int max_context = 8192;      // prompt + max_tokens per request
  int default_max_tokens = 512;
  size_t max_body_bytes = size_t(4) << 20;
  int http_threads = 0;        // 0: parallel + max_queue + 4
  std::string model_id;        // name reported by /v1/models (default: the model's file name)
  size_t prefix_cache_bytes = size_t(256) << 20;
  std::string prompt_cache_dir, prompt_cache_key;  // EngineOptions' prompt_cache_*
  size_t prompt_cache_disk_bytes = EngineOptions{}.prompt_cache_disk_bytes;
  int step_tokens = EngineOptions{}.step_tokens;  // EngineOptions::step_tokens
  int prefill_chunk = EngineOptions{}.prefill_chunk;  // EngineOptions::prefill_chunk
  size_t kv_pool_bytes = 0;    // EngineOptions::kv_pool_bytes (0: a KV buffer per sequence)
  bool decode_buckets = false;  // EngineOptions::decode_buckets
  bool decode_ahead = true;     // EngineOptions::decode_ahead (Device when on)
  RequestLogOptions log;       // one line per request on stderr (server/request_log.h)
  // Parse special tokens in the text of messages too (a client can then write control tokens,
  // and forge turns); off: only the chat template's own markup yields special tokens.
  bool allow_special_in_content = false;
  int shutdown_timeout_s = 30;  // SIGTERM: running requests get this long, then are cancelled
  int max_connections = 512;    // open connections; one more is answered 503
  std::vector<std::string> cors_origins;  // browser origins allowed to call the API ("*": any)
  // LoRA adapters mounted at start (--adapter NAME=DIR): name and directory (runtime/adapter_set.h).
  std::vector<std::pair<std::string, std::string>> adapters;
  // KV events for a cache-aware router (server/kv_event_publisher.h); empty endpoint: none.
  KvEventsOptions kv_events;
};

// Request counters for /metrics. Labels come from fixed sets (the routes this server has, "other";
// the status codes it sends), never from what a client wrote, so counters cannot be forged or
// grow without bound.
struct Metrics {
  std::mutex mu;
  std::map<std::string, uint64_t> requests;  // "endpoint status" -> count
  static std::string endpoint_label(const std::string& path) {
    for (const char* known : {"/", "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/messages",
                               "/v1/messages/count_tokens", "/v1/responses", "/tokenize", "/detokenize", "/slots/save",
                               "/slots/restore", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/health",
                               "/metrics"})
      if (path == known) return known;
    return "other";
  }
  void count(const std::string& endpoint, int status) {
    if (status < 100 || status > 599) status = 500;
    std::lock_guard<std::mutex> lk(mu);
    ++requests[endpoint_label(endpoint) + " " + std::to_string(status)];
  }
};

struct Context {
  const ModelBundle& bundle;
  Engine& engine;
  const ServerOptions& opt;
  Metrics& metrics;
  std::atomic<bool>& stopping;
  std::string model_id;
  // What a request samples with for the parameters it leaves out: the model's generation_config
  // (generation_defaults), as `gemma4 run` does.
  SamplingParams sampling_defaults;
  std::atomic<int> inflight{0};  // generation handlers whose response is not fully written yet
  // Constrained decoding: the compilers for this model's vocabulary, each made at the first request
  // that needs it (or the reason it could not be made): `grammar` for response formats and raw
  // grammars, `tool_grammar` for forced tool calls (it sees the tool-call markup tokens as text).
  struct Compiler {
    std::shared_ptr<GrammarCompiler> compiler;
    std::string error;
  };
  std::mutex grammar_mu{};
  Compiler grammar{};
  Compiler tool_grammar{};
  ResponseStore responses{};  // the Responses API's stored responses (response_store.h)
  AdapterSet* adapters = nullptr;  // LoRA adapters mounted over the model (adapters_api.cpp)
};

// TextRequest::constraint compiled into TextRequest::grammar (400 naming the field when the schema
// or grammar is refused). Compiled grammars are cached by their text.
std::optional<ApiError> compile_constraint(Context& ctx, TextRequest& r);

// Counts a generation handler in Context::inflight for its lifetime (a streaming handler keeps
// it alive in its content provider, so draining waits until the last event was written).
struct InflightGuard {
  explicit InflightGuard(std::atomic<int>& n) : n_(n) { ++n_; }
  ~InflightGuard() { --n_; }
  InflightGuard(const InflightGuard&) = delete;
  InflightGuard& operator=(const InflightGuard&) = delete;

 private:
  std::atomic<int>& n_;
};

// Error bodies in each API's shape.
void send_openai_error(http::Response& res, const ApiError& e);
void send_anthropic_error(http::Response& res, const ApiError& e);
// Parses a JSON object body; on failure fills `e` (400 with the parser's message).
bool parse_body(const http::Request& req, ojson& out, ApiError& e);
// A fresh id like "chatcmpl-1a2b3c..." and the current UNIX time.
std::string new_id(const char* prefix);
long unix_time();

void register_openai_routes(http::Server& svr, Context& ctx);
void register_slot_routes(http::Server& svr, Context& ctx);
// The prompt token ids of a body holding "messages" (the chat prompt /v1/chat/completions builds)
// or "content" / "prompt" (a text prompt, <bos> first); *chat: which. False with *e otherwise.
bool request_prompt_ids(Context& ctx, const ojson& body, std::vector<int32_t>* ids, bool* chat, ApiError* e);
void register_anthropic_routes(http::Server& svr, Context& ctx);
void register_responses_routes(http::Server& svr, Context& ctx);
// adapters_api.cpp: the adapter a request's "model" picks into r.adapter (404 for "<id>:NAME"
// naming none); the mounted adapters as /v1/models entries; GET /v1/models/<id>:NAME answered
// (true) before routing; the load / unload endpoints.
std::optional<ApiError> select_adapter(Context& ctx, const ojson& body, TextRequest& r);
std::vector<ojson> adapter_models(const Context& ctx);
bool answer_adapter_model(Context& ctx, const http::Request& req, http::Response& res);
void register_adapter_routes(http::Server& svr, Context& ctx);

}  // namespace g4::server
