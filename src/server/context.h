// State shared by the HTTP handlers: the model bundle, the engine, options and counters.
// Handlers translate JSON into TextRequests and LiveGenerations; they never touch the model.
#pragma once
#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <string>

#include "runtime/bundle.h"
#include "runtime/engine.h"
#include "server/api_types.h"
#include "server/request_log.h"

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
  RequestLogOptions log;       // one line per request on stderr (server/request_log.h)
};

struct Metrics {
  std::mutex mu;
  std::map<std::string, uint64_t> requests;  // "endpoint status" -> count
  void count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lk(mu);
    ++requests[endpoint + " " + std::to_string(status)];
  }
};

struct Context {
  const ModelBundle& bundle;
  Engine& engine;
  const ServerOptions& opt;
  Metrics& metrics;
  std::atomic<bool>& stopping;
  std::string model_id;
  std::atomic<int> inflight{0};  // generation handlers whose response is not fully written yet
};

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
void send_openai_error(httplib::Response& res, const ApiError& e);
void send_anthropic_error(httplib::Response& res, const ApiError& e);
// Parses a JSON object body; on failure fills `e` (400 with the parser's message).
bool parse_body(const httplib::Request& req, ojson& out, ApiError& e);
// A fresh id like "chatcmpl-1a2b3c..." and the current UNIX time.
std::string new_id(const char* prefix);
long unix_time();

void register_openai_routes(httplib::Server& svr, Context& ctx);
void register_anthropic_routes(httplib::Server& svr, Context& ctx);

}  // namespace g4::server
