#include "server/request_log.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include <nlohmann/json.hpp>

namespace g4::server {
namespace {

using clk = std::chrono::steady_clock;

struct RequestNumbers {
  clk::time_point start = clk::now();
  clk::time_point first_token{}, last_token{};
  int prompt_tokens = -1, cached_tokens = 0, completion_tokens = 0;
};
thread_local RequestNumbers t_request;

double seconds(clk::time_point a, clk::time_point b) { return std::chrono::duration<double>(b - a).count(); }

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace

void begin_request() { t_request = RequestNumbers{}; }

void note_tokens(int prompt_tokens, int cached_tokens, int completion_tokens) {
  RequestNumbers& r = t_request;
  const auto now = clk::now();
  if (completion_tokens > 0 && r.completion_tokens == 0) r.first_token = now;
  if (completion_tokens > r.completion_tokens) r.last_token = now;
  r.prompt_tokens = prompt_tokens;
  r.cached_tokens = cached_tokens;
  r.completion_tokens = completion_tokens;
}

std::string request_log_line(const RequestLogOptions& o, const std::string& method, const std::string& path,
                             int status, const Engine* engine) {
  const RequestNumbers& r = t_request;
  const auto now = clk::now();
  const bool generated = r.prompt_tokens >= 0;
  const bool has_first = r.completion_tokens > 0;
  const double total = seconds(r.start, now);
  const double ttft = has_first ? seconds(r.start, r.first_token) : -1;
  const double prefill_tps = has_first && ttft > 0 ? (r.prompt_tokens - r.cached_tokens) / ttft : 0;
  const double decode_s = has_first ? seconds(r.first_token, r.last_token) : 0;
  const double decode_tps = r.completion_tokens > 1 && decode_s > 0 ? (r.completion_tokens - 1) / decode_s : 0;
  EngineStats st;
  if (o.verbose && engine) st = engine->stats();
  if (o.format == LogFormat::Json) {
    nlohmann::ordered_json j = {{"time", utc_now()}, {"method", method}, {"path", path}, {"status", status}};
    if (generated) {
      j["prompt_tokens"] = r.prompt_tokens;
      j["cached_tokens"] = r.cached_tokens;
      j["completion_tokens"] = r.completion_tokens;
      j["ttft_s"] = has_first ? nlohmann::ordered_json(ttft) : nlohmann::ordered_json();
    }
    j["total_s"] = total;
    if (o.verbose && generated) {
      j["prefill_tok_s"] = prefill_tps;
      j["decode_tok_s"] = decode_tps;
      if (engine) j["engine"] = {{"active", st.active}, {"queued", st.queued}, {"steps", st.steps},
                                 {"forward_s", st.forward_seconds}};
    }
    return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  }
  char buf[512];
  int n = std::snprintf(buf, sizeof buf, "[gemma4 serve] %s %s %d", method.c_str(), path.c_str(), status);
  if (generated && n > 0 && size_t(n) < sizeof buf)
    n += std::snprintf(buf + n, sizeof buf - size_t(n), " prompt=%d (cached %d) completion=%d ttft=%s",
                       r.prompt_tokens, r.cached_tokens, r.completion_tokens,
                       has_first ? (std::to_string(int(ttft * 1000)) + "ms").c_str() : "-");
  if (n > 0 && size_t(n) < sizeof buf) n += std::snprintf(buf + n, sizeof buf - size_t(n), " total=%dms", int(total * 1000));
  if (o.verbose && generated && n > 0 && size_t(n) < sizeof buf) {
    n += std::snprintf(buf + n, sizeof buf - size_t(n), " | prefill %.1f tok/s, decode %.1f tok/s", prefill_tps,
                       decode_tps);
    if (engine && n > 0 && size_t(n) < sizeof buf)
      std::snprintf(buf + n, sizeof buf - size_t(n), " | engine: %d active, %d queued, %llu steps, %.2f s forward",
                    int(st.active), int(st.queued), (unsigned long long)st.steps, st.forward_seconds);
  }
  return buf;
}

void log_request(const RequestLogOptions& o, const std::string& method, const std::string& path, int status,
                 const Engine* engine) {
  if (o.format == LogFormat::None) return;
  const std::string line = request_log_line(o, method, path, status, engine);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
}

}  // namespace g4::server
