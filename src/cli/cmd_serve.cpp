// gemma4 serve [-m PATH] [--host 127.0.0.1] [--port 8080] [--parallel N] ... (`gemma4 serve --help`)
// OpenAI- and Anthropic-compatible HTTP server. Loopback by default. A Gemma 3 base model (the
// starter) chats through the built-in Gemma 3 turn template unless --chat-template says otherwise. Prints load progress, then
// "ready: http://HOST:PORT" once the model is loaded. SIGINT/SIGTERM drain running requests (for at
// most --shutdown-timeout seconds, then cancel them) and exit.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>
#include <thread>

#include <unistd.h>

#include "cli/common.h"
#include "cli/memory_plan.h"
#include "cli/options.h"
#include "core/thread_pool.h"
#include "quant/matmul.h"
#include "runtime/builtin_template.h"
#include "runtime/bundle.h"
#include "server/server.h"

namespace g4::cli {
namespace {

std::atomic<int> g_signal{0};
void on_signal(int s) { g_signal.store(s); }

void progress(const std::string& m) { std::fprintf(stderr, "[gemma4 serve] %s\n", m.c_str()); }

// This machine's name (a Kubernetes pod's name), the pod part of llm-d's KV-event topic.
std::string host_name() {
  char buf[256] = {};
  return gethostname(buf, sizeof buf - 1) == 0 && buf[0] ? std::string(buf) : std::string("localhost");
}

// A file or folder as the prompt cache's key sees it: its absolute path, and each file's size and
// modification time (a folder: its files', one level down), so a changed checkpoint is another key.
std::string file_identity(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::absolute(path, ec);
  std::vector<fs::path> files;
  if (fs::is_directory(p, ec)) {
    for (fs::directory_iterator it(p, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_regular_file()) files.push_back(it->path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(p);
  }
  std::string id = p.string();
  for (const fs::path& f : files) {
    const auto mtime = fs::last_write_time(f, ec).time_since_epoch().count();
    id += "|" + f.filename().string() + ":" + std::to_string(fs::file_size(f, ec)) + "@" + std::to_string(mtime);
  }
  return id;
}

// The prompt cache's key (runtime/prompt_store.h): the model and adapter files and every option
// the KV's values depend on.
std::string prompt_cache_key(const Args& a, const ModelBundle& b) {
  const Backend& be = b.model->backend();
  std::string key = "model=" + file_identity(b.path) + ";backend=" + be.name() +
                    ";activations=" + std::string(dtype_name(be.activation_dtype()));
  for (const char* opt : {"--kv-bits", "--kv-group-size", "--quantized-kv-start"})
    key += std::string(";") + opt + "=" + a.get(opt);
  key += std::string(";batch-invariant=") + (batch_invariant() ? "on" : "off");
  if (b.model->ranks() > 1) key += ";tensor-parallel=" + std::to_string(b.model->ranks());  // a state per rank
  if (a.has("--adapter-path")) key += ";adapter=" + file_identity(a.get("--adapter-path"));
  return key;
}

int cmd_serve(const std::vector<std::string>& argv) {
  VerbCli cli("serve", "OpenAI- and Anthropic-compatible HTTP server (loopback by default).");
  add_load_options(cli);
  add_model_options(cli);
  cli.value("--host", "address to listen on", "127.0.0.1")->type_name("ADDR");
  cli.value("--port", "port to listen on; 0: any free one", "8080")->type_name("N")->check(CLI::Range(0, 65535));
  cli.value("--parallel", "sequences decoded together (continuous batching)", "4")->type_name("N")
      ->check(CLI::Range(1, 256));
  cli.value("--max-queue", "requests waiting beyond --parallel before 429 (server busy)", "32")->type_name("N")
      ->check(CLI::Range(0, 100000));
  add_context_option(cli, "8192", "context length per sequence in tokens, at most the model's");
  cli.value("-n,--max-tokens", "answer length when a request gives none", "512")->type_name("N")
      ->check(CLI::Range(1, 1 << 20));
  cli.value("--api-key", "require `Authorization: Bearer KEY` (or x-api-key)")->type_name("KEY");
  cli.value("--model-id", "the model name /v1/models reports (default: the model's file or directory name)")
      ->type_name("NAME");
  add_chat_template_option(cli);
  cli.value("--prefix-cache-mb", "memory for the prompt-prefix cache; 0 disables it", "256")->type_name("MiB")
      ->check(CLI::Range(0, 1 << 20));
  cli.flag("--no-prefix-cache", "disable the prompt-prefix cache");
  cli.value("--prompt-cache", "keep the prefix cache's entries in DIR too, and read them back at start (an "
            "entry is used only by the same model file and KV options)")->type_name("DIR");
  cli.value("--prompt-cache-disk-mb", "disk for --prompt-cache; the oldest entries are removed past it", "8192")
      ->type_name("MiB")->check(CLI::Range(1, 1 << 30));
  cli.value("--step-tokens", "rows one engine step feeds at most: every decoding stream's token first, then "
            "prompt chunks, oldest request first, so streams keep their pace beside long prompts; 0: no bound; "
            "auto: 2048 on cuda, 256 on the host backends and with --batch-invariant on (whose rows cost far more)", "auto")
      ->type_name("N|auto")->check(CLI::IsMember({"auto"}) | CLI::Range(0, 1 << 20));
  cli.value("--prefill-chunk", "prompt rows one sequence feeds per step (within --step-tokens); auto: 2048 on "
            "cuda (its batched kernels fill their tiles and the experts' blocks), 256 on the host backends and "
            "with --batch-invariant on", "auto")
      ->type_name("N|auto")->check(CLI::IsMember({"auto"}) | CLI::Range(1, 1 << 20));
  cli.value("--kv-pool-mb", "the sequences' KV in one paged pool of this many MiB: a request is admitted when "
            "the pool's free blocks hold its prompt + max_tokens, so --parallel is not bounded by --parallel x "
            "--context of memory; 0: a KV buffer per sequence; auto: paged on cuda (what --parallel x --context "
            "needs, or half the device memory left past the weights when that does not fit), per-sequence on "
            "the host backends and with --kv-bits", "auto")
      ->type_name("MiB|auto")->check(CLI::IsMember({"auto"}) | CLI::Range(0, 1 << 24));
  cli.value("--decode-buckets", "cuda: decode steps of more than 8 streams padded to row buckets (multiples of 8 up "
            "to 64, of 32 up to 256), so a step replays a recorded CUDA graph when the number of streams changes; "
            "off: a graph per row count", "on")
      ->type_name("on|off")->check(one_of({"on", "off"}));
  add_decode_ahead_option(cli);
  cli.value("--log-format", "the request log on stderr, one line per request: text, json, or none", "text")
      ->type_name("FORMAT")->check(one_of({"text", "json", "none"}));
  cli.flag("-v,--verbose", "add each request's prefill / decode speed and the engine's load to its log line");
  cli.value("--shutdown-timeout", "SIGTERM/SIGINT: seconds running requests get before they are cancelled", "30")
      ->type_name("S")->check(CLI::Range(0, 86400));
  cli.value("--max-connections", "open connections; one more is answered 503", "512")->type_name("N")
      ->check(CLI::Range(1, 65536));
  cli.value("--cors-origin", "browser origins allowed to call the API, comma-separated ('*': any)")
      ->type_name("ORIGIN[,...]");
  cli.value("--adapter", "mount the mlx-lm LoRA adapter in DIR as NAME (repeatable): a request whose model is "
            "'<model id>:NAME' or 'NAME' runs with it, the others without; requests with different adapters "
            "batch together. POST /v1/load_lora_adapter and /v1/unload_lora_adapter change the set at run time")
      ->type_name("NAME=DIR");
  cli.value("--kv-events-endpoint", "publish the prefix cache's blocks as KV events (vLLM's ZeroMQ format, read by "
            "llm-d's KV-cache indexer and Dynamo's KV router) on this endpoint: bound when it has a wildcard "
            "(tcp://*:5557) or is ipc://, else connected to; needs libzmq")->type_name("ADDR");
  cli.value("--kv-events-replay", "a ROUTER endpoint where a subscriber that missed batches asks for them again "
            "(with --kv-events-endpoint)")->type_name("ADDR");
  cli.value("--kv-events-topic", "the events' topic (default: kv@<host name>@<model id>, as llm-d reads it)")
      ->type_name("TOPIC");
  cli.value("--kv-events-block-size", "tokens per reported block (the router's block size)", "16")->type_name("N")
      ->check(CLI::Range(1, 65536));
  cli.flag("--allow-special-in-content", "parse special-token text in message contents too (lets a client "
           "write control tokens and forge turns)");
  Args a;
  if (int rc = cli.parse(argv, a); rc >= 0) return rc;
  server::ServerOptions o;
  // The values were range-checked by the parser; absent ones are the declared defaults.
  o.host = a.get("--host");
  o.api_key = a.get("--api-key");
  o.model_id = a.get("--model-id");
  o.port = std::stoi(a.get("--port"));
  o.parallel = std::stoi(a.get("--parallel"));
  o.max_queue = std::stoi(a.get("--max-queue"));
  o.max_context = std::stoi(a.get("--context"));
  o.default_max_tokens = std::stoi(a.get("--max-tokens"));
  const std::string log_format = a.get("--log-format");
  o.log.format = log_format == "json" ? server::LogFormat::Json
               : log_format == "none" ? server::LogFormat::None : server::LogFormat::Text;
  o.log.verbose = a.has("--verbose");
  o.prefix_cache_bytes = a.has("--no-prefix-cache") ? 0 : size_t(std::stoi(a.get("--prefix-cache-mb"))) << 20;
  o.prompt_cache_dir = a.get("--prompt-cache");
  o.prompt_cache_disk_bytes = size_t(std::stoll(a.get("--prompt-cache-disk-mb"))) << 20;
  if (!o.prompt_cache_dir.empty() && o.prefix_cache_bytes == 0)
    return fail("serve", "--prompt-cache needs the prefix cache (drop --no-prefix-cache / --prefix-cache-mb 0)");
  o.kv_events.endpoint = a.get("--kv-events-endpoint");
  o.kv_events.replay_endpoint = a.get("--kv-events-replay");
  o.kv_events.block_size = std::stoi(a.get("--kv-events-block-size"));
  if (o.kv_events.endpoint.empty() && (a.has("--kv-events-replay") || a.has("--kv-events-topic")))
    return fail("serve", "--kv-events-replay and --kv-events-topic need --kv-events-endpoint");
  if (!o.kv_events.endpoint.empty() && o.prefix_cache_bytes == 0)
    return fail("serve", "--kv-events-endpoint reports the prefix cache's blocks: drop --no-prefix-cache / "
                "--prefix-cache-mb 0");
  o.shutdown_timeout_s = std::stoi(a.get("--shutdown-timeout"));
  o.max_connections = std::stoi(a.get("--max-connections"));
  o.allow_special_in_content = a.has("--allow-special-in-content");
  for (const auto& [flag, value] : a.flags) {
    if (flag != "--adapter") continue;
    const size_t eq = value.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == value.size())
      return fail("serve", "--adapter: expected NAME=DIR, got '" + value + "'");
    o.adapters.emplace_back(value.substr(0, eq), value.substr(eq + 1));
  }
  for (std::string rest = a.get("--cors-origin"); !rest.empty();) {  // comma-separated origins
    const size_t c = rest.find(',');
    if (c != 0) o.cors_origins.push_back(rest.substr(0, c));
    rest = c == std::string::npos ? std::string() : rest.substr(c + 1);
  }
  // Same tokens for a sequence whether it runs alone or in a batch (and with or without a
  // prefix-cache hit): row-exact kernels for every batch size, so --batch-invariant is on by
  // default on the host backends, where it costs little. On CUDA it runs batches on the one-row
  // kernels (BackendOptions::row_exact), well below the batched kernels' throughput: off there
  // unless asked for (or a drafter needs it).
  const bool invariant_default = a.get("--backend") != "cuda";
  if (Status s = apply_process_flags(a, invariant_default); !s) return fail("serve", s.message());
  // auto: EngineOptions' bound where rows are cheap (cuda's batched kernels), 256 where a row costs
  // ~15-100x more (the host backends; cuda's row-exact kernels, ~1.3k prompt tok/s at E4B, where
  // 2048 rows made a step of ~1.5 s and every stream beside long prompts decoded at ~1 tok/s).
  const std::string step_tokens = a.get("--step-tokens");
  constexpr int kSlowRowStepTokens = 256;
  o.step_tokens = step_tokens != "auto" ? std::stoi(step_tokens)
                  : cheap_rows(a)       ? EngineOptions{}.step_tokens
                                        : kSlowRowStepTokens;
  const std::string chunk = a.get("--prefill-chunk");
  o.prefill_chunk = chunk != "auto" ? std::stoi(chunk) : auto_prefill_chunk(a, EngineOptions{}.prefill_chunk);
  PlanInput plan;  // checked against the machine before anything loads
  plan.context = o.max_context;
  plan.parallel = o.parallel;
  plan.kv_bits = a.has("--kv-bits") ? std::stoi(a.get("--kv-bits")) : 0;
  plan.kv_group = std::stoi(a.get("--kv-group-size"));
  plan.kv_elem_bytes = a.get("--dtype") == "f32" ? 4 : 0;  // device backends store bf16 unless --dtype f32
  plan.chunk = o.prefill_chunk;
  plan.step_tokens = o.step_tokens;
  plan.extra_bytes = o.prefix_cache_bytes;
  const std::string pool_mb = a.get("--kv-pool-mb");
  if (plan.kv_bits > 0 && pool_mb != "auto" && pool_mb != "0")
    return fail("serve", "--kv-pool-mb holds unquantized KV: drop --kv-bits, or give --kv-pool-mb 0");
  const bool paged = plan.kv_bits == 0 && pool_mb != "0" && (pool_mb != "auto" || a.get("--backend") == "cuda");
  if (paged && pool_mb != "auto") plan.kv_pool_bytes = uint64_t(std::stoll(pool_mb)) << 20;
  auto bo = backend_options_from_args(a);
  if (!bo) return fail("serve", bo.message());
  plan.place(bo.value());
  auto fit = plan_fit(a.get("--model"), a.get("--backend"), plan, a.has("--context"));
  if (!fit) return fail("serve", fit.message());
  if (paged && pool_mb == "auto") size_auto_kv_pool(fit.value(), o.parallel, EngineOptions{}.kv_block);
  if (Status st = refuse_if_not_fitting(fit.value(), "--context"); !st) return fail("serve", st.message());
  o.max_context = int(fit.value().input.context);
  o.kv_pool_bytes = size_t(fit.value().input.kv_pool_bytes);
  // On a GPU the device memory the plan leaves free (past a 4 GiB margin) holds bf16 copies of the
  // weights cuBLAS reads, as engines that serve bf16 weights spend it: batched decode of many
  // streams and prefill read them instead of dequantizing every weight at every launch.
  // --cuda-bf16-cache GIB (0: none) overrides.
  if (!a.has("--cuda-bf16-cache") && fit.value().on_gpu && fit.value().free_known) {
    const uint64_t need = fit.value().need.total(), free = fit.value().free.bytes, margin = uint64_t(4) << 30;
    const uint64_t gib = free > need + margin ? std::min<uint64_t>((free - need - margin) >> 30, 1024) : 0;
    bo.value().bf16_weight_cache_gib = int(gib);
    if (gib > 0)
      progress("note: up to " + std::to_string(gib) + " GiB of free device memory keeps bf16 copies of the weights "
               "for batched decode and prefill (--cuda-bf16-cache 0: none)");
  }
  auto b = load_bundle(a.get("--model"), a.get("--backend"), progress, bo.value());
  if (!b) return fail("serve", b.message());
  if (a.has("--chat-template")) {
    auto ct = ChatTemplate::from_file(a.get("--chat-template"));
    if (!ct) return fail("serve", ct.message());
    b.value().chat_template = std::move(ct).value();
  } else {
    auto note = adopt_builtin_chat_template(b.value());
    if (!note) return fail("serve", note.message());
    if (!note.value().empty()) progress("note: " + note.value());
  }
  if (Status ks = apply_model_flags(a, *b.value().model, EngineOptions{}.precision); !ks) return fail("serve", ks.message());
  if (!b.value().chat_template)
    progress("note: the model has no chat template (a base model): /v1/chat/completions and "
             "/v1/messages answer 400; /v1/completions works. Pass --chat-template FILE to chat.");
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error value, not a signal
  o.decode_buckets = a.get("--decode-buckets") == "on" && b.value().model->backend().records_steps();
  o.decode_ahead = a.get("--decode-ahead") == "on";
  if (!o.prompt_cache_dir.empty()) o.prompt_cache_key = prompt_cache_key(a, b.value());
  if (!o.kv_events.endpoint.empty())
    o.kv_events.topic = a.has("--kv-events-topic") ? a.get("--kv-events-topic")
                                                   : "kv@" + host_name() + "@" + (o.model_id.empty() ? b.value().name
                                                                                                      : o.model_id);
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
