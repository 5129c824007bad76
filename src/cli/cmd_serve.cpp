// gemma4 serve [--model PATH] [--host 127.0.0.1] [--port 8080] [--parallel N] [--api-key KEY]
//              [--max-queue N] [--context N] [--max-tokens N] [--chat-template FILE]
//              [--threads N] [--backend cpu|reference|ggml|cuda] [--model-id NAME] [--batch-invariant on|off]
//              [--prefix-cache-mb N (default 256; 0 disables)] [--no-prefix-cache]
//              [--kv-bits N [--kv-group-size G] [--quantized-kv-start T]] (quantized KV cache)
//              [--shutdown-timeout S (default 30)] [--allow-special-in-content]
//              [--max-connections N (default 512)] [--cors-origin ORIGIN[,ORIGIN...] ('*': any)]
// OpenAI- and Anthropic-compatible HTTP server. Loopback by default. Prints load progress, then
// "ready: http://HOST:PORT" once the model is loaded. SIGINT/SIGTERM drain running requests (for at
// most --shutdown-timeout seconds, then cancel them) and exit.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "cli/common.h"
#include "core/thread_pool.h"
#include "runtime/bundle.h"
#include "server/server.h"

namespace g4::cli {
namespace {

std::atomic<int> g_signal{0};
void on_signal(int s) { g_signal.store(s); }

void progress(const std::string& m) { std::fprintf(stderr, "[gemma4 serve] %s\n", m.c_str()); }

int cmd_serve(const std::vector<std::string>& argv) {
  Args a = parse_args(argv, {"--no-prefix-cache", "--allow-special-in-content"});
  static constexpr const char* kOwn[] = {"--allow-special-in-content", "--api-key", "--chat-template", "--context",
      "--host", "--max-queue", "--max-tokens", "--model-id", "--no-prefix-cache", "--parallel", "--port",
      "--prefix-cache-mb", "--shutdown-timeout", "--max-connections", "--cors-origin"};
  if (Status s = reject_unknown_flags(a, {kLoadFlags, kModelOptionFlags, kOwn}); !s)
    return fail("serve", s.message());
  server::ServerOptions o;
  o.host = a.get("--host", "127.0.0.1");
  o.api_key = a.get("--api-key");
  o.model_id = a.get("--model-id");
  o.allow_special_in_content = a.has("--allow-special-in-content");
  for (std::string rest = a.get("--cors-origin"); !rest.empty();) {  // comma-separated origins
    const size_t c = rest.find(',');
    if (c != 0) o.cors_origins.push_back(rest.substr(0, c));
    rest = c == std::string::npos ? std::string() : rest.substr(c + 1);
  }
  for (auto [flag, dst, def, lo, hi] : {std::tuple{"--port", &o.port, 8080, 0, 65535},
                                        std::tuple{"--parallel", &o.parallel, 4, 1, 256},
                                        std::tuple{"--max-queue", &o.max_queue, 32, 0, 100000},
                                        std::tuple{"--context", &o.max_context, 8192, 16, 1 << 20},
                                        std::tuple{"--max-tokens", &o.default_max_tokens, 512, 1, 1 << 20},
                                        std::tuple{"--shutdown-timeout", &o.shutdown_timeout_s, 30, 0, 86400},
                                        std::tuple{"--max-connections", &o.max_connections, 512, 1, 65536}}) {
    auto v = int_flag(a, flag, def, lo, hi);
    if (!v) return fail("serve", v.message());
    *dst = v.value();
  }
  auto pc = int_flag(a, "--prefix-cache-mb", 256, 0, 1 << 20);
  if (!pc) return fail("serve", pc.message());
  o.prefix_cache_bytes = a.has("--no-prefix-cache") ? 0 : size_t(pc.value()) << 20;
  // Same tokens for a sequence whether it runs alone or in a batch (and with or without a
  // prefix-cache hit): row-exact kernels for every batch size, so --batch-invariant is on by
  // default here. Off trades that for faster single-stream decode.
  if (Status s = apply_process_flags(a, /*batch_invariant_default=*/true); !s) return fail("serve", s.message());
  auto b = load_bundle(a.get("--model"), a.get("--backend", "cpu"), progress);
  if (!b) return fail("serve", b.message());
  if (a.has("--chat-template")) {
    auto ct = ChatTemplate::from_file(a.get("--chat-template"));
    if (!ct) return fail("serve", ct.message());
    b.value().chat_template = std::move(ct).value();
  }
  if (Status ks = apply_model_flags(a, *b.value().model, EngineOptions{}.precision); !ks) return fail("serve", ks.message());
  if (!b.value().chat_template)
    progress("note: the model has no chat template (a base model): /v1/chat/completions and "
             "/v1/messages answer 400; /v1/completions works. Pass --chat-template FILE to chat.");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error value, not a signal
  server::Server srv(b.value(), o);
  Status st = srv.start();
  if (!st) return fail("serve", st.message());
  std::fprintf(stderr, "[gemma4 serve] ready: http://%s:%d (model %s, %d parallel, %d threads)\n",
               o.host.c_str(), srv.port(), b.value().name.c_str(), o.parallel, num_threads());
  std::printf("ready: http://%s:%d\n", o.host.c_str(), srv.port());
  std::fflush(stdout);
  while (g_signal.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  progress("signal received: finishing running requests");
  srv.stop(true);
  progress("stopped");
  return 0;
}

}  // namespace
G4_COMMAND("serve", "OpenAI/Anthropic-compatible HTTP server", cmd_serve);
}  // namespace g4::cli
