// gemma4's HTTP server: one process, one model, one engine thread; HTTP threads only translate
// JSON into engine requests (server/openai_api.cpp, server/anthropic_api.cpp).
// Endpoints: /v1/chat/completions, /v1/completions, /v1/models, /v1/messages, /v1/responses, the
// LoRA adapter endpoints (adapters_api.cpp), /health, /metrics.
#pragma once
#include <memory>
#include <thread>

#include "core/status.h"
#include "server/context.h"

namespace g4::server {

class Server {
 public:
  Server(const ModelBundle& bundle, ServerOptions opt);
  ~Server();
  // Mounts ServerOptions::adapters, binds the port (0: a free one) and starts serving on a
  // background thread. Errors: the KV events' endpoint or library, an adapter that does not load
  // (named), the port.
  Status start();
  int port() const { return port_; }
  // Stops accepting connections, cancels or drains running requests, joins the threads.
  void stop(bool drain);
  // Blocks until stop() is called from another thread (or a signal handler path).
  void wait();

 private:
  void register_routes();
  std::string metrics_text();

  const ModelBundle& bundle_;
  ServerOptions opt_;
  Status kv_events_error_;  // opening the KV event publisher (reported by start)
  std::shared_ptr<KvEventPublisher> kv_events_;
  std::shared_ptr<KvBlockTracker> kv_blocks_;
  std::unique_ptr<Engine> engine_;
  Metrics metrics_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<AdapterSet> adapters_;  // ServerOptions::adapters and the load endpoint's
  std::unique_ptr<http::Server> http_;
  int port_ = 0;
};

}  // namespace g4::server
